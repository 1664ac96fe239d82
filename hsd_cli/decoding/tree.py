"""Token trees in parent-pointer form and the one pure function that lays them out.

Node 0 is the root: the last accepted token, not yet in the KV cache. A chain is the tree with
parents [-1, 0, 1, ...], so chains and tries share one code path. Parents always precede their
children (parents[i] < i), which lets the layout be built in one forward sweep.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


_new_object, _set_attribute = object.__new__, object.__setattr__
# A chain's parents, sliced from one tuple (a chain is built most steps of most drafted rows).
_CHAIN_PARENTS = tuple(range(-1, 255))


@dataclass(frozen=True)
class TokenTree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    # How much context the draft occurrence the tree was copied from matched (the proposer's own
    # measure; 0 for none): acceptance is learned per evidence (sizing.py).
    evidence: int = 0

    def __post_init__(self):
        if len(self.tokens) != len(self.parents) or not self.tokens:
            raise ValueError("a tree needs one parent per token and at least the root")
        # Nodes past the root checked only where there are some (every plain row's tree is a root
        # alone), in C (min, map): a proposer's tree is built every step of every row.
        rest = self.parents[1:]
        if self.parents[0] != -1 or rest and (min(rest) < 0 or not all(map(operator.lt, rest, range(1, len(self.parents))))):
            raise ValueError(f"parents must be -1 for the root and point backwards: {self.parents}")

    @classmethod
    def chain(cls, root: int, tokens: Sequence[int], evidence: int = 0) -> TokenTree:
        size = len(tokens) + 1
        return cls.built((root, *tokens), _CHAIN_PARENTS[:size] if size <= len(_CHAIN_PARENTS) else range(-1, size - 1), evidence)

    @classmethod
    def built(cls, tokens: Sequence[int], parents: Sequence[int], evidence: int = 0) -> TokenTree:
        """A tree whose builder lays parents before their children by construction (chains, tries,
        a tree's first nodes), without the check: a proposer builds one every step of every row."""
        tree = _new_object(cls)
        # Its fields set at once, as the instance's dict: one call where a field at a time takes three.
        _set_attribute(tree, "__dict__", {"tokens": tuple(tokens), "parents": tuple(parents), "evidence": evidence})
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    def first(self, size: int) -> TokenTree:
        """The tree of its first `size` nodes (a tree again: parents precede their children)."""
        return self if size >= len(self) else TokenTree.built(self.tokens[:size], self.parents[:size], self.evidence)


@dataclass(frozen=True)
class TreeLayout:
    ancestors: np.ndarray  # (N, N) bool; ancestors[i, j] iff j is i or an ancestor of i
    depths: np.ndarray  # (N,) int64; root depth 0


def tree_layout(parents: Sequence[int]) -> TreeLayout:
    """Ancestor mask A[i] = A[parent[i]] | e_i, and depth = rowsum(A) - 1 (Medusa/EAGLE-2 style)."""
    size = len(parents)
    if all(parent == node - 1 for node, parent in enumerate(parents)):  # a chain: lower triangle
        return TreeLayout(np.tril(np.ones((size, size), dtype=bool)), np.arange(size, dtype=np.int64))
    ancestors = bit_rows(ancestor_bits(parents), size)
    return TreeLayout(ancestors, ancestors.sum(1).astype(np.int64) - 1)


def ancestor_bits(parents: Sequence[int]) -> list[int]:
    """Per node, the node and its ancestors as the set bits of an int (bit j: node j): a few
    integer operations a node, where a mask row costs a numpy call."""
    bits: list[int] = []
    for node, parent in enumerate(parents):
        bits.append((bits[parent] if parent >= 0 else 0) | 1 << node)
    return bits


def bit_rows(bits: Sequence[int], width: int) -> np.ndarray:
    """(len(bits), width) bool: row i holds bit j of bits[i] in column j."""
    if width <= 64:  # one array of machine words, not a bytes object per row
        packed = np.array(bits, dtype="<u8").view(np.uint8).reshape(len(bits), 8)
    else:
        row_bytes = (width + 7) // 8
        packed = np.frombuffer(b"".join(value.to_bytes(row_bytes, "little") for value in bits), dtype=np.uint8)
        packed = packed.reshape(len(bits), row_bytes)
    return np.unpackbits(packed, axis=1, count=width, bitorder="little").view(bool)


def positions(layout: TreeLayout, base: int) -> np.ndarray:
    """Position of every node: the root's position plus its depth."""
    return base + layout.depths


# The shapes a step's forward is padded to where shapes are bucketed (`step_shape`): a device
# that replays a captured graph per shape (CUDA graphs) then needs len(ROW_BUCKETS) x
# len(WIDTH_BUCKETS) of them. Widths reach a trie's budget plus its root (41) and a chain's
# `chain_max` plus its root (33); rows the most a worker keeps in flight.
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
WIDTH_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64)


def bucket(size: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `size`; past the largest, the next multiple of the largest."""
    fitting = next((b for b in buckets if b >= size), None)
    return fitting if fitting is not None else -(-size // buckets[-1]) * buckets[-1]


def step_shape(rows: int, widths: Sequence[int]) -> tuple[int, int]:
    """The bucketed (rows, nodes per row) of a step whose rows' trees are `widths` nodes wide."""
    return bucket(rows, ROW_BUCKETS), bucket(max(widths), WIDTH_BUCKETS)


@dataclass(frozen=True)
class TreeBatch:
    """Several trees padded to one width for a single forward pass."""

    tokens: torch.Tensor  # (B, K) long
    parents: torch.Tensor  # (B, K) long, -1 for roots and padding
    depths: torch.Tensor  # (B, K) long
    ancestors: torch.Tensor  # (B, K, K) bool
    valid: torch.Tensor  # (B, K) bool, False for padding nodes

    @property
    def width(self) -> int:
        return self.tokens.shape[1]


def batch_trees(trees: Sequence[TokenTree], pad_token: int = 0, width: int | None = None) -> TreeBatch:
    """Pad trees to the widest, or to `width` nodes (no fewer than the widest: a step's bucketed
    width, `step_shape`). A padding node sees only itself (no row of the mask is empty).
    Tokens and parents are laid out for all rows at once, so are chains (a plain step's root is
    one), and the masks of the rows that branch, by pointer jumping over them all
    (`branching_layout`): a step's Python work per row is its tokens' copy."""
    if len(trees) == 1 and width in (None, len(trees[0])):  # a document decoded alone: none of the batch's bookkeeping
        return _one_tree_batch(trees[0])
    count = len(trees)
    sizes = np.fromiter([len(tree.tokens) for tree in trees], dtype=np.int64, count=count)
    width = max(int(sizes.max()), width or 0)
    valid = np.arange(width) < sizes[:, None]
    nodes = int(sizes.sum())
    tokens = np.full((count, width), pad_token, dtype=np.int64)
    tokens[valid] = np.fromiter(itertools.chain.from_iterable(tree.tokens for tree in trees), dtype=np.int64, count=nodes)
    parents = np.full((count, width), -1, dtype=np.int64)
    parents[valid] = np.fromiter(itertools.chain.from_iterable(tree.parents for tree in trees), dtype=np.int64, count=nodes)
    # Every row laid out as a chain (a lower triangle of its own nodes), then the branching rows
    # from their nodes' ancestor bits, converted all at once.
    node = np.arange(width)
    branching = np.flatnonzero(((parents != node - 1) & valid).any(1))
    if branching.size == count:  # no chain to lay out apart
        ancestors, depths = branching_layout(parents, valid)
    else:
        ancestors = (node[:, None] >= node) & valid[:, :, None] | (node[:, None] == node)
        depths = np.where(valid, node, 0)
        if branching.size:
            ancestors[branching], depths[branching] = branching_layout(parents[branching], valid[branching])
    return TreeBatch(*(torch.from_numpy(a) for a in (tokens, parents, depths, ancestors, valid)))


def flat_hops(parents: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(B * K,) each node's parent as an index over the batch's nodes, row-major, a root's and a
    padding node's itself: the first hop of pointer jumping up the nodes' paths."""
    count, width = parents.shape
    own = np.arange(width)
    return (np.where(valid & (parents >= 0), parents, own) + np.arange(0, count * width, width)[:, None]).ravel()


def branching_layout(parents: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ancestor masks (B, K, K) and depths (B, K) of padded rows of trees, by pointer jumping over
    all rows at once: each round a node takes in the nodes (set bits, a word per 64 nodes) and the
    distance of the node `hop` up its path, then hops twice as far, so after r rounds it holds its
    2^r nearest nodes up the path; log2(K) rounds of gathers over the batch's nodes, then one
    unpacking of the bits. Padding nodes see only themselves, at depth 0."""
    count, width = parents.shape
    node = np.arange(width)
    hop = flat_hops(parents, valid)
    depths = (valid & (parents >= 0)).ravel().astype(np.int64)  # the distance to `hop`
    words = -(-width // 64)
    own_bit = np.zeros((width, words), dtype="<u8")
    own_bit[node, node // 64] = np.left_shift(np.uint64(1), (node % 64).astype(np.uint64))
    bits = np.tile(own_bit, (count, 1))
    for _ in range((width - 1).bit_length()):
        bits |= bits[hop]
        depths += depths[hop]
        hop = hop[hop]
    ancestors = np.unpackbits(bits.view(np.uint8).reshape(count, width, 8 * words), axis=2, count=width, bitorder="little")
    return ancestors.view(bool), depths.reshape(count, width)


def _one_tree_batch(tree: TokenTree) -> TreeBatch:
    """`batch_trees([tree])`: the tree's own layout, nothing to pad."""
    layout = tree_layout(tree.parents)
    return TreeBatch(
        torch.tensor([tree.tokens]), torch.tensor([tree.parents]), torch.from_numpy(layout.depths[None]),
        torch.from_numpy(layout.ancestors[None]), torch.ones((1, len(tree)), dtype=torch.bool),
    )
