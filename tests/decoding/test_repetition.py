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
from hsd_cli.decoding.repetition import REPETITION_MAX_UNIT, REPETITION_SPAN, find_repetition, repetition_stop_after

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
        stop = repetition_stop_after(tokens[:step], checked)
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
