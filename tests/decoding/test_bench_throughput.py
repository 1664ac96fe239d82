"""`hsd bench throughput` and the corpus projection: every arm decodes every page as `generate`
does; projected seconds are the profile's prices of the steps the loop takes."""

import json
import shutil
from dataclasses import dataclass, replace

import pymupdf
import pytest
from typer.testing import CliRunner

from hsd_cli.bench import bench_app
from hsd_cli.bench.corpus_projection import (
    ProjectedRun, feasible_rows, memory_rows, projected_arms, projected_json, projected_seconds, read_sizers, summed,
)
from hsd_cli.bench.page_stream import FILL
from hsd_cli.bench.throughput_runs import (
    ArmRun, RowSearch, cycled, interleaved, median_summary, paired_ratio, searched_runs, streamed,
)
from hsd_cli.config import Sizing
from hsd_cli.decoding.loop import DecodeConfig, DecodeRequest, DecodeResult
from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer
from hsd_cli.decoding.stats import DecodeStats
from hsd_cli.profiles import ForwardCost, PrefillCost, Profile

from .test_bench_acceptance import STOP, NumberTokenizer
from .test_continuous_batching import NamedScriptTarget

FORWARD_S, PREFILL_S = 0.01, 0.05


def flat_profile(kind="measured", forward_s=FORWARD_S, issue_s=0.0):
    """A forward costs the same at any shape (a device far from its compute bound)."""
    forwards = tuple(ForwardCost(r, n, c, forward_s) for r in (1, 512) for n in (1, 64) for c in (16, 8192))
    prefills = (PrefillCost(100, 10, PREFILL_S), PrefillCost(4000, 10, PREFILL_S))
    return Profile("flat", "m", "d", "float32", kind, forwards, prefills, issue_s=issue_s)


@dataclass(frozen=True)
class Page:
    id: str
    side: int
    drafts: tuple[str, ...]


ANSWERS = {"a": list(range(10, 40)) + [STOP], "b": list(range(50, 62)) + [STOP]}


def text(tokens):
    return " ".join(map(str, tokens))


class SpaceTokenizer(NumberTokenizer):
    """Text of space-separated numbers, one token each."""

    def encode(self, text, add_special_tokens=False):
        return [int(word) for word in text.split()]


def seconds(pages, rows, drafted, sized, on_graphs=False, profile=None):
    return projected_seconds(pages, ANSWERS, SpaceTokenizer(), [STOP], profile or flat_profile(), "tokens",
                             DecodeConfig(max_new_tokens=64, repetition_guard=False), rows=rows, drafted=drafted,
                             sized=sized, on_graphs=on_graphs)


PAGES = [Page("a", 1000, (text(ANSWERS["a"][:-1]),)), Page("b", 1000, ())]


def test_plain_reading_one_page_at_a_time_is_a_prefill_and_a_forward_per_further_token():
    tokens = sum(len(answer) for answer in ANSWERS.values())
    run = seconds(PAGES, 1, drafted=False, sized=False)
    assert (run.pages, run.seconds, run.prefill_s) == (2, pytest.approx(2 * PREFILL_S + (tokens - 2) * FORWARD_S), pytest.approx(2 * PREFILL_S))


def test_rows_read_together_share_their_forwards_over_the_pages_cycled_to_fill_them():
    together = seconds(PAGES, 2, drafted=False, sized=False)
    assert together.pages == FILL * 2, "two pages cycled until three times the rows are read"
    alone = seconds(PAGES, 1, drafted=False, sized=False)
    assert together.seconds < together.pages / len(PAGES) * alone.seconds * 0.75


def test_a_draft_of_the_whole_page_takes_one_forward_and_an_eager_forward_the_longer_of_its_issue_and_the_device():
    assert seconds(PAGES[:1], 1, drafted=True, sized=False) == ProjectedRun(1, pytest.approx(PREFILL_S + FORWARD_S), PREFILL_S)
    issued = flat_profile("analytic", issue_s=2 * FORWARD_S)
    assert seconds(PAGES[:1], 1, drafted=True, sized=False, profile=issued).seconds == pytest.approx(PREFILL_S + 2 * FORWARD_S)
    hidden = flat_profile("analytic", issue_s=FORWARD_S / 2)
    assert seconds(PAGES[:1], 1, drafted=True, sized=False, profile=hidden).seconds == pytest.approx(PREFILL_S + FORWARD_S)
    plain = seconds(PAGES[:1], 1, drafted=False, sized=False, on_graphs=True, profile=issued)
    assert (plain.pages, plain.seconds) == (1, pytest.approx(PREFILL_S + (len(ANSWERS["a"]) - 1) * FORWARD_S)), "graphs issue nothing"


def test_projected_arms_run_the_plain_engine_on_graphs_on_analytic_profiles_only():
    config = DecodeConfig(max_new_tokens=64, repetition_guard=False)

    def arms(kind):
        return projected_arms(PAGES, ANSWERS, SpaceTokenizer(), [STOP], flat_profile(kind, issue_s=2 * FORWARD_S), "tokens",
                              config, (1, 2))

    measured, analytic = arms("measured"), arms("analytic")
    assert measured["plain-cb"][1] == measured["generate"][1]
    assert analytic["plain-cb"][1].seconds < analytic["generate"][1].seconds
    assert analytic["hsd-1"][1] == measured["hsd-1"][1] and measured["hsd-1"][1].seconds < measured["generate"][1].seconds
    assert set(measured) == {"generate", "plain-cb", "hsd-1", "hsd-cb"} and set(measured["hsd-cb"]) == {1, 2}
    assert measured["hsd-cb"][1] == measured["hsd-1"][1], "at one row, each page sized afresh as hsd-1 sizes it"


def test_projected_figures_say_what_share_of_an_arm_is_prefill_and_its_rate_counting_only_the_decoding():
    runs = {"plain-cb": {1: ProjectedRun(4, 8.0, 2.0), 8: ProjectedRun(24, 12.0, 6.0)},
            "hsd-cb": {1: ProjectedRun(4, 4.0, 2.0), 8: ProjectedRun(24, 8.0, 6.0)}}
    arms = projected_json(runs)["arms"]
    assert arms["plain-cb"] == {"best_rows": 8, "pages_per_s": 2.0, "prefill_share": 0.5, "decode_best_rows": 8,
                                "decode_pages_per_s": 4.0}
    assert arms["hsd-cb"] == {"best_rows": 8, "pages_per_s": 3.0, "prefill_share": 0.75, "decode_best_rows": 8,
                              "decode_pages_per_s": 12.0}
    # The prefills bound the ratio: hsd's decoding 3x the plain engine's, its pages 1.5x, never past 1 / 0.5.
    assert arms["hsd-cb"]["pages_per_s"] / arms["plain-cb"]["pages_per_s"] < 1 / arms["plain-cb"]["prefill_share"]


def test_batch_sizing_gives_every_read_one_sizer_above_one_row_as_convert_does():
    per_page, batch = read_sizers(flat_profile(), PAGES, 2), read_sizers(flat_profile(), PAGES, 2, Sizing.BATCH)
    assert per_page(0) is not per_page(1) and per_page(0).batch_rows == 2
    assert batch(0) is batch(1) and batch(0).batch_rows is None
    one_row = read_sizers(flat_profile(), PAGES, 1, Sizing.BATCH)
    assert one_row(0) is not one_row(1), "one row: no shared batch, each read sized alone"
    assert read_sizers(None, PAGES, 2, Sizing.BATCH) is None
    config = DecodeConfig(max_new_tokens=64, repetition_guard=False)
    runs = [projected_seconds(PAGES, ANSWERS, SpaceTokenizer(), [STOP], flat_profile(), "tokens", config, rows=2, drafted=True,
                              sized=True, on_graphs=False, sizing=sizing) for sizing in Sizing]
    assert runs[0].pages == runs[1].pages == FILL * 2


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from hsd_cli.models.tiny_families import build_tiny_random

    return build_tiny_random("qwen2_5_vl", tmp_path_factory.mktemp("throughput_tiny"))


def test_bench_throughput_reports_every_arm_identical_to_generate_per_kind(tiny_model, docs_dir, tmp_path):
    inputs = tmp_path / "pdfs"
    inputs.mkdir()
    for name in ("report.pdf", "scan.pdf"):
        shutil.copy(docs_dir / name, inputs / name)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(flat_profile("analytic").to_json()))
    args = ["throughput", inputs, "--model", tiny_model, "--rows", "1,2", "--projected-rows", "1,4", "--max-new-tokens", "24",
            "--profile", profile, "--json"]
    result = CliRunner().invoke(bench_app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["kinds"]) == {"born_digital", "scan", "all"}
    for kind, entry in report["kinds"].items():
        assert set(entry["arms"]) == {"generate", "plain-cb", "hsd-1", "hsd-cb"}
        for arm, figures in entry["arms"].items():
            assert figures["identical_share"] == 1.0, (kind, arm)
            assert figures["pages_per_s"] > 0 and figures["projected"]["pages_per_s"] > 0
            assert len(figures["pages_per_s_repeats"]) == 3 and figures["spread"] >= 0, "three repeats, their median"
            assert figures["pages_per_s"] == sorted(figures["pages_per_s_repeats"])[1]
            assert figures["draft_cores"] == pytest.approx(entry["draft_cpu_s_per_page"] * figures["pages_per_s"], abs=0.01)
            assert figures["projected"]["draft_cores"] > 0
        assert set(entry["by_rows"]) == {"1", "2"} and set(entry["by_rows"]["2"]) == {"plain-cb", "hsd-cb", "hsd-cb / plain-cb"}
        assert entry["by_rows"]["2"]["hsd-cb / plain-cb"]["median"] > 0
        assert entry["by_rows"]["2"]["plain-cb"]["node_fill"] == 1.0 and 0 < entry["by_rows"]["2"]["hsd-cb"]["node_fill"] <= 1
        assert entry["by_rows"]["1"]["generate"]["node_fill"] is None
        assert set(entry["projected_by_rows"]) == {"1", "4"}
        assert entry["best_against_best"] > 0 and entry["rows_stopped"] in ("the row counts given", None)
    # Two pages of each kind, cycled at 2 rows to FILL x 2 reads; one read each at one row.
    assert report["kinds"]["born_digital"]["by_rows"]["2"]["plain-cb"]["pages_per_s"] > 0
    assert report["kinds"]["born_digital"]["arms"]["generate"]["pages_read"] == 2
    plain = report["kinds"]["born_digital"]["arms"]["plain-cb"]
    assert plain["pages_read"] == (FILL * 2 if plain["best_rows"] == 2 else 2)
    pages = sum(pymupdf.open(path).page_count for path in inputs.iterdir())
    assert report["sized"] and report["plain_on_graphs"] and report["issue_s"] == 0.0 and report["pages"] == pages
    assert report["sizing"] == "page" and report["repeats"] == 3
    assert report["draft_cpu_s_per_page"] > 0


def test_node_fill_is_the_share_of_a_forwards_node_slots_that_hold_a_tree_node():
    # Script 0 has a whole draft (a chain a step), script 1 none (its root alone): in one forward
    # the second row is padded to the first's width.
    scripts = [list(range(10, 40)) + [99], list(range(50, 80)) + [99]]
    pages = [Page(str(index), 1000, ()) for index in range(2)]
    config = DecodeConfig(max_new_tokens=64, repetition_guard=False)

    def run(rows, drafted):
        requests = [DecodeRequest(None, str(index), DraftProposer([scripts[index][1:]]) if drafted[index] else NoDraftProposer())
                    for index in range(2)]
        return streamed(NamedScriptTarget(scripts), pages, requests, rows, config, None)

    assert run(2, (False, False)).summary(None)["node_fill"] == 1.0, "plain rows: one node each, no padding"
    assert run(1, (True, False)).summary(None)["node_fill"] == 1.0, "a row alone is never padded"
    alone, together = run(1, (True, False)), run(2, (True, False))
    assert together.nodes == alone.nodes and together.summary(None)["node_fill"] < 1.0, "the same trees, the plain row padded"
    # By hand: a row of two 4-node steps beside a row of roots, which then takes a step alone.
    by_hand = ArmRun()
    steps = DecodeStats(proposed=6, steps=[(2, 4, 0), (2, 4, 4)])
    by_hand.add("drafted", DecodeResult([], steps, "eos"), 0.0)
    by_hand.add("plain", DecodeResult([], DecodeStats(steps=[(2, 4, 0), (2, 4, 1), (1, 1, 2)]), "eos"), 0.0)
    assert (by_hand.nodes, by_hand.slots) == (8 + 3, 8 + 9) and by_hand.summary(None)["node_fill"] == round(11 / 17, 4)


@pytest.mark.parametrize("rows", ["0", "1,x", "", "automatic"])
def test_bench_throughput_refuses_bad_row_counts_in_one_line(rows, tmp_path):
    result = CliRunner().invoke(bench_app, ["throughput", str(tmp_path), "--model", "m", "--rows", rows])
    assert result.exit_code == 2 and "--rows" in result.output


def timed_run(seconds, pages=1):
    run = ArmRun(seconds=seconds)
    for index in range(pages):
        run.add_tokens(f"p{index}", [1, 2], 0.0)
    return run


def test_a_batched_arm_reads_the_pages_cycled_to_fill_times_its_rows():
    assert cycled(["a", "b"], 1) == ["a", "b"]
    assert cycled(["a", "b"], 4) == ["a", "b"] * (FILL * 2)
    assert cycled(list("abcdefghijklm"), 2) == list("abcdefghijklm"), "enough pages: each once"


def test_the_arms_run_interleaved_each_repeat_in_a_rotated_order_generate_first():
    order = []
    runs = {}
    interleaved(lambda arm, rows: order.append((arm, rows)) or timed_run(1.0), 1, 3, runs)
    assert order == [(arm, 1) for arm in ("generate", "hsd-1", "plain-cb", "hsd-cb", "hsd-1", "plain-cb", "hsd-cb",
                                          "generate", "plain-cb", "hsd-cb", "generate", "hsd-1")]
    assert {arm: {r: len(repeats) for r, repeats in by.items()} for arm, by in runs.items()} == {
        arm: {1: 3} for arm in ("generate", "hsd-1", "plain-cb", "hsd-cb")}
    order.clear()
    interleaved(lambda arm, rows: order.append(arm) or timed_run(1.0), 8, 2, runs)
    assert order == ["plain-cb", "hsd-cb", "hsd-cb", "plain-cb"], "above one row only the batched arms"


def plain_rate_until(flat_from, memory_at=None):
    """A run_arm whose plain engine reads 1 page/s x rows up to `flat_from` rows, then no faster."""
    def run_arm(arm, rows):
        if memory_at is not None and rows >= memory_at:
            raise MemoryError("out of memory")
        return timed_run(1.0 / min(rows, flat_from))
    return run_arm


def test_rows_rise_until_the_plain_engine_stops_gaining():
    measured = searched_runs(plain_rate_until(4), RowSearch(max_rows=256), 3, lambda line: None)
    assert sorted(measured.runs["plain-cb"]) == [1, 2, 4, 8], "8 rows gained nothing over 4: the search stops there"
    assert measured.stopped == "plain-cb gained less than 5% from 4 to 8 rows"
    capped = searched_runs(plain_rate_until(1000), RowSearch(max_rows=16), 1, lambda line: None)
    assert sorted(capped.runs["plain-cb"]) == [1, 2, 4, 8, 16] and capped.stopped == "reached 16 rows"
    given = searched_runs(plain_rate_until(1), RowSearch(given=(1, 3)), 1, lambda line: None)
    assert sorted(given.runs["plain-cb"]) == [1, 3] and given.stopped == "the row counts given"


def test_rows_stop_rising_where_memory_runs_out_and_that_count_is_dropped():
    measured = searched_runs(plain_rate_until(1000, memory_at=8), RowSearch(), 1, lambda line: None)
    assert sorted(measured.runs["plain-cb"]) == [1, 2, 4] and measured.stopped == "out of memory at 8 rows"
    with pytest.raises(ValueError):
        searched_runs(lambda arm, rows: (_ for _ in ()).throw(ValueError("a bug")), RowSearch(), 1, lambda line: None)


def test_figures_are_medians_over_the_repeats_with_their_spread_and_ratios_paired_by_repeat():
    plain = [timed_run(seconds, pages=2) for seconds in (1.0, 2.0, 4.0)]  # 2, 1, 0.5 pages/s
    hsd = [timed_run(seconds, pages=2) for seconds in (0.5, 1.0, 2.0)]  # twice as fast in every repeat
    summary = median_summary(plain, plain[0])
    assert summary["pages_per_s"] == 1.0 and summary["pages_per_s_repeats"] == [2.0, 1.0, 0.5]
    assert summary["spread"] == 1.5 and summary["identical_share"] == 1.0
    assert paired_ratio(hsd, plain) == {"median": 2.0, "spread": 0.0}, "the drift cancels repeat by repeat"


def test_a_page_read_to_other_tokens_on_a_later_cycle_is_not_identical():
    run = timed_run(1.0, pages=2)
    run.add_tokens("p0", [1, 3], 0.0)
    assert run.summary(None)["identical_share"] == 0.5


def test_the_projection_prices_only_the_rows_the_devices_memory_holds_at_the_pages_context():
    from hsd_cli.profiles import DeviceMemory
    from hsd_cli.serving.rows import GIB, device_rows

    # 10 GiB beside 1 GiB of weights; a row's cache at a page's context (its prompt and its output).
    memory = DeviceMemory(device_bytes=10 * GIB, weight_bytes=GIB, kv_bytes_per_token=32 << 20)
    profile = replace(flat_profile("analytic"), memory=memory)
    context = sum(profile.prefill_tokens(page.side) + len(ANSWERS[page.id]) for page in PAGES) / len(PAGES)
    held = memory_rows(profile, PAGES, ANSWERS)
    assert held == device_rows(10 * GIB, GIB, round(context * (32 << 20))) and 2 < held < 8
    assert memory_rows(flat_profile("analytic"), PAGES, ANSWERS) is None, "no memory in the profile: unbounded"
    config = DecodeConfig(max_new_tokens=64, repetition_guard=False)
    arms = projected_arms(PAGES, ANSWERS, SpaceTokenizer(), [STOP], profile, "tokens", config, (1, 2, held, held + 1, 448), 0.0)
    assert set(arms["plain-cb"]) == set(arms["hsd-cb"]) == {1, 2, held}, "rows past the memory are not priced"
    assert feasible_rows((1, 8), 0) == (1,), "a model that fits no row is priced alone"


def test_the_kinds_summed_at_the_rows_every_kind_held():
    runs = [{"plain-cb": {1: ProjectedRun(1, 1.0, 0.5), 8: ProjectedRun(8, 2.0, 1.0)}},
            {"plain-cb": {1: ProjectedRun(2, 1.0, 0.5)}}]
    assert summed(runs) == {"plain-cb": {1: ProjectedRun(3, 2.0, 1.0)}}
