"""Decoding statistics as plain data."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate


def tau(new_tokens: int, forwards: int) -> float:
    """The acceptance length: tokens per forward (the prefill's token counts, so plain decoding
    has tau 1.00, Spec-Bench's convention). The one definition: every total and bench uses it."""
    return new_tokens / forwards if forwards else 0.0


def speedup(plain_s: float, spent_s: float) -> float:
    """How many times faster than plain decoding of the same work: its seconds over ours."""
    return plain_s / spent_s if spent_s else 0.0


@dataclass
class DecodeStats:
    """Counts for one decoded sequence. The prefill counts as a forward that yields one token,
    so plain decoding has tau = 1.00 (Spec-Bench convention). In a batch the forward passes and
    the seconds are shared: every row reports the batch's time for the steps it took part in."""

    forwards: int = 0
    new_tokens: int = 0
    accepted_hist: dict[int, int] = field(default_factory=dict)  # accepted draft tokens per step -> steps
    proposed: int = 0  # draft tokens sent to verification (tree nodes minus roots)
    accepted: int = 0  # draft tokens accepted (bonus tokens not included)
    relaxed: int = 0  # of those, accepted by the near-lossless rule where the target picked another token
    prefill_s: float = 0.0
    propose_s: float = 0.0
    verify_s: float = 0.0  # tree forwards, verification and cache compaction
    forward_s: float = 0.0  # of verify_s, the tree forwards alone (the device's work finished)
    # Per tree forward this sequence took part in: (batch rows, nodes per row, tokens emitted
    # before it). Its shape, to project what it costs on a cost profile; not in `as_dict`.
    steps: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return tau(self.new_tokens, self.forwards)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted(self) -> float:
        steps = sum(self.accepted_hist.values())
        return self.accepted / steps if steps else 0.0

    @property
    def decode_s(self) -> float:
        return self.propose_s + self.verify_s

    @property
    def host_s(self) -> float:
        """The steps' work around their forwards: proposing, the tree batch, reading the accepted
        path back, the cache edits (what a cost profile prices per step beside the forward)."""
        return self.decode_s - self.forward_s

    def record_steps(self, steps: Sequence[tuple[int, int, int, int, int, int]]) -> None:
        """Tree forwards, each as (rows, width, proposed, accepted, emitted, relaxed): a forward over
        `rows` rows of `width` nodes; `emitted` is accepted + 1 unless EOS or the budget cut the
        step; `relaxed` of the accepted were the near-lossless rule's. Taken in at once as a row
        leaves: its steps are counted column by column, not seven counts a step."""
        if not steps:
            return
        rows, widths, proposed, accepted, emitted, relaxed = zip(*steps)
        self.steps.extend(zip(rows, widths, accumulate(emitted[:-1], initial=self.new_tokens)))
        self.forwards += len(steps)
        self.new_tokens += sum(emitted)
        self.proposed += sum(proposed)
        self.accepted += sum(accepted)
        self.relaxed += sum(relaxed)
        for count, times in Counter(accepted).items():  # the order of first occurrence, as step by step
            self.accepted_hist[count] = self.accepted_hist.get(count, 0) + times

    def add_step_seconds(self, now: StepSeconds, joined: StepSeconds) -> None:
        """The seconds of the batch's steps since the row joined (`joined`, then `now`)."""
        self.propose_s += now.propose_s - joined.propose_s
        self.verify_s += now.verify_s - joined.verify_s
        self.forward_s += now.forward_s - joined.forward_s

    def as_dict(self) -> dict:
        return {
            "forwards": self.forwards,
            "new_tokens": self.new_tokens,
            "tau": round(self.tau, 3),
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted": round(self.mean_accepted, 3),
            "accepted_hist": {str(k): v for k, v in sorted(self.accepted_hist.items())},
            "prefill_s": round(self.prefill_s, 4),
            "propose_s": round(self.propose_s, 4),
            "verify_s": round(self.verify_s, 4),
            "forward_s": round(self.forward_s, 4),
        }


@dataclass
class StepSeconds:
    """A running batch's step seconds summed since it began. Every row reports the batch's time
    for the steps it took part in: their growth between its joining and its leaving, taken once
    as it leaves (`DecodeStats.add_step_seconds`), not added to every row at every step."""

    propose_s: float = 0.0
    verify_s: float = 0.0  # forward_s included, as in DecodeStats
    forward_s: float = 0.0

    def add(self, propose_s: float, verify_s: float, forward_s: float) -> None:
        self.propose_s += propose_s
        self.verify_s += verify_s
        self.forward_s += forward_s

    def copy(self) -> StepSeconds:
        return StepSeconds(self.propose_s, self.verify_s, self.forward_s)
