"""Token trees in parent-pointer form and the one pure function that lays them out.

Node 0 is the root: the last accepted token, not yet in the KV cache. A chain is the tree with
parents [-1, 0, 1, ...], so chains and tries share one code path. Parents always precede their
children (parents[i] < i), which lets the layout be built in one forward sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


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
        if self.parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(self.parents) if i):
            raise ValueError(f"parents must be -1 for the root and point backwards: {self.parents}")

    @classmethod
    def chain(cls, root: int, tokens: Sequence[int], evidence: int = 0) -> TokenTree:
        return cls((root, *tokens), tuple(range(-1, len(tokens))), evidence)

    def __len__(self) -> int:
        return len(self.tokens)

    def first(self, size: int) -> TokenTree:
        """The tree of its first `size` nodes (a tree again: parents precede their children)."""
        return self if size >= len(self) else TokenTree(self.tokens[:size], self.parents[:size], self.evidence)


@dataclass(frozen=True)
class TreeLayout:
    ancestors: np.ndarray  # (N, N) bool; ancestors[i, j] iff j is i or an ancestor of i
    depths: np.ndarray  # (N,) int64; root depth 0


def tree_layout(parents: Sequence[int]) -> TreeLayout:
    """Ancestor mask A[i] = A[parent[i]] | e_i, and depth = rowsum(A) - 1 (Medusa/EAGLE-2 style)."""
    size = len(parents)
    if all(parent == node - 1 for node, parent in enumerate(parents)):  # a chain: lower triangle
        return TreeLayout(np.tril(np.ones((size, size), dtype=bool)), np.arange(size, dtype=np.int64))
    ancestors = np.zeros((size, size), dtype=bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            ancestors[node] = ancestors[parent]
        ancestors[node, node] = True
    return TreeLayout(ancestors, ancestors.sum(1).astype(np.int64) - 1)


def positions(layout: TreeLayout, base: int) -> np.ndarray:
    """Position of every node: the root's position plus its depth."""
    return base + layout.depths


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


def batch_trees(trees: Sequence[TokenTree], pad_token: int = 0) -> TreeBatch:
    """Pad trees to the widest. A padding node sees only itself (no row of the mask is empty)."""
    width = max(len(t) for t in trees)
    count = len(trees)
    tokens = np.full((count, width), pad_token, dtype=np.int64)
    parents = np.full((count, width), -1, dtype=np.int64)
    depths = np.zeros((count, width), dtype=np.int64)
    ancestors = np.broadcast_to(np.eye(width, dtype=bool), (count, width, width)).copy()
    valid = np.zeros((count, width), dtype=bool)
    for row, tree in enumerate(trees):
        size = len(tree)
        layout = tree_layout(tree.parents)
        tokens[row, :size] = tree.tokens
        parents[row, :size] = tree.parents
        depths[row, :size] = layout.depths
        ancestors[row, :size, :size] = layout.ancestors
        valid[row, :size] = True
    return TreeBatch(*(torch.from_numpy(a) for a in (tokens, parents, depths, ancestors, valid)))
