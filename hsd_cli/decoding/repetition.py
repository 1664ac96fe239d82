"""The repetition guard: where decoding stops because the output loops.

A loop is a span of REPETITION_SPAN tokens that repeats one unit of at most REPETITION_MAX_UNIT
tokens. Both numbers were chosen on the Qwen2 tokenizer (docs/BENCHMARKS.md, "Repetition guard"):
the longest such span in every published output and ground-truth page of the corpus is 121
tokens; legitimate structure reaches 784 (a 16 x 16 pipe table of zeros: 16 copies of a 49-token
row); a unit of up to 50 tokens that repeats to the budget must stop within 1,024 tokens of its
start. 960 sits between, and every unit a loop of <= 50 tokens can have is looked at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

REPETITION_SPAN = 960
REPETITION_MAX_UNIT = 64


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


def repetition_stop(tokens: Sequence[int]) -> int | None:
    """The number of tokens after which decoding with the guard stops, None where it never does."""
    loop = find_repetition(tokens)
    return loop.stop if loop else None


def repetition_stop_after(tokens: Sequence[int], checked: int) -> int | None:
    """`repetition_stop(tokens)` where tokens[:checked] is known not to stop: only the windows
    that end in the new tokens are looked at, so a step costs the same however long the output."""
    offset = max(0, checked + 1 - REPETITION_SPAN)
    loop = find_repetition(tokens[offset:], checked=checked - offset)
    return None if loop is None else offset + loop.stop


class RepetitionGuard:
    """`repetition_stop_after` for one output as it grows, each call looking at the tokens added
    since the last. A loop that ends at a token needs each of the REPETITION_SPAN -
    REPETITION_MAX_UNIT tokens up to it to recur among the REPETITION_MAX_UNIT before it (its
    unit's previous copy holds it), so the guard keeps that streak (a dict look-up a token) and
    looks at the windows only where it is long enough: past REPETITION_SPAN tokens the windows
    cost a row 0.15-0.4 ms a step."""

    def __init__(self) -> None:
        self.checked = 0  # tokens looked at so far
        self.streak = 0  # of those, how many last ones in a row each recur among the REPETITION_MAX_UNIT before it
        self.last_seen: dict[int, int] = {}  # token -> the index it was last looked at

    def stop_after(self, tokens: Sequence[int]) -> int | None:
        """`repetition_stop_after(tokens, checked)`, `checked` being the tokens of the last call."""
        checked, loop_possible = self.checked, False
        never = -REPETITION_MAX_UNIT - 1  # recurs at no index
        for index in range(checked, len(tokens)):
            token = tokens[index]
            recurs = self.last_seen.get(token, never) >= index - REPETITION_MAX_UNIT
            self.last_seen[token] = index
            self.streak = self.streak + 1 if recurs else 0
            loop_possible = loop_possible or self.streak >= REPETITION_SPAN - REPETITION_MAX_UNIT
        self.checked = len(tokens)
        return repetition_stop_after(tokens, checked) if loop_possible else None
