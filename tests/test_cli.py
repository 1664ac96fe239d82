"""`hsd convert` as scripts use it: outputs, stdout/stderr split, statuses and exit codes."""

import json
import os
import subprocess
import sys

import pytest

from tests import fixtures
from tests.conftest import run_hsd


@pytest.fixture
def bad_batch(tmp_path, docs_dir):
    """Good PDFs next to every kind of bad input the converter must survive."""
    batch = tmp_path / "batch"
    batch.mkdir()
    good = batch / "good.pdf"
    good.write_bytes((docs_dir / "report.pdf").read_bytes())
    fixtures.truncated_pdf(good, batch / "truncated.pdf")
    fixtures.encrypted_pdf(good, batch / "locked.pdf", "s3cret")
    (batch / "notes.pdf").write_text("this is a text file with a .pdf name\n")
    (batch / "zero.pdf").write_bytes(b"")
    fixtures.pageless_pdf(batch / "empty.pdf")
    (batch / "sub").mkdir()
    (batch / "sub" / "good2.pdf").write_bytes(good.read_bytes())
    return batch


def _by_name(summary):
    return {os.path.basename(d["input"]): d for d in summary["documents"]}


def test_bad_inputs_get_statuses_and_the_batch_goes_on(bad_batch, tmp_path):
    out = tmp_path / "out"
    result = run_hsd("convert", bad_batch, "-o", out, "--json", "--pages", "1")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    statuses = {name: d["status"] for name, d in _by_name(summary).items()}
    assert statuses == {
        "empty.pdf": "corrupt",
        "good.pdf": "ok",
        "good2.pdf": "ok",
        "locked.pdf": "encrypted",
        "notes.pdf": "corrupt",
        "truncated.pdf": "corrupt",
        "zero.pdf": "corrupt",
    }
    assert summary["counts"]["ok"] == 2 and summary["counts"]["corrupt"] == 4
    assert (out / "good.md").is_file() and (out / "sub" / "good2.json").is_file()
    assert not (out / "truncated.md").exists() and not (out / "notes.json").exists()
    for name in ("empty.pdf", "locked.pdf", "notes.pdf", "truncated.pdf", "zero.pdf"):
        lines = [line for line in result.stderr.splitlines() if name in line]
        assert len(lines) == 1, f"one clear line for {name}: {lines}"
    assert "Traceback" not in result.stderr


def test_password_opens_encrypted_pdfs(bad_batch, tmp_path):
    result = run_hsd("convert", bad_batch / "locked.pdf", "-o", tmp_path, "--password", "s3cret", "--json")
    assert result.exit_code == 0
    assert _by_name(json.loads(result.stdout))["locked.pdf"]["status"] == "ok"
    wrong = run_hsd("convert", bad_batch / "locked.pdf", "-o", tmp_path / "other", "--password", "nope")
    assert wrong.exit_code == 1 and "password is wrong" in wrong.stderr


def test_no_input_matched_exits_3(tmp_path):
    result = run_hsd("convert", tmp_path / "nothing-*.pdf", "-o", tmp_path / "out", "--json")
    assert result.exit_code == 3
    assert json.loads(result.stdout)["documents"] == []


@pytest.mark.parametrize(
    "args",
    [["--dpi", "5"], ["--pages", "3-1"], ["--draft", "magic"], ["--draft-json", "."], ["--max-rows", "0"]],
)
def test_bad_options_exit_2(args, docs_dir, tmp_path):
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path, *args)
    assert result.exit_code == 2


def test_outputs_mirror_tree_with_page_markers_and_json_schema(converted):
    out = converted["out"]
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("<!-- page 1 -->") and "<!-- page 2 -->" in markdown
    document = json.loads((out / "report.json").read_text())
    assert (document["schema"], document["schema_version"]) == ("hsd.document", 2)
    assert len(document["source"]["sha256"]) == 64 and document["page_count"] == 2
    assert [p["page"] for p in document["pages"]] == [1, 2]
    assert "timings" not in document["pages"][0]  # wall-clock times live in the manifest
    assert document["pages"][1]["markdown"] in markdown
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_page_selection_converts_only_those_pages(docs_dir, tmp_path):
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path, "--pages", "2", "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads((tmp_path / "report.json").read_text())
    assert [p["page"] for p in document["pages"]] == [2]
    assert fixtures.TABLE_SECTION in (tmp_path / "report.md").read_text()
    assert fixtures.LEFT_COLUMN not in (tmp_path / "report.md").read_text()
    skipped = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "x", "--pages", "9", "--json")
    assert skipped.exit_code == 0 and json.loads(skipped.stdout)["counts"]["skipped"] == 1


def test_images_are_one_page_documents_and_figures_are_saved(tmp_path, docs_dir):
    import pymupdf

    page = pymupdf.open(docs_dir / "report.pdf")[0]
    png = tmp_path / "in" / "page.png"
    png.parent.mkdir()
    page.get_pixmap(dpi=150).save(png)
    doc = pymupdf.open()
    target = doc.new_page(width=595, height=842)
    target.insert_text((72, 72), "A page with a picture", fontsize=14)
    target.insert_image(pymupdf.Rect(72, 100, 400, 400), filename=png)
    doc.save(tmp_path / "in" / "figure.pdf")
    out = tmp_path / "out"
    result = run_hsd("convert", tmp_path / "in", "-o", out, "--draft", "pdf-text", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads((out / "page.json").read_text())["page_count"] == 1
    figure_md = (out / "figure.md").read_text()
    assert "](figure_images/" in figure_md
    (image_file,) = (out / "figure_images").iterdir()
    assert image_file.read_bytes().startswith(b"\x89PNG")
    none = run_hsd("convert", tmp_path / "in" / "figure.pdf", "-o", tmp_path / "n", "--images", "none")
    assert none.exit_code == 0 and "![" not in (tmp_path / "n" / "figure.md").read_text()
    assert not (tmp_path / "n" / "figure_images").exists()


@pytest.mark.slow
def test_outputs_are_byte_identical_across_runs(docs_dir, tmp_path):
    for run in ("a", "b"):
        assert run_hsd("convert", docs_dir, "-o", tmp_path / run, "-q").exit_code == 0
    for name in ("report.md", "report.json", "scan.md", "scan.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_real_process_keeps_stdout_for_json_only(docs_dir, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "hsd_cli.cli", "convert", str(docs_dir / "report.pdf"), "-o", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)  # exactly one JSON object, nothing else
    assert summary["exit_code"] == 0 and summary["pages"] == 2
    assert "no VLM configured" in proc.stderr and "\x1b[" not in proc.stderr
