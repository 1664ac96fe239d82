"""The speculative decoding loop: prefill, then propose -> one tree forward -> verify -> keep the
accepted path in the cache, until EOS, the token budget or the repetition guard.

Knows nothing about transformers: the target is anything with the `Target` methods (see
`target.HFTarget`). Several requests advance together, each with its own tree and length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice, repeat
from time import monotonic, perf_counter
from typing import Any, Protocol

import torch

from .logits_rules import rules_on_roots, rules_on_trees
from .proposer import DraftProposer, NoDraftProposer, Proposer, ProposerConfig, TextDraftProposer
from .repetition import RepetitionAllowance, RepetitionLoop, loop_at_end, structure_allowance
from .sequence import BatchRows, DecodeConfig, DecodeRequest, DecodeSequence
from .sizing import LoadSizer
from .stats import DecodeStats, StepSeconds
from .timing import wait_for
from .tree import TokenTree, TreeBatch, batch_trees, step_shape
from .verify import StepOutcomes, first_tokens, relax_path, row_logits, verify_greedy, verify_trees


@dataclass
class DecodeResult:
    tokens: list[int]
    stats: DecodeStats
    stop_reason: str  # "eos", "budget", "repetition" or "deadline"
    text: str = ""  # the model's reading: the tokens, less the loop where the guard stopped one
    loop: RepetitionLoop | None = None  # where stop_reason is "repetition"


def decode_result(target: Target, tokens: list[int], stats: DecodeStats, stop_reason: str) -> DecodeResult:
    """The result of an output that ended for `stop_reason`; its text ends where a loop began."""
    loop = loop_at_end(tokens) if stop_reason == "repetition" else None
    return DecodeResult(tokens, stats, stop_reason, target.decode(tokens[: loop.reading_end] if loop else tokens), loop)


class TargetState(Protocol):
    """What the loop reads of a target's batch state (the rest is the target's own)."""

    rows: list[int]  # the caller's index of each row still in the batch


class Target(Protocol):
    stop_token_ids: list[int]

    def inputs(self, images: Sequence[Any], prompts: Sequence[str]) -> dict: ...

    def prefill(self, inputs: dict) -> tuple[TargetState, torch.Tensor]: ...

    def prefill_each(self, inputs: Sequence[dict]) -> tuple[TargetState, torch.Tensor]: ...

    # Only where logits rules read the prompt (LogitsRules.reads_prompt): each row's prompt ids.
    def prompt_tokens(self, inputs: dict) -> list[list[int]]: ...

    def forward_tree(
        self, state: TargetState, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor, valid: torch.Tensor | None = None,
    ) -> torch.Tensor: ...  # (N, V): the logits of the `valid` nodes (every node if None), row by row

    def commit(self, state: TargetState, width: int, kept_nodes: Sequence[Sequence[int]]) -> None: ...

    # The rows kept may take another order (a target that moves rows into the places freed):
    # `state.rows` gives it, and the loop reads it afresh after every call.
    def keep_rows(self, state: TargetState, keep: Sequence[int]) -> None: ...

    def join(self, states: Sequence[TargetState]) -> TargetState: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str: ...


def _prefill(
    target: Target, newcomers: dict[int, DecodeSequence], config: DecodeConfig, stop_ids: set[int], separately: bool
) -> TargetState:
    """Prefill the newcomers (by request index) into a state of their own rows, each emitting its first token."""
    start = perf_counter()
    sequences = list(newcomers.values())
    if separately:
        inputs = [target.inputs([s.request.image], [s.request.prompt]) for s in sequences]
        state, logits = target.prefill_each(inputs)
    else:
        inputs = [target.inputs([s.request.image for s in sequences], [s.request.prompt for s in sequences])]
        state, logits = target.prefill(inputs[0])
    state.rows = list(newcomers)  # the batch keys
    rules = [s.rules(config) for s in sequences]
    if any(row_rules.active for row_rules in rules):
        if any(row_rules.reads_prompt for row_rules in rules):
            prompts = [prompt for part in inputs for prompt in target.prompt_tokens(part)]
            for sequence, prompt in zip(sequences, prompts):
                sequence.prompt = prompt
        logits = rules_on_roots(logits, [(s.prompt, s.tokens) for s in sequences], rules)
    first = first_tokens(logits, [s.key for s in sequences], [s.sampling(config) for s in sequences])
    elapsed = perf_counter() - start
    for sequence, token in zip(sequences, first):
        sequence.emit([token], stop_ids, config)
        sequence.stats.forwards, sequence.stats.new_tokens, sequence.stats.prefill_s = 1, 1, elapsed
    return state


def _propose(rows: BatchRows) -> tuple[list[TokenTree], list[TokenTree]]:
    """Each row's tree as proposed, and as cut to the width its sizer prices best for the rows it
    sizes (whole without a sizer)."""
    proposed = [proposer.propose(s.tokens) for proposer, s in zip(rows.proposers, rows.sequences)]
    if not rows.sized:
        return proposed, proposed
    trees = list(proposed)
    for sizer, sized in rows.sized:
        kinds = [rows.proposers[r].kind for r in sized]
        width = sizer.width(kinds, [trees[r] for r in sized], [len(rows.sequences[r].tokens) for r in sized])
        for row in sized:
            trees[row] = trees[row].first(width)
    return proposed, trees


def _verify(rows: BatchRows, trees: TreeBatch, logits: torch.Tensor) -> StepOutcomes:
    """Each row's exact outcome, and where the row's request has the near-lossless rule, its walk
    under the rule from there."""
    if rows.greedy:
        outcomes = verify_greedy(trees, logits)
    else:
        outcomes = verify_trees(trees, logits, [s.key for s in rows.sequences], [len(s.tokens) for s in rows.sequences], rows.samplings)
    if rows.exact:
        return outcomes
    tree_tokens = trees.tokens.tolist()
    walks = [
        outcome if sequence.request.near_lossless is None else relax_path(
            outcome, tokens, parents, node_logits, sequence.tokens, sequence.request.near_lossless,
        )
        for sequence, outcome, tokens, parents, node_logits in zip(
            rows.sequences, outcomes, tree_tokens, trees.parents.tolist(), row_logits(trees, logits)
        )
    ]
    return StepOutcomes.of(walks, tree_tokens)


def _step(target: Target, state: TargetState, rows: BatchRows, config: DecodeConfig, stop_ids: set[int], seconds: StepSeconds) -> bool:
    """One step of every row; whether any row's output ended."""
    start = perf_counter()
    proposed, row_trees = _propose(rows)
    width = step_shape(len(row_trees), [len(tree) for tree in row_trees])[1] if config.bucket_widths else None
    trees = batch_trees(row_trees, width=width)
    proposed_at = perf_counter()
    logits = wait_for(target.forward_tree(state, trees.tokens, trees.depths, trees.ancestors, trees.valid))
    forwarded_at = perf_counter()
    if rows.rules is not None:  # every node's logits with its own path's tokens, before any pick
        logits = rules_on_trees(row_trees, logits, [(s.prompt, s.tokens) for s in rows.sequences], rows.rules)
    outcomes = _verify(rows, trees, logits)
    target.commit(state, trees.width, outcomes.paths)
    ended = _take_outcomes(rows, proposed, row_trees, outcomes, trees.width, config, stop_ids)
    seconds.add(proposed_at - start, perf_counter() - proposed_at, forwarded_at - proposed_at)
    return ended


def _take_outcomes(
    rows: BatchRows, proposed: list[TokenTree], row_trees: list[TokenTree], outcomes: StepOutcomes, width: int,
    config: DecodeConfig, stop_ids: set[int],
) -> bool:
    """Each row's outcome into its sizer, proposer, output and steps; whether any row's output ended."""
    count, ended = len(row_trees), False
    relaxed = outcomes.relaxed or repeat(0)
    for sequence, proposer, whole, tree, path, tokens, row_relaxed in zip(
        rows.sequences, rows.proposers, proposed, row_trees, outcomes.paths, outcomes.tokens, relaxed
    ):
        if sequence.sizer is not None:
            sequence.sizer.observe(proposer.kind, tree, path, whole, tokens[-1])
        proposer.observe(tokens[:-1])
        emitted = sequence.emit(tokens, stop_ids, config)
        sequence.taken.append((count, width, len(tree) - 1, len(path) - 1, emitted, row_relaxed))
        ended = ended or sequence.stop_reason is not None
    return ended


class RunningBatch:
    """The rows decoding together: requests join between steps (prefilled apart from the running
    rows, then their cache joined) and leave as they end. `decode_stream` drives one from an
    iterable of requests; `engine.BatchingEngine` from callers on other threads."""

    def __init__(self, target: Target, config: DecodeConfig, separate_prefill: bool = False) -> None:
        self.target = target
        self.config = config
        self.separate_prefill = separate_prefill
        self.stop_ids = set(config.stop_token_ids if config.stop_token_ids is not None else target.stop_token_ids)
        self.sequences: dict[int, DecodeSequence] = {}  # by batch key
        self.seconds = StepSeconds()
        self.state: TargetState | None = None
        self.rows = BatchRows.of([], config)

    def __len__(self) -> int:
        return len(self.sequences)

    def admit(self, newcomers: dict[int, DecodeSequence]) -> list[tuple[int, DecodeResult]]:
        """Prefill the newcomers (by batch key) and join their rows; the rows that ended at their
        first token leave at once. A prefill that raises leaves the running rows as they were."""
        if any(s.request.near_lossless and not s.sampling(self.config).greedy for s in newcomers.values()):
            raise ValueError("the near-lossless rule is greedy decoding's: it cannot apply while sampling")
        for sequence in newcomers.values():
            sequence.request.proposer.start()
        joining = _prefill(self.target, newcomers, self.config, self.stop_ids, self.separate_prefill)
        for sequence in newcomers.values():
            sequence.joined = self.seconds.copy()
        self.sequences |= newcomers
        running = self.state is not None and self.state.rows
        self.state = self.target.join([self.state, joining]) if running else joining
        self.rows = BatchRows.of([self.sequences[row] for row in self.state.rows], self.config)
        return self._finish(ending=True)

    def step(self) -> list[tuple[int, DecodeResult]]:
        """One tree forward over every row; the rows that ended leave, as (batch key, result)."""
        return self._finish(_step(self.target, self.state, self.rows, self.config, self.stop_ids, self.seconds))

    def _finish(self, ending: bool) -> list[tuple[int, DecodeResult]]:
        """The rows that ended (`ending`: whether any may have), or whose deadline passed, leave the
        batch; an ended row that feeds another still decoding gives it its output as a draft (not a
        looping or unfinished one: the cut loop is no reading)."""
        now = monotonic()
        if now >= self.rows.deadline:
            for sequence in self.rows.sequences:
                deadline = sequence.request.deadline
                if sequence.stop_reason is None and deadline is not None and now >= deadline:
                    sequence.stop_reason, ending = "deadline", True
        if not ending:
            return []
        ended = [row for row, sequence in zip(self.state.rows, self.rows.sequences) if sequence.stop_reason is not None]
        if not ended:
            return []
        for row in ended:
            sequence = self.sequences[row]
            if sequence.feeds in self.sequences and sequence.stop_reason in ("eos", "budget"):
                output = [token for token in sequence.tokens if token not in self.stop_ids]
                self.sequences[sequence.feeds].request.proposer.add_drafts([output])
        self.target.keep_rows(self.state, [i for i, s in enumerate(self.rows.sequences) if s.stop_reason is None])
        finished = [self.sequences.pop(row) for row in ended]
        self.rows = BatchRows.of([self.sequences[row] for row in self.state.rows], self.config)
        for sequence in finished:
            sequence.stats.add_step_seconds(self.seconds, sequence.joined)
            sequence.stats.record_steps(sequence.taken)
        return [(row, decode_result(self.target, s.tokens, s.stats, s.stop_reason)) for row, s in zip(ended, finished)]


def decode_stream(
    target: Target, requests: Iterable[DecodeRequest], config: DecodeConfig = DecodeConfig(), *, max_rows: int,
    separate_prefill: bool = False, sizers: Callable[[int], LoadSizer | None] | None = None,
) -> Iterator[tuple[int, DecodeResult]]:
    """Continuous batching: decode `requests` with up to `max_rows` of them in the batch at once.
    Between steps, rows that ended leave and the next requests join (prefilled, then their cache
    joined to the running batch's); yields (request index, result) as each request ends. A row's
    tokens are its plain decoding's whatever rows share its forwards. `separate_prefill`: prefill
    each joining request alone (prompts of very different lengths then waste no prefill on
    padding). A request that `feeds` another takes the other's index in `requests`. `sizers`: each
    request's sizer, by its index; each step verifies only as many of each tree's nodes as its
    sizer prices best for the rows it sizes (sizing.py); whole trees without one. One sizer for
    every request learns acceptance from all of them; one each learns it afresh for that request
    alone, as `hsd convert` sizes each page it reads."""
    batch = RunningBatch(target, config, separate_prefill)
    waiting = enumerate(requests)
    while True:
        newcomers = {
            index: DecodeSequence(request, index, sizers(index) if sizers else None, request.feeds)
            for index, request in islice(waiting, max_rows - len(batch))
        }
        if newcomers:
            yield from batch.admit(newcomers)
        elif not batch:
            return
        if batch:
            yield from batch.step()


def decode_batch(
    target: Target, requests: Sequence[DecodeRequest], config: DecodeConfig = DecodeConfig(), *, separate_prefill: bool = False,
    sizer: LoadSizer | None = None,
) -> list[DecodeResult]:
    """Decode several requests together, all in one batch from the start and sized by one `sizer`
    (`decode_stream`'s special case); results in request order."""
    results = dict(
        decode_stream(
            target, requests, config, max_rows=max(1, len(requests)), separate_prefill=separate_prefill, sizers=lambda index: sizer,
        )
    )
    return [results[index] for index in range(len(requests))]


def make_proposer(
    target: Target, drafts: Sequence[str], match: str = "tokens", config: ProposerConfig = ProposerConfig(),
    *, growing: bool = False,
) -> Proposer:
    """`tokens`: exact token matching (drafts written the way the model writes);
    `chars`: normalised character matching (drafts whose markup differs). `growing`: a proposer
    that takes more drafts while decoding (a DraftSink), even if it starts with none."""
    if not drafts and not growing:
        return NoDraftProposer()
    if match == "tokens":
        return DraftProposer([target.encode(d) for d in drafts], config)
    if match == "chars":
        return TextDraftProposer(drafts, target.encode, target.decode, config)
    raise ValueError(f"match must be 'tokens' or 'chars', not {match!r}")


def draft_allowance(target: Target, drafts: Sequence[str]) -> RepetitionAllowance:
    """The repetition `drafts` hold, in the target's tokens: the guard's allowance for a request
    that verifies them, or for its plain decoding (both then stop on the same token)."""
    return structure_allowance(target.encode(draft) for draft in drafts)


def decode(
    target: Target,
    image: Any,
    prompt: str,
    drafts: Sequence[str] = (),
    config: DecodeConfig = DecodeConfig(),
    *,
    match: str = "tokens",
    proposer_config: ProposerConfig = ProposerConfig(),
    sizer: LoadSizer | None = None,
) -> DecodeResult:
    """Decode one image + prompt with a set of draft texts."""
    proposer = make_proposer(target, drafts, match, proposer_config)
    request = DecodeRequest(image, prompt, proposer, allowance=draft_allowance(target, drafts))
    return decode_batch(target, [request], config, sizer=sizer)[0]


def decode_many(
    target: Target,
    items: Sequence[tuple[Any, str, Sequence[str]]],
    config: DecodeConfig = DecodeConfig(),
    *,
    match: str = "tokens",
    proposer_config: ProposerConfig = ProposerConfig(),
    batch_size: int,
    sizer: LoadSizer | None = None,
) -> list[DecodeResult]:
    """Decode (image, prompt, draft texts) items, e.g. region crops, `batch_size` at a time (the
    caller's batch: the region stage's is the one its planner prices)."""
    results: list[DecodeResult] = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        requests = [
            DecodeRequest(im, p, make_proposer(target, drafts, match, proposer_config), allowance=draft_allowance(target, drafts))
            for im, p, drafts in chunk
        ]
        results.extend(decode_batch(target, requests, config, sizer=sizer))
    return results
