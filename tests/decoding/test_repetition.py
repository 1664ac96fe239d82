"""The repetition guard's decision (`repetition_stop`): its definition, its incremental use, and
what it does on structures real pages hold and on loops, in the Qwen2 tokenizer's tokens.

`tests/data/repetition_qwen2_ids.json` holds those token ids, written by
`hsd bench repetition ../shared/corpus --tokenizer ../shared/tokenizers/qwen2 --ids-out tests/data/repetition_qwen2_ids.json`
(the texts are `hsd_cli.bench.repetition`'s; the corpus half of that bench is in docs/BENCHMARKS.md).
"""

import json
import random
from pathlib import Path

import pytest

from hsd_cli.bench.repetition import GENERATED_LOOPS, LEGITIMATE_STRUCTURES
from hsd_cli.decoding import repetition_stop
from hsd_cli.decoding import repetition
from hsd_cli.decoding.repetition import (
    NO_ALLOWANCE,
    REPETITION_MAX_UNIT,
    REPETITION_SPAN,
    RepetitionGuard,
    find_repetition,
    loop_after,
)

IDS = json.loads((Path(__file__).parent.parent / "data" / "repetition_qwen2_ids.json").read_text())


def loop_ends_after(tokens, n, span, max_unit):
    """Does tokens[n - span:n] repeat one unit of <= max_unit tokens?"""
    window = tokens[n - span : n]
    return n >= span and any(window[unit:] == window[:-unit] for unit in range(1, max_unit + 1))


def first_stop_by_definition(tokens, span, max_unit, checked=0):
    """The smallest n > checked such that tokens[n - span:n] repeats one unit of <= max_unit tokens."""
    return next((n for n in range(checked + 1, len(tokens) + 1) if loop_ends_after(tokens, n, span, max_unit)), None)


def test_find_repetition_follows_its_definition():
    rng = random.Random(0)
    found = 0
    for _ in range(300):
        tokens = []
        while len(tokens) < 120:  # runs of short random units, each repeated a random number of times
            unit = [rng.randrange(5) for _ in range(rng.randint(1, 8))]
            tokens += unit * rng.randint(1, 6)
        loop = find_repetition(tokens, span=24, max_unit=6)
        expected = first_stop_by_definition(tokens, 24, 6)
        assert (loop.stop if loop else None) == expected
        if loop:
            found += 1
            assert tokens[loop.start : loop.stop][loop.unit :] == tokens[loop.start : loop.stop][: -loop.unit]
    assert found > 50


def test_the_guard_asked_after_every_step_stops_where_it_stops_on_the_whole_output():
    rng = random.Random(1)
    text = [rng.randrange(1000) for _ in range(700)]
    tokens = text + [5, 6, 7] * 600
    expected = repetition_stop(tokens)
    assert expected == 700 + REPETITION_SPAN
    checked, stop = 0, None
    while stop is None:  # steps of 1 to 20 tokens, as speculative steps accept them
        step = checked + rng.randint(1, 20)
        loop = loop_after(tokens[:step], checked)
        stop = loop and loop.stop
        checked = step
    assert stop == expected


@pytest.mark.parametrize("name", list(LEGITIMATE_STRUCTURES))
def test_legitimate_repetition_is_not_a_loop(name):
    assert repetition_stop(IDS["structures"][name]) is None


@pytest.mark.parametrize("name", list(GENERATED_LOOPS))
def test_a_loop_as_a_model_writes_it_stops_within_1024_tokens_of_its_start(name):
    before, unit = IDS["loops"][name]["before"], IDS["loops"][name]["unit"]
    tokens = before + unit * (4096 // len(unit))
    stop = repetition_stop(tokens)
    assert stop is not None and stop - len(before) <= 1024


@pytest.mark.parametrize("unit_length", [1, 2, 3, 7, 16, 31, 49, 50])
def test_a_loop_of_any_unit_up_to_50_tokens_stops_within_1024_tokens(unit_length):
    rng = random.Random(unit_length)
    before = [rng.randrange(50_000) for _ in range(300)]
    unit = [rng.randrange(50_000) for _ in range(unit_length)]
    tokens = before + unit * (3000 // unit_length)
    loop = find_repetition(tokens)
    assert loop is not None and loop.stop - len(before) <= 1024
    assert loop.unit == unit_length and loop.reading_end <= len(before) + unit_length


def test_the_units_looked_at_cover_every_loop_the_guard_must_stop():
    assert REPETITION_MAX_UNIT >= 50 and REPETITION_SPAN <= 1024


def test_a_loop_is_looked_for_only_after_the_tokens_already_checked():
    rng = random.Random(2)
    for _ in range(200):
        tokens = []
        while len(tokens) < 120:
            unit = [rng.randrange(5) for _ in range(rng.randint(1, 8))]
            tokens += unit * rng.randint(1, 6)
        checked = rng.randrange(len(tokens))
        loop = find_repetition(tokens, span=24, max_unit=6, checked=checked)
        assert (loop.stop if loop else None) == first_stop_by_definition(tokens, 24, 6, checked)


def guard_stop(tokens, rng, chunk_max=20, allowance=NO_ALLOWANCE):
    """Where RepetitionGuard (letting through what `allowance` holds) stops an output fed to it
    in steps of 1 to chunk_max tokens."""
    guard, fed = RepetitionGuard(allowance), 0
    while fed < len(tokens):
        fed = min(len(tokens), fed + rng.randint(1, chunk_max))
        stop = guard.stop_after(tokens[:fed])
        if stop is not None:
            return stop
    return None


def test_the_guard_fed_step_by_step_stops_where_the_whole_output_stops():
    """Loops of every kind of unit, some a few tokens short of a whole span, some broken just
    before it: the streak shortcut never skips a loop."""
    rng = random.Random(3)
    stopped = 0
    for _ in range(60):
        unit = [rng.randrange(200) for _ in range(rng.randint(1, REPETITION_MAX_UNIT))]
        repeated = (unit * (2 * REPETITION_SPAN // len(unit) + 1))[: REPETITION_SPAN + rng.randint(-40, 40)]
        tokens = [rng.randrange(10_000) for _ in range(rng.randint(0, 300))] + repeated
        tokens += [rng.randrange(10_000) for _ in range(rng.randint(0, 50))] + repeated[: rng.randint(0, REPETITION_SPAN)]
        expected = repetition_stop(tokens)
        assert guard_stop(tokens, rng) == expected
        stopped += expected is not None
    assert 10 < stopped < 50


@pytest.mark.parametrize("name", list(LEGITIMATE_STRUCTURES))
def test_the_guard_passes_legitimate_repetition(name):
    assert guard_stop(IDS["structures"][name], random.Random(4)) is None


@pytest.mark.parametrize("name", list(GENERATED_LOOPS))
def test_the_guard_stops_a_loop_as_a_model_writes_it_where_the_whole_output_does(name):
    before, unit = IDS["loops"][name]["before"], IDS["loops"][name]["unit"]
    tokens = before + unit * (4096 // len(unit))
    assert guard_stop(tokens, random.Random(5)) == repetition_stop(tokens)


def test_the_guard_looks_at_the_windows_only_once_every_token_recurs_for_long(monkeypatch):
    looked = []
    monkeypatch.setattr(repetition, "loop_after", lambda tokens, checked: looked.append(checked))
    rng = random.Random(6)
    prose = [rng.randrange(50_000) for _ in range(3000)]  # no token recurs within 64 of itself
    assert guard_stop(prose, rng) is None and not looked
    streak = REPETITION_SPAN - REPETITION_MAX_UNIT
    tokens = prose[:100] + [1, 2, 3] * ((streak + 1) // 3 + 10)  # every token recurs 3 places back
    guard = RepetitionGuard()
    guard.stop_after(tokens[: 100 + streak + 2])  # the first 3 of the run do not recur yet
    assert not looked
    guard.stop_after(tokens[: 100 + streak + 3])
    assert looked == [100 + streak + 2]
