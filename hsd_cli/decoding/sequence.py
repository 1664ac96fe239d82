"""A request as it decodes in a running batch: what it asks for, its row's output so far and
why it ended, and the batch's rows as every step reads them (loop.py drives them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .logits_rules import LogitsRules
from .proposer import NoDraftProposer, Proposer
from .repetition import NO_ALLOWANCE, RepetitionAllowance, RepetitionGuard
from .sizing import LoadSizer
from .stats import DecodeStats, StepSeconds
from .verify import NearLossless, SamplingConfig


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
    # The steps it took part in, (rows, width, proposed, accepted, emitted, relaxed) each: counted
    # into `stats` as it leaves (DecodeStats.record_steps), one tuple a step, not seven counts.
    taken: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)

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


@dataclass(frozen=True)
class BatchRows:
    """A running batch's rows in the target's order and what every step asks of them all, worked
    out as rows join or leave rather than at every step."""

    sequences: list[DecodeSequence]
    proposers: list[Proposer]
    sized: list[tuple[LoadSizer, list[int]]]  # each sizer, with the positions of the rows it sizes
    rules: list[LogitsRules] | None  # each row's logits rules; None where no row's are active
    samplings: list[SamplingConfig]
    greedy: bool  # every row decodes greedily
    exact: bool  # no row has the near-lossless rule
    deadline: float  # the earliest row's deadline (time.monotonic); inf for none

    @classmethod
    def of(cls, sequences: list[DecodeSequence], config: DecodeConfig) -> BatchRows:
        rules = [s.rules(config) for s in sequences]
        samplings = [s.sampling(config) for s in sequences]
        sized: dict[int, tuple[LoadSizer, list[int]]] = {}
        for row, sequence in enumerate(sequences):
            if sequence.sizer is not None:
                sized.setdefault(id(sequence.sizer), (sequence.sizer, []))[1].append(row)
        return cls(
            sequences, [s.request.proposer for s in sequences], list(sized.values()),
            rules if any(row_rules.active for row_rules in rules) else None, samplings, all(s.greedy for s in samplings),
            all(s.request.near_lossless is None for s in sequences),
            min((s.request.deadline for s in sequences if s.request.deadline is not None), default=float("inf")),
        )
