"""Verification of a token tree against the target's logits at every node.

Greedy and sampling share one rule: pick the target's token at every node (argmax, or a draw
from the processed distribution), then accept the longest root path whose every node carries
the token picked at its parent. The token picked at the last accepted node is the bonus.
Sampling draws for output position t of batch row r come from a generator keyed by (seed, r, t)
(Gumbel-max), so speculative sampling emits exactly the tokens plain sampling with the same seed
emits. Sampling draws only at the nodes the walk reaches, so a step costs a few vocabulary-sized
vectors, not one per tree node.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .tree import TreeBatch, flat_hops


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class NearLossless:
    """The paper's near-lossless rule (greedy only): a draft token d is also accepted where the
    target picks another token t, if p(d) >= tau * p(t) and `may_relax(output, d, t)` says d may
    stand for t after `output` (the tokens emitted so far and the path accepted above the node).
    The caller's policy says where (an OCR pipeline: never in math); the core asks it and knows
    nothing of what the tokens mean."""

    tau: float  # in (0, 1]
    may_relax: Callable[[Sequence[int], int, int], bool]


@dataclass(slots=True)  # not frozen: one is built per row per step, and a frozen one takes twice as long
class StepOutcome:
    path: list[int]  # accepted node indices from the root (node 0) down
    bonus: int  # the target's token at the last accepted node
    relaxed: int = 0  # of the path's nodes, those accepted by the near-lossless rule, not as the target's pick

    @property
    def accepted(self) -> int:
        return len(self.path) - 1


@dataclass(slots=True)
class StepOutcomes:
    """Every row's outcome of a step as lists by row: one object a step, whose greedy paths and
    tokens are gathered for all rows at once (`accept_paths`). Iterated: each row's StepOutcome."""

    paths: list[list[int]]  # accepted node indices from the root (node 0) down
    tokens: list[list[int]]  # what the row emits: its path's tokens below the root, then the bonus
    relaxed: list[int] | None = None  # per row, StepOutcome.relaxed; None: none relaxed

    @classmethod
    def of(cls, outcomes: Sequence[StepOutcome], tree_tokens: Sequence[Sequence[int]]) -> StepOutcomes:
        """From each row's outcome, walked row by row, and its tree's tokens."""
        return cls(
            [outcome.path for outcome in outcomes],
            [[*(tokens[node] for node in outcome.path[1:]), outcome.bonus] for outcome, tokens in zip(outcomes, tree_tokens)],
            [outcome.relaxed for outcome in outcomes],
        )

    def __len__(self) -> int:
        return len(self.paths)

    def __iter__(self) -> Iterator[StepOutcome]:
        relaxed = self.relaxed or itertools.repeat(0)
        return (StepOutcome(path, tokens[-1], count) for path, tokens, count in zip(self.paths, self.tokens, relaxed))


def processed_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Temperature, top-k, top-p over the last dimension; returns probabilities in fp32."""
    scores = logits.float() / sampling.temperature
    if sampling.top_k > 0:
        kth = torch.topk(scores, min(sampling.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(-1)
        # Drop a token when the tokens ranked above it already cover top_p (the first is kept).
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(-1)


def keyed_gumbel(seed: int, row: int, position: int, vocab_size: int) -> torch.Tensor:
    """The fp32 Gumbel noise for output position `position` of batch row `row`: the same wherever
    it is computed, and independent between rows."""
    key = ((seed * 1_000_003 + row) * 1_000_003 + position) % (1 << 63)
    generator = torch.Generator(device="cpu").manual_seed(key)
    uniform = torch.rand(vocab_size, generator=generator).clamp_(min=torch.finfo(torch.float32).tiny)
    return -torch.log(-torch.log(uniform))


def sample_tokens(probs: torch.Tensor, gumbel: torch.Tensor) -> torch.Tensor:
    """Gumbel-max draws: argmax(log p + g) over (..., V). Unlike an inverse-CDF draw, a logit
    perturbation of 1e-7 (tree vs incremental forward) flips the choice only when the two best
    perturbed scores tie to that precision, not whenever a CDF boundary is near."""
    return (probs.float().log() + gumbel).argmax(-1)


def keyed_sample(logits: torch.Tensor, sampling: SamplingConfig, row: int, position: int) -> int:
    """Plain sampling of output position `position` of batch row `row` from (V,) logits."""
    probs = processed_probs(logits.float().cpu(), sampling)
    return int(sample_tokens(probs, keyed_gumbel(sampling.seed, row, position, probs.shape[-1])))


def greedy_picks(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dimension, on the host. A CPU's through numpy: torch's CPU argmax
    is several times slower over a 152 k vocabulary (3.2 against 0.5 ms for 21 nodes, measured),
    and both pick the first of tied maxima, as `generate`'s torch.argmax does."""
    if logits.device.type == "cpu":
        return torch.from_numpy(logits.numpy().argmax(-1))
    return logits.argmax(-1).cpu()


def pick_token(logits: torch.Tensor, sampling: SamplingConfig, row: int, position: int) -> int:
    """The target's token from (V,) logits: the argmax, or the keyed draw when sampling."""
    return int(logits.argmax()) if sampling.greedy else keyed_sample(logits, sampling, row, position)


def first_tokens(logits: torch.Tensor, rows: Sequence[int], samplings: Sequence[SamplingConfig]) -> list[int]:
    """The first output token of every row from the prefill's (B, V) logits, each row picked by
    its own sampling (a retry reads at its attempt's temperature beside greedy rows)."""
    if all(sampling.greedy for sampling in samplings):
        return greedy_picks(logits).tolist()
    return [pick_token(logits[b], sampling, row, 0) for b, (row, sampling) in enumerate(zip(rows, samplings))]


def row_logits(trees: TreeBatch, logits: torch.Tensor) -> list[torch.Tensor]:
    """Each row's (nodes, V) logits from the (N, V) logits of the batch's valid nodes, row by row
    (a row's valid nodes are its first ones, so its logits are one slice)."""
    sizes = trees.valid.sum(1).tolist()
    return list(logits.split(sizes))


def verify_trees(
    trees: TreeBatch, logits: torch.Tensor, rows: Sequence[int], emitted: Sequence[int], samplings: Sequence[SamplingConfig]
) -> StepOutcomes:
    """Accepted path and bonus of every row from the (N, V) logits of the batch's valid nodes, row
    by row (padding nodes have none: the target computes no logits there).

    The root of batch row b is its output token emitted[b] - 1, so a node at depth d picks output
    position emitted[b] + d; `rows` are the rows' keys for sampling, `samplings` each row's rule.
    """
    if all(sampling.greedy for sampling in samplings):
        return verify_greedy(trees, logits)
    tree_tokens = trees.tokens.tolist()
    walks = [
        sample_and_match(tokens, parents, node_logits, sampling, row, emitted[b])
        for b, (tokens, parents, row, sampling, node_logits) in enumerate(
            zip(tree_tokens, trees.parents.tolist(), rows, samplings, row_logits(trees, logits))
        )
    ]
    return StepOutcomes.of(walks, tree_tokens)


def verify_greedy(trees: TreeBatch, logits: torch.Tensor) -> StepOutcomes:
    """`verify_trees` where every row decodes greedily: the argmax at every valid node, then the
    paths of all rows at once."""
    picks = np.zeros(tuple(trees.valid.shape), dtype=np.int64)
    picks[trees.valid.numpy()] = greedy_picks(logits).numpy()
    return accept_paths(trees, torch.from_numpy(picks))


def sample_and_match(
    tokens: Sequence[int], parents: Sequence[int], logits: torch.Tensor, sampling: SamplingConfig, row: int, emitted: int
) -> StepOutcome:
    """Walk from the root: pick the target's token at the node; descend to the child carrying it,
    else it is the bonus. Only the nodes walked are drawn (padding nodes have no parent)."""
    child = {(parent, token): node for node, (parent, token) in enumerate(zip(parents, tokens)) if parent >= 0}
    path = [0]
    while True:
        token = pick_token(logits[path[-1]], sampling, row, emitted + len(path) - 1)
        node = child.get((path[-1], token))
        if node is None:
            return StepOutcome(path, token)
        path.append(node)


def accept_paths(trees: TreeBatch, picked: torch.Tensor) -> StepOutcomes:
    """Vectorised walk: a node is accepted iff it and all its ancestors carry their parent's pick.

    Children of a node carry distinct tokens (tries and chains), so a row's accepted nodes are its
    path, in node order (parents precede children), and the tokens it emits are the picks at them
    (a path node's pick is its accepted child's token; the last one's is the bonus): one gather
    and one tolist for the batch, then a slice a row. In numpy over the batch's (CPU) tensors: a
    small torch call costs several numpy ones.
    """
    picks = picked.numpy().ravel()
    if trees.width == 1:  # a plain step: every row's root alone, its pick the bonus
        bonuses = picks.tolist()
        return StepOutcomes([[0] for _ in bonuses], [[bonus] for bonus in bonuses])
    count, width = trees.tokens.shape
    on_path = np.flatnonzero(path_nodes(trees, picks))
    ends = np.searchsorted(on_path, np.arange(width, (count + 1) * width, width)).tolist()
    nodes, tokens, starts = (on_path % width).tolist(), picks[on_path].tolist(), [0, *ends[:-1]]
    return StepOutcomes([nodes[start:end] for start, end in zip(starts, ends)], [tokens[start:end] for start, end in zip(starts, ends)])


def path_nodes(trees: TreeBatch, picks: np.ndarray) -> np.ndarray:
    """(B * K,) bool, row-major: the nodes whose every ancestor and themselves carry their
    parent's pick (`picks`, (B * K,)). By pointer jumping: each round a node takes in the verdict
    of the node `hop` up its path and then hops twice as far, so after r rounds it has looked at
    its 2^r nearest nodes up the path, the root included once 2^r passes its depth; log2(depth)
    gathers over the batch's nodes, not a (B, K, K) pass over the ancestor masks."""
    width = trees.width
    valid = trees.valid.numpy()
    hop = flat_hops(trees.parents.numpy(), valid)
    accepted = (trees.tokens.numpy().ravel() == picks[hop]) & valid.ravel()
    accepted[::width] = True  # a root is accepted already (and its own hop)
    for _ in range(int(trees.depths.numpy().max()).bit_length()):
        accepted &= accepted[hop]
        hop = hop[hop]
    return accepted


def relax_path(
    exact: StepOutcome, tokens: Sequence[int], parents: Sequence[int], logits: torch.Tensor, output: Sequence[int],
    rule: NearLossless,
) -> StepOutcome:
    """The greedy walk of one row under the near-lossless rule, from its exact walk (`exact`,
    which the rule walks alike up to where it stopped): where no child carries the target's pick,
    the closest child the rule accepts is taken, and the walk goes on from it. Its token enters
    the output and the cache alike, so the cache always holds the output. `logits`: the row's
    (nodes, V); `output`: the row's tokens emitted so far."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        if parent >= 0:
            children.setdefault(parent, []).append(node)
    path, pick, relaxed = list(exact.path), exact.bonus, exact.relaxed
    so_far = [*output, *(tokens[node] for node in path[1:])]
    while True:
        kids = children.get(path[-1], [])
        chosen = next((kid for kid in kids if tokens[kid] == pick), None)
        if chosen is None and kids:
            chosen = closest_allowed(kids, tokens, logits[path[-1]], pick, so_far, rule)
            relaxed += chosen is not None
        if chosen is None:
            return StepOutcome(path, pick, relaxed)
        path.append(chosen)
        so_far.append(tokens[chosen])
        pick = int(logits[chosen].argmax())


def closest_allowed(
    kids: Sequence[int], tokens: Sequence[int], logits: torch.Tensor, pick: int, output: Sequence[int], rule: NearLossless,
) -> int | None:
    """The most probable child within `rule.tau` of the pick that the rule lets stand for it
    after `output`; None where there is none. The policy is asked last: it may cost a decode."""
    probs = logits.float().softmax(-1)
    floor = rule.tau * float(probs[pick])
    close = sorted((kid for kid in kids if float(probs[tokens[kid]]) >= floor), key=lambda kid: -float(probs[tokens[kid]]))
    return next((kid for kid in close if rule.may_relax(output, tokens[kid], pick)), None)
