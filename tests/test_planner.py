"""The planner behind `--stages auto`: from a cost profile and an acceptance estimate, per page,
plain decoding, the page stage or packed decoding, whichever it predicts fastest; every choice
lossless and recorded in the page's JSON."""

import json

import pytest

from hsd_cli.profiles import ForwardCost, PrefillCost, Profile
from hsd_cli.stages.planner import TAU_PRIOR, PageOutlook, expected_tau, plan_page


def profile(cost, prefill=(0.05, 0.2)) -> Profile:
    """A profile whose forward costs `cost(rows, nodes)` seconds at any context, and whose page
    prefill costs `prefill` seconds for a 256- and a 2048-pixel picture."""
    forwards = tuple(
        ForwardCost(rows, nodes, context, cost(rows, nodes)) for rows in (1, 8) for nodes in (1, 64) for context in (256, 4096)
    )
    prefills = (PrefillCost(256, 200, prefill[0]), PrefillCost(2048, 1400, prefill[1]))
    return Profile("hand-made", "test", "cpu", "float32", "measured", forwards, prefills)


CPU_LIKE = profile(lambda rows, nodes: 0.03 * (1 + rows * nodes / 16))  # every node costs compute
# Memory-bound: nodes and rows nearly free, a small picture's prefill about one forward.
GPU_LIKE = profile(lambda rows, nodes: 0.01 * (1 + rows * nodes / 2048), prefill=(0.012, 0.05))


def outlook(kind="born_digital", tokens=800, crops=6, earlier_tau=()):
    return PageOutlook(kind=kind, expected_tokens=tokens, crops=crops, picture_side=1600, earlier_tau=earlier_tau)


def test_where_nodes_cost_compute_good_drafts_go_to_the_page_stage_and_poor_ones_to_plain_decoding():
    assert plan_page(CPU_LIKE, outlook()).chosen == "page"
    poor = plan_page(CPU_LIKE, outlook(kind="scan", earlier_tau=(1.1, 1.2, 1.0)))
    assert poor.chosen == "plain" and poor.predicted_s["plain"] < poor.predicted_s["page"] < poor.predicted_s["packed"]


def test_where_rows_are_nearly_free_the_crops_ride_along_packed():
    assert plan_page(GPU_LIKE, outlook()).chosen == "packed"
    assert plan_page(GPU_LIKE, outlook(crops=0)).chosen == "page", "nothing to pack"
    assert "packed" not in plan_page(GPU_LIKE, outlook(crops=0)).predicted_s


def test_the_acceptance_estimate_starts_at_the_prior_and_follows_the_document():
    assert expected_tau(outlook()) == TAU_PRIOR["born_digital"]
    assert expected_tau(outlook(kind="scan", earlier_tau=(1.0, 1.0, 1.0))) == pytest.approx((TAU_PRIOR["scan"] + 3) / 4)
    assert plan_page(CPU_LIKE, outlook(earlier_tau=(9.0,))).tau > TAU_PRIOR["born_digital"]


FREE_ROWS = profile(lambda rows, nodes: 0.01, prefill=(0.001, 0.05))  # wider forwards cost nothing more
NODES_DEAR = profile(lambda rows, nodes: 0.03 * rows * nodes)  # a forward costs each of its nodes


@pytest.mark.parametrize(("cost", "chosen"), [(CPU_LIKE, "page"), (FREE_ROWS, "packed"), (NODES_DEAR, "plain")])
def test_convert_auto_plans_each_page_and_stays_lossless(cost, chosen, tmp_path, docs_dir):
    from hsd_cli.models.tiny import build_tiny_random
    from tests.conftest import run_hsd

    model = build_tiny_random("qwen2_5_vl", tmp_path / "tiny")
    profile_file = tmp_path / "profile.json"
    profile_file.write_text(json.dumps(cost.to_json()))
    result = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", model, "--pages", "1",
        "--max-new-tokens", "24", "--profile", profile_file, "--baseline", "--json",
    )
    assert result.exit_code == 0, result.stderr
    page = json.loads((tmp_path / "out" / "report.json").read_text())["pages"][0]
    assert page["stats"]["plan"]["chosen"] == chosen and set(page["stats"]["plan"]["predicted_s"]) >= {"plain", "page"}
    assert page["stats"]["baseline"]["identical"] and page["text_source"] == "model"
    assert ("regions" in page["stats"]) == (chosen == "packed")


def test_a_profile_that_cannot_be_read_ends_the_run_before_any_work(tmp_path, docs_dir):
    from hsd_cli.models.tiny import build_tiny_random
    from tests.conftest import run_hsd

    model = build_tiny_random("qwen2_5_vl", tmp_path / "tiny")
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", model, "--profile", tmp_path / "none.json")
    assert result.exit_code == 4 and "cannot read cost profile" in result.stderr
    assert not (tmp_path / "out" / "report.md").exists()
