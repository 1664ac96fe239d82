"""The planner behind `--stages auto`: from a cost profile and an acceptance estimate, per page,
plain decoding, the page stage or packed decoding, whichever it predicts fastest; every choice
lossless and recorded in the page's JSON."""

import json
from dataclasses import replace

import pytest
from PIL import Image

from hsd_cli.config import Stages
from hsd_cli.records.page import Page, Plan, Way
from hsd_cli.profiles import ForwardCost, HostCost, PrefillCost, Profile, square_side
from hsd_cli.records.kinds import Block, BlockKind
from hsd_cli.stages.packed import PACKED_REGIONS
from hsd_cli.stages.planner import (
    PREDICTION_SLACK, REGION_TAU, TAU_PRIOR, BlockOutlook, block_outlooks, expected_tau, fixed_plan, picture_side, plan_page,
)
from hsd_cli.stages.region import REGION_BATCH


def profile(cost, prefill=(0.05, 0.2)) -> Profile:
    """A profile whose forward costs `cost(rows, nodes, context)` seconds, and whose prefill costs
    `prefill` seconds for a 256- and a 2048-pixel picture (200 and 1400 tokens)."""
    forwards = tuple(
        ForwardCost(rows, nodes, context, cost(rows, nodes, context))
        for rows in (1, 8) for nodes in (1, 64) for context in (256, 4096)
    )
    prefills = (PrefillCost(256, 200, prefill[0]), PrefillCost(2048, 1400, prefill[1]))
    return Profile("hand-made", "test", "cpu", "float32", "measured", forwards, prefills)


CPU_LIKE = profile(lambda rows, nodes, context: 0.03 * (1 + rows * nodes / 16))  # every node costs compute
# Memory-bound: nodes and rows nearly free, a small picture's prefill about one forward.
GPU_LIKE = profile(lambda rows, nodes, context: 0.01 * (1 + rows * nodes / 2048), prefill=(0.012, 0.05))
# Attention over the context dominates: a crop's forward is far cheaper than the page's.
CONTEXT_DEAR = profile(lambda rows, nodes, context: 0.004 * context / 256, prefill=(0.001, 0.05))


def block(tokens, name="b", crop_side=300, kind="text"):
    return BlockOutlook(name, kind, tokens, crop_side)


def outlook(kind="born_digital", tokens=800, crops=6, earlier_tau=(), blocks=None) -> dict:
    """A page of `crops` blocks with crops (and one without, where crops=0) sharing `tokens`."""
    if blocks is None:
        count = max(crops, 1)
        blocks = tuple(block(tokens // count, f"b{i}", crop_side=300 if crops else 0) for i in range(count))
    return {"kind": kind, "blocks": blocks, "picture_side": 1600, "earlier_tau": earlier_tau}


def planned(cost: Profile, page: dict, time_limit_s: float = 0.0) -> Plan:
    """The planner's plan for `page`, with the region and packed stages' row limits."""
    return plan_page(cost, **page, region_batch=REGION_BATCH, packed_regions=PACKED_REGIONS, time_limit_s=time_limit_s)


def test_where_nodes_cost_compute_good_drafts_go_to_the_page_stage_and_poor_ones_to_plain_decoding():
    page = planned(CPU_LIKE, outlook())
    assert page.way == "page" and page.regions == ()
    poor = planned(CPU_LIKE, outlook(kind="scan", crops=0, earlier_tau=(1.1, 1.2, 1.0)))
    assert poor.way == "plain" and poor.predicted_s["plain"] < poor.predicted_s["page"]


def test_where_rows_are_nearly_free_region_passes_pay():
    plan = planned(GPU_LIKE, outlook())
    assert plan.way in ("region-page", "packed") and plan.regions == tuple(f"b{i}" for i in range(6))
    assert max(plan.predicted_s["region-page"], plan.predicted_s["packed"]) < plan.predicted_s["page"]
    assert planned(GPU_LIKE, outlook(crops=0)).way == "page", "no crop to read"
    assert not {"packed", "region-page"} & set(planned(GPU_LIKE, outlook(crops=0)).predicted_s)


def test_a_long_block_rides_along_packed_where_reading_it_first_would_hold_the_page_up():
    plan = planned(GPU_LIKE, outlook(blocks=(block(800, "only"),)))
    assert plan.way == "packed" and plan.regions == ("only",)
    assert plan.predicted_s["region-page"] > plan.predicted_s["page"], "its region pass alone takes as long as the page"


def test_where_the_page_context_makes_forwards_dear_the_crops_are_read_first():
    plan = planned(CONTEXT_DEAR, outlook(crops=8))
    assert plan.way == "region-page" and len(plan.regions) == 8
    assert plan.predicted_s["region-page"] < min(plan.predicted_s[name] for name in ("page", "packed", "plain"))


def test_a_region_pass_goes_to_the_blocks_whose_reading_saves_more_than_their_crop_costs():
    blocks = (block(600, "long"), block(3, "short"), block(400, "no-crop", crop_side=0), block(200, "mid"))
    plan = planned(GPU_LIKE, outlook(blocks=blocks))
    assert plan.regions == ("long", "mid"), "ordered by page steps saved; the short block is not worth a prefill"
    assert planned(CPU_LIKE, outlook(blocks=blocks)).regions == ()


def test_blocks_of_a_kind_that_drafts_poorly_are_read_first():
    plan = planned(GPU_LIKE, outlook(kind="scan", blocks=(block(300, "text"), block(300, "table", kind="table"))))
    assert plan.regions[0] == "table", "an OCR'd table drafts at about half a paragraph's acceptance"
    born = planned(GPU_LIKE, outlook(blocks=(block(300, "text"), block(300, "table", kind="table"))))
    assert born.regions[0] == "text", "a text-layer table drafts better than its paragraphs"


def test_a_block_whose_drafts_already_reach_the_region_outputs_acceptance_gets_no_region_pass():
    plan = planned(GPU_LIKE, outlook(earlier_tau=(REGION_TAU["born_digital"] * 2,) * 5))
    assert plan.regions == () and plan.way == "page"


def test_a_page_predicted_far_over_its_time_limit_is_left_to_its_draft():
    fastest = min(planned(CPU_LIKE, outlook()).predicted_s.values())
    over = planned(CPU_LIKE, outlook(), time_limit_s=fastest / PREDICTION_SLACK * 0.9)
    assert over.way == "draft" and over.regions == () and min(over.predicted_s.values()) == fastest
    within = planned(CPU_LIKE, outlook(), time_limit_s=fastest / PREDICTION_SLACK * 1.1)
    assert within.way == "page", "a prediction may be this many times over: the page may still finish"


def test_the_acceptance_estimate_starts_at_the_prior_and_follows_the_document():
    assert expected_tau("born_digital") == TAU_PRIOR["born_digital"]
    assert expected_tau("scan", (1.0, 1.0, 1.0)) == pytest.approx((TAU_PRIOR["scan"] + 3) / 4)
    assert planned(CPU_LIKE, outlook(earlier_tau=(9.0,))).tau > TAU_PRIOR["born_digital"]


def test_every_step_the_planner_prices_carries_the_profiles_host_work():
    page = outlook(kind="scan", crops=0, earlier_tau=(1.1, 1.2, 1.0))  # 800 tokens, read plainly
    bare, hosted = planned(CPU_LIKE, page), planned(replace(CPU_LIKE, host=HostCost(per_step=0.01)), page)
    assert hosted.predicted_s["plain"] - bare.predicted_s["plain"] == pytest.approx(800 * 0.01), "a step per token"
    assert hosted.predicted_s["page"] - bare.predicted_s["page"] < 800 * 0.01, "fewer steps where drafts are verified"


def test_pictures_and_crops_are_priced_by_their_area():
    """A line's crop is wide and low: priced by its longer side it would cost a page's prefill."""
    line = Block(id="line", kind=BlockKind.TEXT, bbox=(50, 100, 550, 120), order=1, text="x", confidence=1.0, source="ocr")
    page = Page(page_no=1, size_pt=(600, 800), picture=Image.new("RGB", (600, 800)), scale=1.0, blocks=(line,))
    assert [b.crop_side for b in block_outlooks(page, lambda text: 1, region_padding_px=4)] == [square_side(508, 28)] == [119]
    assert picture_side(page) == square_side(600, 800) == 693


def test_stages_fix_the_plan_without_a_profile_and_auto_reads_only_uncertain_blocks_first():
    def draft_block(n, kind=BlockKind.TEXT, source="pdf-text"):
        return Block(id=f"p1-b{n}", kind=kind, bbox=(0, 0, 9, 9), order=n, text="x", confidence=1.0, source=source)

    blocks = (draft_block(1), draft_block(2, BlockKind.TABLE), draft_block(3, source="ocr"), draft_block(4, BlockKind.FORMULA))
    assert fixed_plan(Stages.PAGE, blocks) == Plan(Way.PAGE)
    assert fixed_plan(Stages.REGION_PAGE, blocks) == Plan(Way.REGION_PAGE, regions=("p1-b1", "p1-b2", "p1-b3", "p1-b4"))
    assert fixed_plan(Stages.PACKED, blocks).regions == fixed_plan(Stages.REGION_PAGE, blocks).regions
    auto = fixed_plan(Stages.AUTO, blocks)
    assert auto == Plan(Way.REGION_PAGE, regions=("p1-b2", "p1-b3", "p1-b4")) and not auto.predicted


NODES_DEAR = profile(lambda rows, nodes, context: 0.03 * rows * nodes)  # a forward costs each of its nodes
# Memory-bound, a crop's prefill two forwards: on the fixture's page only its longest blocks are worth
# a region pass, and reading them first would hold the page up.
CROPS_DEAR = profile(lambda rows, nodes, context: 0.01 * (1 + rows * nodes / 2048), prefill=(0.02, 0.05))


@pytest.mark.parametrize(("cost", "chosen"), [
    pytest.param(CPU_LIKE, "page", marks=pytest.mark.slow), pytest.param(CROPS_DEAR, "packed", marks=pytest.mark.slow),
    pytest.param(NODES_DEAR, "plain", marks=pytest.mark.slow), (CONTEXT_DEAR, "region-page"),
])
def test_convert_auto_plans_each_page_and_stays_lossless(cost, chosen, tmp_path, docs_dir):
    from hsd_cli.models.tiny_families import build_tiny_random
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
    plan = page["stats"]["plan"]
    assert page["stats"].get("regions", {}).get("count", 0) == len(plan["regions"]), "the planned blocks were read"
    assert bool(plan["regions"]) == (chosen in ("packed", "region-page"))


def test_convert_leaves_a_page_the_model_would_not_read_in_time_to_its_draft_at_once(tmp_path, docs_dir):
    from hsd_cli.models.tiny_families import build_tiny_random
    from tests.conftest import run_hsd

    model = build_tiny_random("qwen2_5_vl", tmp_path / "tiny")
    profile_file = tmp_path / "profile.json"
    profile_file.write_text(json.dumps(profile(lambda rows, nodes, context: 60.0).to_json()))  # a minute a forward
    result = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", model, "--pages", "1",
        "--profile", profile_file, "--page-timeout", "20", "--json",
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["documents"][0]["status"] == "degraded"
    assert "page 1: the model would take about" in result.stderr and "--page-timeout 20 s" in result.stderr
    page = json.loads((tmp_path / "out" / "report.json").read_text())["pages"][0]
    assert page["flags"] == ["fallback", "predicted_timeout"] and page["text_source"] == "draft"


def test_a_profile_that_cannot_be_read_ends_the_run_before_any_work(tmp_path, docs_dir):
    from hsd_cli.models.tiny_families import build_tiny_random
    from tests.conftest import run_hsd

    model = build_tiny_random("qwen2_5_vl", tmp_path / "tiny")
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", model, "--profile", tmp_path / "none.json")
    assert result.exit_code == 4 and "cannot read cost profile" in result.stderr
    assert not (tmp_path / "out" / "report.md").exists()
