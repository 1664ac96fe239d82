"""The VLM stages' typed statistics: one speedup definition for pages, documents and runs; region
outputs as the page stage's drafts; checkpoints from an earlier hsd redone, not misread."""

import pickle
from dataclasses import replace

from hsd_cli.models.settings import settings_for
from hsd_cli.records import Block, BlockKind, PageResult
from hsd_cli.stages.dialect import page_drafts
from hsd_cli.decoding.stats import DecodeStats
from hsd_cli.stats import DecodingTotals, PageStats, StageSeconds


def _page(forwards: int, new_tokens: int, region_s: float, page_s: float, baseline_s: float | None) -> PageStats:
    counts = DecodeStats(forwards=forwards, new_tokens=new_tokens)
    return PageStats(page=counts, stop_reason="eos", dialect={}, seconds=StageSeconds(region_s, page_s, 0.1, baseline_s))


def test_the_speedup_is_plain_decoding_against_every_vlm_stage_and_an_estimate_without_baseline():
    pages = [_page(10, 40, 1.0, 2.0, 6.0), _page(5, 10, 0.0, 1.0, 3.0)]
    totals = DecodingTotals.of(pages)
    assert (totals.pages, totals.forwards, totals.new_tokens) == (2, 15, 50)
    assert totals.speedup.kind == "measured" and totals.speedup.value == round(9.0 / 4.0, 3), "regions count as spent"
    assert totals.as_json()["speedup"] == {"value": 2.25, "kind": "measured"} and totals.as_json()["tau"] == 3.333
    partial = DecodingTotals.of([*pages, _page(4, 8, 0.0, 1.0, None)])
    assert partial.baseline_page_s is None and partial.speedup.kind.startswith("estimate")
    assert partial.speedup.value == round(58 / 19, 3) and "baseline_page_s" not in partial.as_json()
    assert DecodingTotals.of([]) is None


def test_a_runs_totals_are_the_sum_of_its_documents():
    first, second = DecodingTotals.of([_page(10, 40, 1.0, 2.0, 6.0)]), DecodingTotals.of([_page(5, 10, 0.0, 1.0, 3.0)])
    assert first + second == DecodingTotals.of([_page(10, 40, 1.0, 2.0, 6.0), _page(5, 10, 0.0, 1.0, 3.0)])
    assert (first + DecodingTotals.of([_page(1, 1, 0.0, 1.0, None)])).baseline_page_s is None


def test_region_outputs_replace_their_blocks_pipeline_drafts_in_reading_order():
    def text_block(n: int, kind: BlockKind, text: str, html: str | None = None) -> Block:
        return Block(id=f"p1-b{n}", kind=kind, bbox=(0, 0, 9, 9), order=n, text=text, confidence=1.0, source="ocr", html=html)

    table = text_block(2, BlockKind.TABLE, "a | b", html="<table><tr><td>a</td><td>b</td></tr></table>")
    blocks = (text_block(1, BlockKind.TEXT, "Intro."), table, text_block(3, BlockKind.TEXT, "Outro."))
    settings = replace(settings_for("default"), table_format="either", front_matter="none")
    assert page_drafts(blocks, settings)[0] == "Intro." and len(page_drafts(blocks, settings)) == 4, "both table forms"
    assert page_drafts(blocks, settings, {"p1-b2": "<table>model</table>"}) == ["Intro.", "<table>model</table>", "Outro."]


def test_a_checkpoint_an_earlier_hsd_wrote_is_redone(tmp_path):
    from hsd_cli.pipeline import _load_checkpoint

    current = PageResult(page_no=1, size_pt=(1, 1), blocks=(), backend="pdf-text", stats=_page(1, 1, 0.0, 1.0, None))
    earlier = replace(current, stats={"page": {"forwards": 1}})  # stats were dicts before they were typed
    for name, page in (("current", current), ("earlier", earlier)):
        (tmp_path / name).write_bytes(pickle.dumps(page))
    assert _load_checkpoint(tmp_path / "current") == current
    assert _load_checkpoint(tmp_path / "earlier") is None
