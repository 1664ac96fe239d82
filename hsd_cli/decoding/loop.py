"""The speculative decoding loop: prefill, then propose -> one tree forward -> verify -> keep the
accepted path in the cache, until EOS, the token budget or the repetition guard.

Knows nothing about transformers: the target is anything with the `Target` methods (see
`target.HFTarget`). Several requests advance together, each with its own tree and length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from time import monotonic, perf_counter
from typing import Any, Protocol

import torch

from .logits_rules import LogitsRules, rules_on_roots, rules_on_trees
from .proposer import DraftProposer, NoDraftProposer, Proposer, ProposerConfig, TextDraftProposer
from .repetition import NO_ALLOWANCE, RepetitionAllowance, RepetitionGuard, RepetitionLoop, loop_at_end, structure_allowance
from .sizing import LoadSizer
from .stats import DecodeStats, StepSeconds
from .timing import wait_for
from .tree import TokenTree, TreeBatch, batch_trees, step_shape
from .verify import NearLossless, SamplingConfig, StepOutcome, first_tokens, relax_path, row_logits, verify_trees


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = 2048
    sampling: SamplingConfig = SamplingConfig()
    repetition_guard: bool = True  # stop where the output loops (repetition.py says what a loop is)
    stop_token_ids: tuple[int, ...] | None = None  # None: the target's own stop tokens
    rules: LogitsRules = LogitsRules()  # penalties and n-gram bans, applied at every tree node (logits_rules.py)
    # Pad each step's trees to its bucketed width (tree.step_shape), so that a device replaying
    # captured graphs meets a few shapes only; padding nodes get no logits, so outputs do not
    # change. Off: a CPU captures nothing, and pays for every padding node's attention.
    bucket_widths: bool = False


@dataclass
class DecodeRequest:
    image: Any  # a PIL image, or None for a text-only prompt
    prompt: str
    proposer: Proposer = field(default_factory=NoDraftProposer)
    # None: lossless (the output is plain decoding's). Else the near-lossless rule with the
    # caller's policy of where it may apply; greedy decoding only.
    near_lossless: NearLossless | None = None
    # The request (by index among the requests decoded together) whose proposer takes this one's
    # output as a draft when it ends (a region crop's output drafting its page); its proposer must
    # be a DraftSink.
    feeds: int | None = None
    # time.monotonic() past which the row leaves the batch unfinished (stop reason "deadline"),
    # checked between steps: a page past its --page-timeout gives its rows back to the others.
    deadline: float | None = None
    # The repetition the request's drafts hold, which the guard lets through (`draft_allowance`).
    allowance: RepetitionAllowance = NO_ALLOWANCE
    # None: the batch's rule (DecodeConfig.sampling). A makers' retry reads at its attempt's
    # temperature and seed beside rows that read at the batch's.
    sampling: SamplingConfig | None = None
    # None: the batch's logits rules (DecodeConfig.rules). A two-step model's block of one kind
    # decodes by its makers' penalties for that kind beside blocks of another.
    rules: LogitsRules | None = None


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


@dataclass
class DecodeSequence:
    """A request as it decodes in a running batch: its row's output so far and why it ended."""

    request: DecodeRequest
    key: int  # the request's index among those decoded together: it keys sampling
    sizer: LoadSizer | None = None  # cuts this row's trees, with the other rows of the same sizer
    feeds: int | None = None  # the batch key of the row this one drafts when it ends
    tokens: list[int] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)
    stop_reason: str | None = None
    guard: RepetitionGuard = field(init=False)
    prompt: Sequence[int] = ()  # the prompt's token ids, kept where logits rules read them
    joined: StepSeconds = field(default_factory=StepSeconds)  # the batch's step seconds when the row joined

    def __post_init__(self) -> None:
        self.guard = RepetitionGuard(self.request.allowance)

    def sampling(self, config: DecodeConfig) -> SamplingConfig:
        return self.request.sampling or config.sampling

    def rules(self, config: DecodeConfig) -> LogitsRules:
        return self.request.rules or config.rules

    def _emit_to_end(self, new_tokens: Sequence[int], stop_ids: set[int], budget: int) -> None:
        """Append tokens one by one up to and including the first that ends the output."""
        for token in new_tokens:
            if len(self.tokens) >= budget:
                self.stop_reason = "budget"
                break
            self.tokens.append(token)
            if token in stop_ids:
                self.stop_reason = "eos"
            elif len(self.tokens) >= budget:
                self.stop_reason = "budget"
            if self.stop_reason is not None:
                break

    def emit(self, new_tokens: Sequence[int], stop_ids: set[int], config: DecodeConfig) -> int:
        """Append tokens up to and including the first that ends the output (a stop token, the
        budget, a loop); return how many. Tokens are cut where plain decoding with the same guard
        would have stopped, also where a loop is found inside one accepted chunk."""
        checked = len(self.tokens)
        if len(new_tokens) < config.max_new_tokens - checked and stop_ids.isdisjoint(new_tokens):
            self.tokens += new_tokens  # most steps: none of them ends the output
        else:
            self._emit_to_end(new_tokens, stop_ids, config.max_new_tokens)
        loop_stop = self.guard.stop_after(self.tokens) if config.repetition_guard else None
        if loop_stop is not None:
            del self.tokens[loop_stop:]
            self.stop_reason = "repetition"
        return len(self.tokens) - checked


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


def _propose(active: list[DecodeSequence]) -> tuple[list[TokenTree], list[TokenTree]]:
    """Each row's tree as proposed, and as cut to the width its sizer prices best for the rows it
    sizes (whole without a sizer)."""
    proposed = [s.request.proposer.propose(s.tokens) for s in active]
    trees = list(proposed)
    sized: dict[int, list[int]] = {}
    for row, sequence in enumerate(active):
        if sequence.sizer is not None:
            sized.setdefault(id(sequence.sizer), []).append(row)
    for rows in sized.values():
        sizer = active[rows[0]].sizer
        kinds = [active[r].request.proposer.kind for r in rows]
        width = sizer.width(kinds, [trees[r] for r in rows], [len(active[r].tokens) for r in rows])
        for row in rows:
            trees[row] = trees[row].first(width)
    return proposed, trees


def _verify(active: list[DecodeSequence], trees: TreeBatch, logits: torch.Tensor, config: DecodeConfig) -> list[StepOutcome]:
    """Each row's exact outcome, and where the row's request has the near-lossless rule, its walk
    under the rule from there."""
    samplings = [s.request.sampling or config.sampling for s in active]  # `DecodeSequence.sampling`, without a call a row
    outcomes = verify_trees(trees, logits, [s.key for s in active], [len(s.tokens) for s in active], samplings)
    if all(s.request.near_lossless is None for s in active):
        return outcomes
    return [
        outcome if sequence.request.near_lossless is None else relax_path(
            outcome, trees.tokens[row].tolist(), trees.parents[row].tolist(), node_logits, sequence.tokens,
            sequence.request.near_lossless,
        )
        for row, (sequence, outcome, node_logits) in enumerate(zip(active, outcomes, row_logits(trees, logits)))
    ]


def _step(
    target: Target, state: TargetState, active: list[DecodeSequence], config: DecodeConfig, stop_ids: set[int], seconds: StepSeconds,
) -> None:
    start = perf_counter()
    proposed, row_trees = _propose(active)
    width = step_shape(len(row_trees), [len(tree) for tree in row_trees])[1] if config.bucket_widths else None
    trees = batch_trees(row_trees, width=width)
    proposed_at = perf_counter()
    logits = wait_for(target.forward_tree(state, trees.tokens, trees.depths, trees.ancestors, trees.valid))
    forwarded_at = perf_counter()
    rules = [s.request.rules or config.rules for s in active]  # `DecodeSequence.rules`, without a call a row
    if any(row_rules.active for row_rules in rules):  # every node's logits with its own path's tokens, before any pick
        logits = rules_on_trees(row_trees, logits, [(s.prompt, s.tokens) for s in active], rules)
    outcomes = _verify(active, trees, logits, config)
    target.commit(state, trees.width, [o.path for o in outcomes])
    _take_outcomes(active, proposed, row_trees, outcomes, trees.width, config, stop_ids)
    seconds.add(proposed_at - start, perf_counter() - proposed_at, forwarded_at - proposed_at)


def _take_outcomes(
    active: list[DecodeSequence], proposed: list[TokenTree], row_trees: list[TokenTree], outcomes: list[StepOutcome],
    width: int, config: DecodeConfig, stop_ids: set[int],
) -> None:
    """Each row's outcome into its sizer, proposer, output and counts. Its accepted tokens are read
    from its own tree (Python tuples), not from the batch's tensors."""
    rows = len(active)
    for sequence, whole, tree, outcome in zip(active, proposed, row_trees, outcomes):
        path, proposer = outcome.path, sequence.request.proposer
        if sequence.sizer is not None:
            sequence.sizer.observe(proposer.kind, tree, path, whole, outcome.bonus)
        if len(path) == 1:  # the root alone: every plain row's
            path_tokens = []
        else:  # a path ending at node k with k + 1 nodes is nodes 0..k (a chain's, most paths): one slice
            path_tokens = list(tree.tokens[1 : len(path)]) if path[-1] == len(path) - 1 else [tree.tokens[node] for node in path[1:]]
        proposer.observe(path_tokens)
        path_tokens.append(outcome.bonus)
        emitted = sequence.emit(path_tokens, stop_ids, config)
        sequence.stats.record_step(len(tree) - 1, len(path) - 1, emitted, rows, width, outcome.relaxed)


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
        return self._finish()

    def step(self) -> list[tuple[int, DecodeResult]]:
        """One tree forward over every row; the rows that ended leave, as (batch key, result)."""
        _step(self.target, self.state, [self.sequences[row] for row in self.state.rows], self.config, self.stop_ids, self.seconds)
        return self._finish()

    def _finish(self) -> list[tuple[int, DecodeResult]]:
        """The rows that ended, or whose deadline passed, leave the batch; an ended row that feeds
        another still decoding gives it its output as a draft (not a looping or unfinished one:
        the cut loop is no reading)."""
        now = monotonic()
        for sequence in self.sequences.values():
            deadline = sequence.request.deadline
            if sequence.stop_reason is None and deadline is not None and now >= deadline:
                sequence.stop_reason = "deadline"
        ended = [row for row in self.state.rows if self.sequences[row].stop_reason is not None]
        if not ended:
            return []
        for row in ended:
            sequence = self.sequences[row]
            if sequence.feeds in self.sequences and sequence.stop_reason in ("eos", "budget"):
                output = [token for token in sequence.tokens if token not in self.stop_ids]
                self.sequences[sequence.feeds].request.proposer.add_drafts([output])
        self.target.keep_rows(self.state, [i for i, row in enumerate(self.state.rows) if self.sequences[row].stop_reason is None])
        finished = [self.sequences.pop(row) for row in ended]
        for sequence in finished:
            sequence.stats.add_step_seconds(self.seconds, sequence.joined)
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
