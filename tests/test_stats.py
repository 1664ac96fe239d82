"""The VLM stages' typed statistics: one speedup definition for pages, documents and runs; region
outputs as the page stage's drafts; checkpoints from an earlier hsd redone, not misread."""

import pickle
from dataclasses import replace

from hsd_cli.decoding import DecodeResult
from hsd_cli.decoding.stats import DecodeStats
from hsd_cli.models.family_settings import settings_for
from hsd_cli.records.page import Page, Reading
from hsd_cli.records.kinds import Block, BlockKind
from hsd_cli.stages.dialect import page_drafts
from hsd_cli.records.totals import DecodingTotals


def _reading(forwards: int, new_tokens: int, region_s: float, page_s: float, baseline_s: float | None) -> Reading:
    result = DecodeResult(tokens=[], stats=DecodeStats(forwards=forwards, new_tokens=new_tokens), stop_reason="eos")
    return Reading(result, None, "", {}, region_s=region_s, page_s=page_s, baseline_page_s=baseline_s)


def _totals(*readings: Reading) -> DecodingTotals | None:
    return DecodingTotals.total(reading.totals for reading in readings)


def test_the_speedup_is_plain_decoding_against_every_vlm_stage_and_an_estimate_without_baseline():
    pages = [_reading(10, 40, 1.0, 2.0, 6.0), _reading(5, 10, 0.0, 1.0, 3.0)]
    totals = _totals(*pages)
    assert (totals.pages, totals.forwards, totals.new_tokens) == (2, 15, 50)
    assert totals.speedup.kind == "measured" and totals.speedup.value == round(9.0 / 4.0, 3), "regions count as spent"
    assert totals.as_json()["speedup"] == {"value": 2.25, "kind": "measured"} and totals.as_json()["tau"] == 3.333
    partial = _totals(*pages, _reading(4, 8, 0.0, 1.0, None))
    assert partial.baseline_page_s is None and partial.speedup.kind.startswith("estimate")
    assert partial.speedup.value == round(58 / 19, 3) and "baseline_page_s" not in partial.as_json()
    assert _totals() is None


def test_a_runs_totals_are_the_sum_of_its_documents():
    first, second = _totals(_reading(10, 40, 1.0, 2.0, 6.0)), _totals(_reading(5, 10, 0.0, 1.0, 3.0))
    assert first + second == _totals(_reading(10, 40, 1.0, 2.0, 6.0), _reading(5, 10, 0.0, 1.0, 3.0))
    assert (first + _totals(_reading(1, 1, 0.0, 1.0, None))).baseline_page_s is None


def test_region_outputs_replace_their_blocks_pipeline_drafts_in_reading_order():
    def text_block(n: int, kind: BlockKind, text: str, html: str | None = None) -> Block:
        return Block(id=f"p1-b{n}", kind=kind, bbox=(0, 0, 9, 9), order=n, text=text, confidence=1.0, source="ocr", html=html)

    table = text_block(2, BlockKind.TABLE, "a | b", html="<table><tr><td>a</td><td>b</td></tr></table>")
    blocks = (text_block(1, BlockKind.TEXT, "Intro."), table, text_block(3, BlockKind.TEXT, "Outro."))
    settings = replace(settings_for("default"), table_format="either", front_matter="none")
    assert page_drafts(blocks, settings)[0] == "Intro." and len(page_drafts(blocks, settings)) == 7, "every table form"
    assert page_drafts(blocks, settings, {"p1-b2": "<table>model</table>"}) == ["Intro.", "<table>model</table>", "Outro."]


def test_a_checkpoint_an_earlier_hsd_wrote_is_redone(tmp_path):
    from hsd_cli.document.checkpoints import load_checkpoint as _load_checkpoint

    current = Page(page_no=1, size_pt=(1, 1), backend="pdf-text", reading=_reading(1, 1, 0.0, 1.0, None))
    earlier = replace(current, reading={"page": {"forwards": 1}})  # an earlier hsd's record of the reading
    for name, page in (("current", current), ("earlier", earlier)):
        (tmp_path / name).write_bytes(pickle.dumps(page))
    before_rereads = _reading(1, 1, 0.0, 1.0, None)
    object.__delattr__(before_rereads, "earlier")  # a Reading of an hsd that counted rotation re-reads only
    (tmp_path / "before-rereads").write_bytes(pickle.dumps(replace(current, reading=before_rereads)))
    assert _load_checkpoint(tmp_path / "current") == current
    assert _load_checkpoint(tmp_path / "earlier") is None
    assert _load_checkpoint(tmp_path / "before-rereads") is None, "its re-reads' steps are unknown"
