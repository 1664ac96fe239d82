"""`hsd bench pipeline --profile` prices an arm's measured work as the planner prices a plan: each
prefill at its picture's size, each step at its measured shape with the host work around it, and
every read of a page its output had turned and read again."""

import pytest

from hsd_cli.bench.pipeline_arms import projected_s
from hsd_cli.decoding import DecodeResult
from hsd_cli.decoding.stats import DecodeStats
from hsd_cli.records.page import Reading
from hsd_cli.profiles import ForwardCost, HostCost, PrefillCost, Profile
from hsd_cli.records.totals import RegionResult

# A forward costs 10 ms a row at any width and context, a step 1 ms more on the host; a prefill
# 10 ms for a 100-pixel square, 1 s for a 1,000-pixel one, linear in the area between.
PROFILE = Profile(
    "hand-made", "test", "gpu", "bfloat16", "analytic",
    tuple(ForwardCost(r, n, c, 0.01 * r) for c in (100, 10_000) for r in (1, 8) for n in (1, 64)),
    (PrefillCost(100, 50, 0.01), PrefillCost(1000, 1000, 1.0)), HostCost(per_step=0.001),
)
PAGE_SIDE = 800
CROPS = {"wide": 200, "tall": 600}


def prefill(side: int) -> float:
    return 0.01 + 0.99 * (side**2 - 100**2) / (1000**2 - 100**2)


def steps(count: int, rows: int = 1) -> DecodeStats:
    """A read of `count` steps of `rows` rows (one token each, 4 nodes wide)."""
    return DecodeStats(forwards=count + 1, new_tokens=count + 1, steps=[(rows, 4, i + 1) for i in range(count)])


def step(rows: int) -> float:
    return 0.01 * rows + 0.001


def reading(last: DecodeStats, earlier: tuple[DecodeStats, ...] = (), regions: dict[str, DecodeStats] | None = None,
            region_s: float = 0.0) -> Reading:
    read = tuple(RegionResult(block, "text", "eos", stats) for block, stats in (regions or {}).items())
    return Reading(DecodeResult([], last, "eos"), None, "", {}, rotation=90 if earlier else 0, earlier=earlier,
                   regions=read, region_s=region_s)


def test_a_page_read_once_costs_its_prefill_and_its_steps():
    assert projected_s(PROFILE, reading(steps(20)), PAGE_SIDE, CROPS) == pytest.approx(prefill(800) + 20 * step(1))


def test_every_read_of_a_page_turned_by_its_output_is_priced():
    projected = projected_s(PROFILE, reading(steps(20), earlier=(steps(30), steps(25))), PAGE_SIDE, CROPS)
    assert projected == pytest.approx(3 * prefill(800) + (30 + 25 + 20) * step(1))


def test_region_passes_pay_each_crops_prefill_at_its_own_size_and_their_batchs_steps():
    regions = {"wide": steps(12, rows=2), "tall": steps(9, rows=2)}
    projected = projected_s(PROFILE, reading(steps(20), regions=regions, region_s=1.0), PAGE_SIDE, CROPS)
    assert projected == pytest.approx(prefill(200) + prefill(600) + 12 * step(2) + prefill(800) + 20 * step(1))


def test_packed_rows_ride_in_the_first_reads_steps_and_a_re_read_is_a_page_read():
    regions = {"wide": steps(12, rows=3), "tall": steps(9, rows=3)}
    first, again = steps(15, rows=3), steps(20)
    projected = projected_s(PROFILE, reading(again, earlier=(first,), regions=regions), PAGE_SIDE, CROPS)
    packed = prefill(800) + prefill(200) + prefill(600) + 15 * step(3)
    assert projected == pytest.approx(packed + prefill(800) + 20 * step(1))
