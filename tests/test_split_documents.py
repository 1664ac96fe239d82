"""A long document's pages in flight together: with a model and `--max-rows N`, a document splits
into up to N parts of consecutive pages (at least MIN_PART_PAGES each), converted as documents of
their own on the run's rows and written as one. The tiny random model reads a few tokens per page:
the runs measure the process structure, not the model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pymupdf
import pytest

from hsd_cli.config import MIN_PART_PAGES, document_parts
from tests.conftest import run_hsd
from tests.test_batch import _manifest

PAGES = 12  # two parts at --max-rows 3: pages 1-8 and 9-12


def test_parts_are_runs_of_consecutive_pages_of_at_least_the_minimum():
    assert MIN_PART_PAGES == 8
    assert document_parts(list(range(20)), 3) == [list(range(8)), list(range(8, 16)), list(range(16, 20))]
    assert document_parts(list(range(40)), 4) == [list(range(n, n + 10)) for n in range(0, 40, 10)]
    assert document_parts([2, 4, 6], 8) == [[2, 4, 6]], "a short document does not split"
    assert document_parts(list(range(12)), 1) == [list(range(12))]


@pytest.fixture(scope="module")
def long_pdf(docs_dir, tmp_path_factory) -> Path:
    """A born-digital document of PAGES pages (the two-page report, repeated)."""
    path = tmp_path_factory.mktemp("split") / "long.pdf"
    with pymupdf.open(docs_dir / "report.pdf") as report, pymupdf.open() as long:
        for _ in range(PAGES // report.page_count):
            long.insert_pdf(report)
        long.save(path)
    return path


def _model_args(tiny_model: Path) -> list:
    return ["--model", tiny_model, "--stages", "page", "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32"]


def _events(path: Path) -> list[dict]:
    """The events written whole (a killed run may leave its last line cut)."""
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]]


def _page_markdown(out: Path) -> list[str]:
    return [page["markdown"] for page in json.loads((out / "long.json").read_text())["pages"]]


@pytest.mark.slow
def test_a_split_document_writes_every_page_once_as_one_document(long_pdf, tiny_model, tmp_path):
    runs = {}
    for rows in (1, 3):
        out = tmp_path / f"rows{rows}"
        events = tmp_path / f"events{rows}.ndjson"
        result = run_hsd("convert", long_pdf, "-o", out, "--json", "--events", events, "--max-rows", rows, *_model_args(tiny_model))
        assert result.exit_code == 0, result.stderr
        assert [d["status"] for d in json.loads(result.stdout)["documents"]] == ["ok"]
        assert [record["key"] for record in _manifest(out)] == ["long"]
        runs[rows] = (out, _events(events))
    (one_out, _), (split_out, split_events) = runs[1], runs[3]
    assert (split_out / "long.md").read_bytes() == (one_out / "long.md").read_bytes()
    assert _page_markdown(split_out) == _page_markdown(one_out)
    done = [e["page"] for e in split_events if e["event"] == "page_done"]
    assert sorted(done) == list(range(1, PAGES + 1)), "every page converted once"
    order = [(e["event"], e.get("page")) for e in split_events]
    assert order.index(("page_started", 9)) < order.index(("page_done", 8)), "the second part ran beside the first"
    assert [e["event"] for e in split_events].count("doc_started") == 1
    pages = json.loads((split_out / "long.json").read_text())["pages"]
    assert [page["page"] for page in pages] == list(range(1, PAGES + 1))
    assert all(page["flags"] == ["vlm", "truncated"] for page in pages), "read by the model, not drafts standing in"


@pytest.mark.slow
def test_a_stalled_page_in_a_later_part_costs_its_document_that_page_only(long_pdf, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HSD_DEBUG_STALL", "long.pdf:10")
    out = tmp_path / "out"
    events = tmp_path / "events.ndjson"
    result = run_hsd(
        "convert", long_pdf, "-o", out, "--json", "--events", events, "--max-rows", "3", "--page-timeout", "15",
        *_model_args(tiny_model),
    )
    assert result.exit_code == 0, result.stderr
    [document] = json.loads(result.stdout)["documents"]
    assert (document["status"], document["failed_pages"]) == ("degraded", {"10": "timeout"})
    lost = [(e["page"], e["reason"]) for e in _events(events) if e["event"] == "page_lost"]
    assert lost == [(10, "timeout")]
    pages = json.loads((out / "long.json").read_text())["pages"]
    assert [page["page"] for page in pages] == list(range(1, PAGES + 1))
    assert [n for n, page in enumerate(pages, 1) if page["flags"] != ["vlm", "truncated"]] == [10]


@pytest.mark.slow
def test_kill_9_of_a_split_document_then_the_same_command_gives_the_same_bytes(long_pdf, tiny_model, tmp_path):
    def command(out: Path, events: Path) -> list[str]:
        return [sys.executable, "-m", "hsd_cli.cli", "convert", str(long_pdf), "-o", str(out), "-q", "--events", str(events),
                "--max-rows", "3", *map(str, _model_args(tiny_model))]

    whole = tmp_path / "whole"
    subprocess.run(command(whole, tmp_path / "whole.ndjson"), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp_path / "out"
    events = tmp_path / "killed.ndjson"
    proc = subprocess.Popen(command(out, events), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        done = [e for e in _events(events) if e["event"] == "page_done"] if events.exists() else []
        if len({e["page"] > MIN_PART_PAGES for e in done}) == 2:  # a page of each part checkpointed
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_done = {e["page"] for e in _events(events) if e["event"] == "page_done"}
    assert 2 <= len(killed_done) < PAGES, "the kill must land half way"
    resumed = tmp_path / "resumed.ndjson"
    subprocess.run(command(out, resumed), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    redone = {e["page"] for e in _events(resumed) if e["event"] == "page_done"}
    assert redone.isdisjoint(killed_done) and redone | killed_done == set(range(1, PAGES + 1)), "every page once"
    for name in ("long.md", "long.json"):
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name
    assert [record["status"] for record in _manifest(out)] == ["ok"]
