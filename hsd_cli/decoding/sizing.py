"""Verification sized by the load: how many of its draft nodes each row verifies this step.

A forward's price grows with rows x nodes once the device is compute-bound (a full batch on a GPU,
a 152 k-token output layer on a CPU); a draft node is worth the chance that the accepted path
reaches it. Each step, `LoadSizer.width` picks the tree width (nodes per row, root included) that
maximises the expected tokens per second of the step:

    (rows + sum over rows of E_row(width - 1)) / step_cost(rows, width, context)

where E_row(n) is the expected accepted length of the row's first n draft nodes. A width of 1 (no
draft node: a plain step) is always a candidate, so a sized step is never expected to be slower than
plain decoding's; one row on a device whose forward costs the same at any width gets the whole tree.
Trees are cut to their first nodes: proposers order nodes best first (parents before children), so
a tree's first n nodes are its most promising subtree.

Acceptance is learned from the run: per proposer kind (`Proposer.kind`) and match evidence
(`TokenTree.evidence`), the share of steps whose path, having reached depth d - 1 where the tree
went on, reached depth d (a plain step of a row that had a draft counts at depth 1: its token tells
whether the draft's first node would have been accepted).
Knows nothing of models: `step_cost` is any function (a cost profile's `step_s`: the forward and
the host work around it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .tree import TokenTree

StepCost = Callable[[int, int, int], float]  # (rows, nodes per row, context per row) -> seconds

MAX_DEPTH = 32  # depths past this share its estimate
CONTEXT_STEP = 64  # contexts are priced to this many tokens (prices are remembered, not recomputed)
POOL_WEIGHT = 4.0  # a kind's pooled estimate counts as this many steps of a new evidence's own


@dataclass
class _DepthCounts:
    tried: list[int] = field(default_factory=lambda: [0] * (MAX_DEPTH + 1))
    reached: list[int] = field(default_factory=lambda: [0] * (MAX_DEPTH + 1))


def depth_outcomes(parents: Sequence[int], path: Sequence[int]) -> list[tuple[int, bool]]:
    """(depth, reached) for every depth the accepted `path` (node indices from the root) was
    offered: depth d was offered where the path's node at depth d - 1 has a child in the tree."""
    with_children = set(parents)
    outcomes = []
    for depth in range(1, len(path) + 1):
        if path[depth - 1] not in with_children:
            break
        outcomes.append((depth, depth < len(path)))
    return outcomes


def deepest(parents: Sequence[int]) -> list[int]:
    """For n = 0 .. len - 1: the greatest depth among the tree's first n + 1 nodes."""
    depths: list[int] = []
    running, result = 0, []
    for parent in parents:
        depth = depths[parent] + 1 if parent >= 0 else 0
        depths.append(depth)
        running = depth if depth > running else running
        result.append(running)
    return result


class LoadSizer:
    """Chooses each step's tree width from `step_cost` and the acceptance learned so far.
    `prompt_tokens`: a row's prompt length, for the context a step's forward attends over.
    `batch_rows`: the rows each forward is priced at, as if all were like the rows sized (None:
    the rows sized). A batch that other callers' rows share prices a fixed load, so that what a
    row verifies, and its statistics, do not depend on which rows it happened to share forwards
    with. `prices`: a cache of `step_cost` by (rows, width, context) that sizers of the same
    step cost share (each read's sizer would otherwise price the same steps again)."""

    def __init__(self, step_cost: StepCost, prompt_tokens: int = 0, batch_rows: int | None = None,
                 prices: dict[tuple[int, int, int], float] | None = None):
        self.step_cost = step_cost
        self.prompt_tokens = prompt_tokens
        self.batch_rows = batch_rows
        self._prices = {} if prices is None else prices
        self._counts: dict[tuple[str, int], _DepthCounts] = {}
        self._pooled: dict[str, _DepthCounts] = {}

    def _reach(self, kind: str, evidence: int, depth: int) -> float:
        """P(reach depth | reached depth - 1 and offered it): the evidence's own counts, shrunk
        towards the kind's pooled counts (themselves towards 1/2)."""
        d = min(depth, MAX_DEPTH)
        pooled = self._pooled.get(kind)
        prior = (pooled.reached[d] + 1) / (pooled.tried[d] + 2) if pooled else 0.5
        own = self._counts.get((kind, evidence))
        if own is None:
            return prior
        return (own.reached[d] + POOL_WEIGHT * prior) / (own.tried[d] + POOL_WEIGHT)

    def _along(self, kind: str, evidence: int, depth: int) -> list[float]:
        """E[accepted draft tokens] of a path verified down to depth d, d = 0 .. `depth`."""
        along, reach = [0.0], 1.0
        for d in range(1, depth + 1):
            reach *= self._reach(kind, evidence, d)
            along.append(along[-1] + reach)
        return along

    def expected_accepted(self, kind: str, tree: TokenTree) -> list[float]:
        """E[accepted draft tokens] when verifying the tree's first n draft nodes, n = 0 .. len - 1."""
        reached = deepest(tree.parents)
        along = self._along(kind, tree.evidence, reached[-1])
        return [along[depth] for depth in reached]

    def _gains(self, kinds: Sequence[str], trees: Sequence[TokenTree], widest: int) -> np.ndarray:
        """(rows, widest): row r's `expected_accepted` at width w - 1 in column w - 1, its last
        value past its tree's end. Rows of one kind and evidence share one estimate along depths."""
        reached = [deepest(tree.parents) for tree in trees]
        depth_needed: dict[tuple[str, int], int] = {}
        for kind, tree, depths in zip(kinds, trees, reached):
            key = (kind, tree.evidence)
            depth_needed[key] = max(depth_needed.get(key, 0), depths[-1])
        along = {key: self._along(*key, depth) for key, depth in depth_needed.items()}
        flat: list[float] = []
        for kind, tree, depths in zip(kinds, trees, reached):
            estimate = along[kind, tree.evidence]
            flat += [estimate[depth] for depth in depths]
            flat += [estimate[depths[-1]]] * (widest - len(depths))
        return np.array(flat).reshape(len(trees), widest)

    def width(self, kinds: Sequence[str], trees: Sequence[TokenTree], emitted: Sequence[int]) -> int:
        """The tree width (root included) for this step's rows."""
        rows = len(trees)
        widest = max(len(tree) for tree in trees)
        if widest == 1:
            return 1
        context = CONTEXT_STEP * round((self.prompt_tokens + sum(emitted) / rows) / CONTEXT_STEP)
        priced_rows = self.batch_rows or rows
        # Per row sized: the same argmax as the whole batch's rate when every row is like these.
        # Gains summed over rows in row order (cumsum adds one after another, as a Python sum would).
        expected_tokens = (rows + np.cumsum(self._gains(kinds, trees, widest), axis=0)[-1]) / rows
        best_width, best_rate, best_price = 1, 0.0, 0.0
        for width, tokens in enumerate(expected_tokens.tolist(), start=1):
            price = self._price(priced_rows, width, context)
            rate = tokens / price
            # Nodes that cost nothing are verified, also those the estimate gives no value (a
            # trie's siblings: it counts the deepest node only).
            if rate > best_rate * (1 + 1e-9) or price <= best_price:
                best_width, best_rate, best_price = width, rate, price
        return best_width

    def _price(self, rows: int, width: int, context: int) -> float:
        key = (rows, width, context)
        if key not in self._prices:
            self._prices[key] = self.step_cost(rows, width, context)
        return self._prices[key]

    def observe(self, kind: str, tree: TokenTree, path: Sequence[int], proposed: TokenTree | None = None,
                next_token: int | None = None) -> None:
        """Learn from a verified tree (as cut) and its accepted path (node indices, root first). A
        step cut to its root still says whether the `proposed` tree's first node would have been
        accepted: the model chose `next_token` after the root. Without that, a sizer that stopped
        verifying a draft that failed would never see it hold again."""
        if len(tree) == 1 and proposed is not None and len(proposed) > 1:
            tree, path = proposed.first(2), [0, 1] if next_token == proposed.tokens[1] else [0]
        outcomes = depth_outcomes(tree.parents, path)
        for counts in (self._counts.setdefault((kind, tree.evidence), _DepthCounts()), self._pooled.setdefault(kind, _DepthCounts())):
            for depth, reached in outcomes:
                d = min(depth, MAX_DEPTH)
                counts.tried[d] += 1
                counts.reached[d] += reached


class ReadSizers:
    """The sizer each read gets from a worker whose engine keeps `rows` rows in flight.

    Not `shared` (per read): acceptance learned afresh per read, so that a read's statistics do not
    depend on the reads before it; above one row, every forward priced at `rows` (the load a busy
    worker runs at, whichever reads happen to be in flight). `shared`, above one row: every read
    gets one sizer, priced at the rows in flight and learning from every read, so that all rows
    have one width and none pays for another's nodes (a forward is as wide as its widest row); its
    context is priced from the first read's prompt. Callers size reads one at a time (the worker's
    pipeline lock, the bench's loop)."""

    def __init__(self, step_cost: StepCost, rows: int = 1, shared: bool = False) -> None:
        self.step_cost = step_cost
        self.rows = rows
        self.shared = shared and rows > 1
        self._one: LoadSizer | None = None
        self._prices: dict[tuple[int, int, int], float] = {}

    def sizer(self, prompt_tokens: int) -> LoadSizer:
        if not self.shared:
            return LoadSizer(self.step_cost, prompt_tokens, self.rows if self.rows > 1 else None, self._prices)
        if self._one is None:
            self._one = LoadSizer(self.step_cost, prompt_tokens)
        return self._one
