"""The repetition guard: where decoding stops because the output loops.

A loop is a span of REPETITION_SPAN tokens that repeats one unit of at most REPETITION_MAX_UNIT
tokens. Both numbers were chosen on the Qwen2 tokenizer (docs/BENCHMARKS.md, "Repetition guard"):
the longest such span in every published output and ground-truth page of the corpus is 121
tokens; legitimate structure reaches 784 (a 16 x 16 pipe table of zeros: 16 copies of a 49-token
row); a unit of up to 50 tokens that repeats to the budget must stop within 1,024 tokens of its
start. 960 sits between, and every unit a loop of <= 50 tokens can have is looked at.

A repetition the request's drafts hold is structure (a form of 40 empty rows, a 20 x 20 zero
matrix), not a loop (`RepetitionAllowance`). A run is the longest stretch of the output, ending
where it is looked at, that repeats the span's unit (its smallest period, so a 2-token unit
repeated is not also a 4-token one). Decoding stops at a run's REPETITION_SPAN-th token, or,
where some draft repeats the same unit (in any rotation: a run can begin at any phase of it) in
a run of D tokens, at its (D + STRUCTURE_MARGIN_UNITS units + 1)-th. The margin's 3 units: the
partial copies at a run's two ends (under 2 units, tokenised with their neighbours, so the
draft's and the output's differ) and one whole copy the draft's reading may have missed. A loop
past the draft's count then stops within 5 units (320 tokens) of passing it. Only the request's
drafts count (known before decoding, so plain decoding applies the same rule: `RepetitionGuard`
decides in both), not the output itself nor drafts added while decoding.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

REPETITION_SPAN = 960
REPETITION_MAX_UNIT = 64
STRUCTURE_MARGIN_UNITS = 3


@dataclass(frozen=True)
class RepetitionLoop:
    """A loop found in an output: tokens[start:stop] repeats tokens[start:start + unit]."""

    start: int
    unit: int
    stop: int  # decoding with the guard ends after this many tokens

    @property
    def reading_end(self) -> int:
        """Tokens of the output that are the model's reading: up to the end of the unit's first copy."""
        return self.start + self.unit


def _cannot_loop(tokens: np.ndarray, first_end: int, span: int, max_unit: int) -> bool:
    """Cheap test that no window of `span` tokens ending after `first_end` tokens or more can
    repeat one unit: every such window holds the tokens common to all of them, and a window that
    repeats a unit of <= max_unit tokens holds <= max_unit kinds."""
    common = tokens[len(tokens) - span : first_end]
    return len(common) > max_unit and len(np.unique(common)) > max_unit


def find_repetition(
    tokens: Sequence[int], span: int = REPETITION_SPAN, max_unit: int = REPETITION_MAX_UNIT, checked: int = 0
) -> RepetitionLoop | None:
    """The first loop in `tokens` that ends after more than `checked` tokens (the one that ends
    soonest; of those, the shortest unit), None where there is none. After token j, a span of
    `span` tokens repeats a unit of u tokens when none of its last span - u tokens differs from
    the token u places before it: a (units x tokens) table of those differences, of which only
    the last difference before the first possible end is kept."""
    ids = np.asarray(tokens, dtype=np.int64)
    first_end = max(span, checked + 1)
    if len(ids) < first_end or _cannot_loop(ids, first_end, span, max_unit):
        return None
    units = np.arange(1, max_unit + 1)[:, None]
    padded = np.concatenate((np.full(max_unit, -1), ids))  # -1: no token, so no token equals it
    differs = sliding_window_view(padded, len(ids))[max_unit - 1 :: -1] != ids  # row u - 1: against u places before
    split = first_end - 1  # tokens before it count only through the last one that differs
    head = differs[:, :split]
    last_before = np.where(head.any(axis=1), split - 1 - np.argmax(head[:, ::-1], axis=1), -1)
    positions = np.arange(split, len(ids))
    marks = np.concatenate((last_before[:, None], np.where(differs[:, split:], positions, -1)), axis=1)
    last_differing = np.maximum.accumulate(marks, axis=1)[:, 1:]
    ends = positions - last_differing >= span - units
    columns = np.flatnonzero(ends.any(axis=0))
    if not columns.size:
        return None
    stop = split + int(columns[0]) + 1
    unit = int(np.flatnonzero(ends[:, columns[0]])[0]) + 1
    return RepetitionLoop(stop - span, unit, stop)


def loop_after(tokens: Sequence[int], checked: int) -> RepetitionLoop | None:
    """`find_repetition(tokens, checked=checked)`, looking only at the windows that end in the
    tokens after `checked`, so a step costs the same however long the output."""
    offset = max(0, checked + 1 - REPETITION_SPAN)
    loop = find_repetition(tokens[offset:], checked=checked - offset)
    return None if loop is None else RepetitionLoop(offset + loop.start, loop.unit, offset + loop.stop)


def loop_at_end(tokens: Sequence[int]) -> RepetitionLoop | None:
    """The loop an output the guard stopped ends in, from the start of its run (before the last
    span where the drafts held the run), None where its last span repeats no unit."""
    loop = loop_after(tokens, len(tokens) - 1)
    if loop is None:
        return None
    start = loop.start
    while start > 0 and tokens[start - 1] == tokens[start - 1 + loop.unit]:
        start -= 1
    return RepetitionLoop(start, loop.unit, loop.stop)


def unit_key(unit: Sequence[int]) -> tuple[int, ...]:
    """The least rotation of `unit`: a run repeats the same key whatever phase it is looked at in."""
    unit = tuple(unit)
    return min(unit[shift:] + unit[:shift] for shift in range(len(unit)))


def _margin(unit: int) -> int:
    return STRUCTURE_MARGIN_UNITS * unit


@dataclass(frozen=True)
class RepetitionAllowance:
    """The repetition a request's drafts hold: unit key -> the longest run, in tokens, in which
    one draft repeats that unit. Only runs that raise a limit are kept (at least
    REPETITION_SPAN - margin tokens), so a page's drafts keep a handful at most."""

    runs: Mapping[tuple[int, ...], int] = field(default_factory=dict)

    def longest_run(self, unit: Sequence[int]) -> int:
        """The most tokens a run of `unit` may reach before the guard stops it."""
        drafted = self.runs.get(unit_key(unit))
        return REPETITION_SPAN - 1 if drafted is None else max(REPETITION_SPAN - 1, drafted + _margin(len(unit)))


NO_ALLOWANCE = RepetitionAllowance()


def _is_repeated(unit: tuple[int, ...]) -> bool:
    """Is `unit` a shorter unit repeated (a 4-token unit of a 2-token run)?"""
    return any(len(unit) % part == 0 and unit == unit[part:] + unit[:part] for part in range(1, len(unit)))


def _draft_runs(draft: np.ndarray) -> Iterator[tuple[tuple[int, ...], int]]:
    """(unit key, tokens) of each maximal run in `draft` of a unit of up to REPETITION_MAX_UNIT
    tokens, long enough to raise that unit's limit. A repeated unit is left out: it is never
    looked up, the output's unit being its span's smallest."""
    for unit in range(1, min(REPETITION_MAX_UNIT, len(draft) - 1) + 1):
        same = np.concatenate(([False], draft[unit:] == draft[:-unit], [False]))
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        for start, stop in zip(edges[::2], edges[1::2]):
            length = int(stop - start) + unit  # the first copy, then every token equal to the one a unit before
            if length + _margin(unit) >= REPETITION_SPAN:
                key = unit_key(draft[start : start + unit].tolist())
                if not _is_repeated(key):
                    yield key, length


def structure_allowance(drafts: Iterable[Sequence[int]]) -> RepetitionAllowance:
    """The allowance of a request whose drafts are these token lists. They are looked at as one
    array, each after a token of its own that equals no other (a negative one), so no run spans
    two drafts: a page's many short drafts then cost one pass, not one each."""
    pieces = [part for index, draft in enumerate(drafts) for part in ([-1 - index], draft)]
    runs: dict[tuple[int, ...], int] = {}
    for key, length in _draft_runs(np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)):
        runs[key] = max(length, runs.get(key, 0))
    return RepetitionAllowance(runs)


def repetition_stop(tokens: Sequence[int], allowance: RepetitionAllowance = NO_ALLOWANCE) -> int | None:
    """The number of tokens after which decoding with the guard stops, None where it never does."""
    return RepetitionGuard(allowance).stop_after(tokens)


@dataclass(frozen=True)
class _AllowedRun:
    """A run the drafts hold, followed token by token until it breaks or reaches `stop` tokens."""

    unit: int
    stop: int

    def follow(self, tokens: Sequence[int], start: int) -> tuple[int | None, int]:
        """(where the guard stops, None where it does not; the tokens followed): the run goes on
        while each token equals the one a unit before it."""
        for index in range(start, len(tokens)):
            if tokens[index] != tokens[index - self.unit]:
                return None, index
            if index + 1 == self.stop:
                return self.stop, index + 1
        return None, len(tokens)


class RepetitionGuard:
    """`repetition_stop(tokens, allowance)` for one output as it grows, each call looking at the
    tokens added since the last. A loop that ends at a token needs each of the REPETITION_SPAN -
    REPETITION_MAX_UNIT tokens up to it to recur among the REPETITION_MAX_UNIT before it (its
    unit's previous copy holds it), so the guard keeps that streak (a dict look-up a token) and
    looks at the windows only where it is long enough: past REPETITION_SPAN tokens the windows
    cost a row 0.15-0.4 ms a step. A run the drafts hold is then followed a comparison a token."""

    def __init__(self, allowance: RepetitionAllowance = NO_ALLOWANCE) -> None:
        self.allowance = allowance
        self.checked = 0  # tokens looked at so far
        self.streak = 0  # of those, how many last ones in a row each recur among the REPETITION_MAX_UNIT before it
        self.last_seen: dict[int, int] = {}  # token -> the index it was last looked at
        self.run: _AllowedRun | None = None  # the run the drafts hold that the output is in

    def stop_after(self, tokens: Sequence[int]) -> int | None:
        """Where decoding stops, given that it did not within the tokens of the last call."""
        checked = self.checked
        loop_possible = self._count_streak(tokens)
        while True:
            if self.run is not None:
                stop, checked = self.run.follow(tokens, checked)
                if stop is not None or checked == len(tokens):
                    return stop
                self.run = None  # broken: a span ending after it can repeat only another unit
            loop = loop_after(tokens, checked) if loop_possible else None
            if loop is None:
                return None
            # The span's first end is its run's REPETITION_SPAN-th token: the run began at loop.start.
            stop = loop.start + self.allowance.longest_run(tokens[loop.stop - loop.unit : loop.stop]) + 1
            if stop == loop.stop:
                return stop
            self.run, checked = _AllowedRun(loop.unit, stop), loop.stop

    def _count_streak(self, tokens: Sequence[int]) -> bool:
        """Take the new tokens into the streak: could a span that repeats a unit end among them?"""
        loop_possible = False
        never = -REPETITION_MAX_UNIT - 1  # recurs at no index
        for index in range(self.checked, len(tokens)):
            token = tokens[index]
            recurs = self.last_seen.get(token, never) >= index - REPETITION_MAX_UNIT
            self.last_seen[token] = index
            self.streak = self.streak + 1 if recurs else 0
            loop_possible = loop_possible or self.streak >= REPETITION_SPAN - REPETITION_MAX_UNIT
        self.checked = len(tokens)
        return loop_possible
