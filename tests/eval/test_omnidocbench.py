"""OmniDocBench page scoring on a hand-made page record."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("apted", reason="needs apted (eval extra)")

from hsd_cli.eval import eval_app  # noqa: E402
from hsd_cli.eval.omnidocbench import markdown_text, score_text  # noqa: E402

TABLE_HTML = "<table><tr><th>k</th><th>v</th></tr><tr><td>x</td><td>1</td></tr></table>"


def _block(category: str, order: int | None, **fields) -> dict:
    return {"category_type": category, "order": order, "ignore": False, "poly": [0] * 8, **fields}


PAGE = {
    "page_info": {"image_path": "page_a.jpg", "width": 100, "height": 100, "page_no": 0},
    "layout_dets": [
        _block("header", None, text="Journal of Tests"),
        _block("title", 1, text="Alpha title"),
        _block("text_block", 2, text="Beta body text here."),
        _block("text_block", 3, text="Gamma closing words."),
        _block("table", 4, html=TABLE_HTML),
        _block("page_number", None, text="7"),
    ],
}


def test_markup_and_punctuation_do_not_count():
    assert markdown_text("# Alpha *title*\n\n![fig](a.png)\n\n$$x^2$$\n\n- Beta, body!") == "alphatitlebetabody"


def test_text_and_reading_order_scores():
    perfect = "Journal of Tests\n\n# Alpha title\n\nBeta body text here.\n\nGamma closing words.\n\n7"
    row = score_text(PAGE, perfect)
    assert row["text_edit"] == 0.0  # header and page number are cut out, as the benchmark ignores them
    assert row["reading_order_edit"] == 0.0
    swapped = "# Alpha title\n\nGamma closing words.\n\nBeta body text here."
    row = score_text(PAGE, swapped)
    assert row["reading_order_edit"] == pytest.approx(2 / 3)  # [0,1,2] vs [0,2,1]: two substitutions
    assert row["text_edit"] > 0.5
    assert score_text(PAGE, "")["text_edit"] == 1.0


def _hsd(path, markdown: str) -> None:
    path.write_text(json.dumps({"schema": "hsd.document", "pages": [{"page": 1, "markdown": markdown}]}))


def test_cli_scores_tables_and_reports_missing_pages(tmp_path):
    gt = tmp_path / "gt.json"
    other = {"page_info": {"image_path": "page_b.jpg"}, "layout_dets": [_block("text_block", 1, text="Only")]}
    gt.write_text(json.dumps([PAGE, other]))
    out = tmp_path / "out"
    out.mkdir()
    _hsd(out / "page_a.json", "# Alpha title\n\nBeta body text here.\n\nGamma closing words.\n\n| k | v |\n|---|---|\n| x | 2 |")
    result = CliRunner().invoke(eval_app, ["omnidocbench", str(out), "--gt", str(gt), "--json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    page_a, page_b = report["pages"]
    assert page_a["table_teds"] == pytest.approx(1 - 1 / 7)  # one cell of seven nodes differs
    assert page_a["table_teds_struct"] == 1.0
    assert page_a["text_edit"] == 0.0
    assert report["missing_outputs"] == ["page_b.jpg"] and page_b["text_edit"] == 1.0
    assert report["overall"]["text_edit"] == pytest.approx(0.5)

    bad = CliRunner().invoke(eval_app, ["omnidocbench", str(out), "--gt", str(tmp_path / "none.json")])
    assert bad.exit_code == 2 and bad.stderr.startswith("error:")
