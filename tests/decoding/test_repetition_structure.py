"""The repetition guard's allowance (issue 49): a repetition the request's drafts hold is
structure, not a loop, up to the draft's count; past it, and without such a draft, loops stop as
before. The structures are `hsd_cli.bench.repetition.DRAFTED_STRUCTURES` in the Qwen2 tokenizer's
tokens, recorded in tests/data/repetition_qwen2_ids.json (test_repetition.py says how)."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from hsd_cli.bench.repetition import DRAFTED_STRUCTURES
from hsd_cli.decoding.repetition import (
    NO_ALLOWANCE,
    REPETITION_MAX_UNIT,
    REPETITION_SPAN,
    STRUCTURE_MARGIN_UNITS,
    find_repetition,
    loop_at_end,
    repetition_stop,
    structure_allowance,
    unit_key,
)

from tests.decoding.test_repetition import guard_stop

IDS = json.loads((Path(__file__).parent.parent / "data" / "repetition_qwen2_ids.json").read_text())


# -- the rule, written out the slow way ------------------------------------------------------


def smallest_units(tokens):
    """For each n, the smallest unit of up to REPETITION_MAX_UNIT tokens tokens[n - span:n]
    repeats (0: none): it has period u where every token past its first u equals the one u before."""
    ids, span = np.asarray(tokens), REPETITION_SPAN
    smallest = np.zeros(len(ids) + 1, dtype=int)
    for unit in range(REPETITION_MAX_UNIT, 0, -1):
        differs = np.concatenate(([0], np.cumsum(ids[unit:] != ids[:-unit])))  # differs[k]: mismatches among the first k
        ends = np.arange(span, len(ids) + 1)
        periodic = differs[ends - unit] == differs[ends - span]
        smallest[ends[periodic]] = unit
    return smallest


def run_before(tokens, end, unit):
    """Tokens in the longest stretch ending at `end` in which each token equals the one `unit` before it."""
    start = end - unit
    while start > 0 and tokens[start - 1] == tokens[start - 1 + unit]:
        start -= 1
    return end - start


def drafted_runs(drafts):
    """Unit key -> the longest stretch of one draft that repeats that unit (at least twice over
    its first token), every unit of up to REPETITION_MAX_UNIT tokens, in plain Python."""
    runs = {}
    for draft in drafts:
        for unit in range(1, REPETITION_MAX_UNIT + 1):
            for end in range(unit + 1, len(draft) + 1):
                last = end == len(draft) or draft[end] != draft[end - unit]  # of a stretch
                if last and (length := run_before(draft, end, unit)) > unit:
                    key = unit_key(draft[end - unit : end])
                    runs[key] = max(length, runs.get(key, 0))
    return runs


def stop_by_definition(tokens, drafts):
    """The first n where tokens[n - REPETITION_SPAN:n] repeats a unit (its smallest) whose run up
    to n is longer than REPETITION_SPAN - 1 and than the drafts' longest run of it and the margin."""
    runs, units = drafted_runs(drafts), smallest_units(tokens)
    for n in range(REPETITION_SPAN, len(tokens) + 1):
        unit = int(units[n])
        if unit:
            drafted = runs.get(unit_key(tokens[n - unit : n]), 0)
            allowed = max(REPETITION_SPAN - 1, drafted + STRUCTURE_MARGIN_UNITS * unit) if drafted else REPETITION_SPAN - 1
            if run_before(tokens, n, unit) > allowed:
                return n
    return None


def rotated(unit, shift):
    return unit[shift:] + unit[:shift]


def test_the_guard_follows_the_rule_whatever_the_steps():
    """Drafts that repeat a unit fewer, as many or more times than the output, in other phases;
    outputs whose run breaks and loops on."""
    rng = random.Random(7)
    stopped, let_through = 0, 0
    for _ in range(16):
        unit = [rng.randrange(30) for _ in range(rng.choice([1, 2, 3, 5, 8, 13, 21, 40, 64]))]
        copies = (REPETITION_SPAN + rng.randint(-100, 600)) // len(unit)
        noise = lambda n: [rng.randrange(1000, 9000) for _ in range(n)]  # noqa: E731
        draft = noise(50) + rotated(unit, rng.randrange(len(unit))) * (copies + rng.randint(-6, 6)) + noise(20)
        run = rotated(unit, rng.randrange(len(unit))) * copies
        tokens = noise(rng.randint(0, 200)) + run + noise(rng.randint(0, 3)) + run[: rng.randint(0, 1500)]
        expected = stop_by_definition(tokens, [draft])
        allowance = structure_allowance([draft, noise(300)])
        assert guard_stop(tokens, rng, allowance=allowance) == expected == repetition_stop(tokens, allowance)
        stopped += expected is not None
        let_through += expected is None and repetition_stop(tokens) is not None
    assert stopped >= 4 and let_through >= 3


# -- loops still stop ----------------------------------------------------------------------


OTHER_DRAFTS = [IDS["drafted"][name] for name in DRAFTED_STRUCTURES]


@pytest.mark.parametrize("unit_length", range(1, REPETITION_MAX_UNIT + 1))
def test_a_loop_of_any_unit_up_to_64_tokens_stops_within_1024_tokens_without_a_draft_that_holds_it(unit_length):
    rng = random.Random(unit_length)
    before = [rng.randrange(50_000) for _ in range(300)]
    unit = [rng.randrange(50_000) for _ in range(unit_length)]
    tokens = before + unit * (3000 // unit_length)
    few = [rng.randrange(50_000) for _ in range(20)] + unit * (700 // unit_length)  # holds the unit, not as often
    other = [rng.randrange(50_000) for _ in range(unit_length)] * (3000 // unit_length)  # holds another unit as often
    for allowance in (NO_ALLOWANCE, structure_allowance(OTHER_DRAFTS), structure_allowance([few, other])):
        stop = repetition_stop(tokens, allowance)
        assert stop is not None and stop - len(before) <= 1024


@pytest.mark.parametrize("unit_length", [1, 2, 7, 28, 48, 60, 64])
def test_a_loop_past_the_drafts_count_stops_within_5_units_of_passing_it(unit_length):
    rng = random.Random(100 + unit_length)
    unit = [rng.randrange(50_000) for _ in range(unit_length)]
    held = 2000 // unit_length  # copies the draft holds, more than a span's worth
    draft = [rng.randrange(50_000) for _ in range(40)] + unit * held + [rng.randrange(50_000) for _ in range(40)]
    before = [rng.randrange(50_000) for _ in range(300)]
    tokens = before + rotated(unit, unit_length // 2) * (6000 // unit_length)
    stop = repetition_stop(tokens, structure_allowance([draft]))
    passed = len(before) + held * unit_length  # the output holds one copy more than the draft from here on
    assert passed < stop <= passed + 5 * unit_length
    assert loop_at_end(tokens[:stop]).start == len(before) and loop_at_end(tokens[:stop]).unit == unit_length


# -- structures pass where the draft holds them -------------------------------------------


def run_end(tokens, start, unit):
    end = start + unit
    while end < len(tokens) and tokens[end] == tokens[end - unit]:
        end += 1
    return end


@pytest.mark.parametrize("name", list(DRAFTED_STRUCTURES))
def test_a_structure_the_drafts_hold_is_not_cut(name):
    structure = IDS["drafted"][name]
    loop = find_repetition(structure)
    assert loop is not None and loop.stop <= 1000, "cut without the allowance: the case issue 49 names"
    before, after = IDS["loops"]["a 16-token sentence"]["unit"], IDS["loops"]["a 50-token paragraph"]["unit"]
    page = before + structure + after  # the page's output, the structure among its text
    drafts = [before + after, structure]  # the page's drafts: the structure one block of several
    assert repetition_stop(page, structure_allowance(drafts)) is None
    assert repetition_stop(page) is not None
    assert guard_stop(page, random.Random(8), allowance=structure_allowance(drafts)) is None


@pytest.mark.parametrize("name", list(DRAFTED_STRUCTURES))
def test_a_structure_the_output_goes_on_repeating_is_cut(name):
    """The output repeats the structure's unit to 4,096 tokens: it stops within 5 units of
    passing the draft's run, and its reading keeps the run's first copy."""
    structure = IDS["drafted"][name]
    loop = find_repetition(structure)
    end = run_end(structure, loop.start, loop.unit)
    looping = structure[:end]
    while len(looping) < 4096:
        looping.append(looping[-loop.unit])
    stop = repetition_stop(looping, structure_allowance([structure]))
    assert end < stop <= end + 5 * loop.unit
    assert loop_at_end(looping[:stop]) == type(loop)(loop.start, loop.unit, stop)


def test_a_unit_is_the_same_in_every_rotation_and_only_its_own():
    unit = [3, 1, 4, 1, 5]
    assert unit_key(unit) == unit_key(rotated(unit, 2)) == unit_key(rotated(unit, 4)) != unit_key([1, 3, 4, 1, 5])
    tokens = [9] + rotated(unit, 3) * 400
    assert repetition_stop(tokens, structure_allowance([[7, 7] + unit * 400])) is None
    assert repetition_stop(tokens, structure_allowance([[7, 7] + [3, 1, 4, 1, 6] * 400])) == 1 + REPETITION_SPAN


def test_a_units_multiple_allows_nothing_more():
    """A 2-token unit repeated is also a 4-token unit repeated: the run is the 2-token unit's,
    and a draft holding a 4-token unit that merely starts like it holds none of it."""
    assert repetition_stop([1, 2] * 1200, structure_allowance([[1, 2] * 1100])) == 2 * 1100 + 2 * STRUCTURE_MARGIN_UNITS + 1
    assert repetition_stop([1, 2] * 1200, structure_allowance([[1, 2, 1, 3] * 600])) == REPETITION_SPAN
    assert repetition_stop([2, 1] * 1200, structure_allowance([[1, 2, 1, 2] * 550])) == 2 * 1100 + 2 * STRUCTURE_MARGIN_UNITS + 1


def test_drafts_keep_only_the_runs_that_raise_a_limit():
    rng = random.Random(9)
    text = [rng.randrange(50_000) for _ in range(5000)]
    short = text[:100] + [5, 6] * 476 + text[100:]  # 952 tokens, and 3 units of margin: below the span
    assert structure_allowance([text, short]).runs == {}
    assert structure_allowance([[5, 6] * 300, [5, 6] * 300]).runs == {}, "no run spans two drafts"
    assert structure_allowance([text[:100] + [5, 6] * 477 + text[100:]]).runs == {(5, 6): 954}
