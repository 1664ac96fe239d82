"""`--convert`: the converter runs into OUTDIR, then the same scorers read what it wrote."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hsd_cli.eval import eval_app
from tests import fixtures

ICDAR_STR = """<?xml version="1.0" encoding="UTF-8"?>
<document filename="report-str.xml"><table id="1"><region id="1" page="2">
{cells}
</region></table></document>
"""


def _icdar_cells(rows) -> str:
    return "\n".join(
        f'<cell id="{r}{c}" start-row="{r}" start-col="{c}"><bounding-box x1="0" x2="1" y1="0" y2="1"/>'
        f"<content>{text}</content></cell>"
        for r, row in enumerate(rows)
        for c, text in enumerate(row)
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    fixtures.born_digital_pdf(root / "report.pdf")
    rows = [fixtures.TABLE_HEADER, *fixtures.TABLE_ROWS]
    (root / "report-str.xml").write_text(ICDAR_STR.format(cells=_icdar_cells(rows)), encoding="utf-8")
    tests = [
        {"pdf": "report.pdf", "page": 1, "id": "title", "type": "present", "text": fixtures.TITLE},
        {"pdf": "report.pdf", "page": 2, "id": "cell", "type": "table", "cell": "14.1", "left": "5", "up": "12.5"},
        {"pdf": "report.pdf", "page": 2, "id": "nonsense", "type": "present", "text": "Purple elephants"},
    ]
    (root / "tests.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tests), encoding="utf-8")
    return root


def test_convert_then_olmocr_bench_and_tables(corpus, tmp_path):
    pytest.importorskip("olmocr.bench.tests", reason="needs the eval extra (olmocr and its scorer deps)")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        eval_app,
        ["olmocr-bench", str(out), "--tests", str(corpus / "tests.jsonl"), "--convert", "--inputs", str(corpus),
         "--stages", "draft", "--draft", "pdf-text", "--math-render", "off", "--json"],
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["convert"]["draft"] == "pdf-text" and report["convert"]["exit_code"] == 0
    assert {t["id"]: t["passed"] for t in report["tests"]} == {
        "title": True,
        "cell": True,
        "nonsense": False,
        "report.pdf_baseline": True,
    }
    assert report["overall"]["score"] == pytest.approx((2 / 3 + 1) / 2)

    tables = CliRunner().invoke(eval_app, ["tables", str(out), "--icdar", str(corpus), "--json"])
    assert tables.exit_code == 0, tables.stderr
    [document] = json.loads(tables.stdout)["documents"]
    assert document["document"] == "report" and document["variant"] == "report-str.xml"
    assert document["recall"] == 1.0 and document["precision"] == 1.0


def test_inputs_without_convert_is_a_usage_error(corpus, tmp_path):
    result = CliRunner().invoke(
        eval_app, ["tables", str(tmp_path), "--icdar", str(corpus), "--inputs", str(corpus)]
    )
    assert result.exit_code == 2 and "--inputs is only used with --convert" in result.stderr
