"""A path the user named that does not exist is a failed input, not a warning to scroll past."""

import json
from pathlib import Path

from typer.testing import CliRunner

from hsd_cli.cli import app
from tests.conftest import run_hsd


def _manifest(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / ".hsd" / "manifest.jsonl").read_text().splitlines()]


def test_a_misspelled_file_next_to_a_good_one_fails_the_run(docs_dir, tmp_path):
    typo = tmp_path / "reprot.pdf"
    out = tmp_path / "out"
    named = (docs_dir / "report.pdf", typo, tmp_path / "nothing-*.pdf")
    result = run_hsd("convert", *named, "-o", out, "--json", "--pages", "1")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert summary["counts"]["missing"] == 1 and summary["counts"]["ok"] == 1
    documents = {Path(d["input"]).name: d for d in summary["documents"]}
    assert documents["reprot.pdf"]["status"] == "missing"
    assert documents["reprot.pdf"]["error"] == "no such file or directory"
    assert documents["report.pdf"]["status"] == "ok" and (out / "report.md").is_file()
    records = {Path(r["input"]).name: r for r in _manifest(out)}
    assert records["reprot.pdf"]["status"] == "missing" and records["reprot.pdf"]["outputs"] == {}
    lines = [line for line in result.stderr.splitlines() if "reprot.pdf" in line]
    assert len(lines) == 1 and lines[0].startswith("missing"), result.stderr
    # A glob that matches nothing stays a warning.
    assert "no document matched" in result.stderr and "nothing-*.pdf" in result.stderr


def test_a_missing_files_from_entry_is_a_failed_input(docs_dir, tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text(f"{docs_dir / 'report.pdf'}\n{tmp_path / 'gone.pdf'}\n")
    result = CliRunner().invoke(
        app, ["convert", "--files-from", "-", "-o", str(tmp_path / "out"), "--json", "--pages", "1"],
        input=listing.read_text(),
    )
    assert result.exit_code == 1
    statuses = {Path(d["input"]).name: d["status"] for d in json.loads(result.stdout)["documents"]}
    assert statuses == {"gone.pdf": "missing", "report.pdf": "ok"}


def test_only_missing_inputs_is_a_failure_listed_in_the_summary(tmp_path):
    """Exit 1, not 3: the user named a file and must see it failed; 3 is for patterns that match nothing."""
    out = tmp_path / "out"
    result = run_hsd("convert", tmp_path / "a.pdf", tmp_path / "b-dir", "-o", out, "--json")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    listed = [(Path(d["input"]).name, d["status"]) for d in summary["documents"]]
    assert listed == [("a.pdf", "missing"), ("b-dir", "missing")]
    assert summary["counts"]["missing"] == 2 and summary["exit_code"] == 1
    assert {r["status"] for r in _manifest(out)} == {"missing"}


def test_a_missing_file_found_later_is_converted(docs_dir, tmp_path):
    late = tmp_path / "late.pdf"
    out = tmp_path / "out"
    assert run_hsd("convert", late, "-o", out, "--pages", "1").exit_code == 1
    late.write_bytes((docs_dir / "report.pdf").read_bytes())
    again = run_hsd("convert", late, "-o", out, "--pages", "1", "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["documents"][0]["status"] == "ok"
