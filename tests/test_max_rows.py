"""`--max-rows`: with a model, several documents in flight in one worker process, through the CLI.
The outputs are those of one document at a time, byte for byte, and every document is recorded
once; a page that stalls or kills the process costs its own document what it costs today, and
the other documents in flight nothing. The tiny random model reads a few tokens per page: the
runs measure the process structure, not the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_hsd
from tests.fixtures import distinct_copies, half_node_profile
from tests.test_batch import _manifest, _statuses


@pytest.fixture(scope="module")
def corpus(docs_dir, tmp_path_factory) -> Path:
    """Four two-page born-digital documents with distinct bytes."""
    return distinct_copies(docs_dir / "report.pdf", tmp_path_factory.mktemp("max-rows-corpus"), 4)


def _model_args(tiny_model: Path) -> list:
    return ["--model", tiny_model, "--stages", "page", "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32"]


def _outputs(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(out.glob("*.md")) + sorted(out.glob("*.json"))}


@pytest.mark.parametrize("with_model", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["draft", "tiny-model"])
def test_max_rows_changes_no_output_byte_and_records_every_document_once(with_model, corpus, tmp_path, request):
    extra = _model_args(request.getfixturevalue("tiny_model")) if with_model else []
    outputs = {}
    for rows in (1, 3):
        out = tmp_path / f"rows{rows}"
        result = run_hsd("convert", corpus, "-o", out, "--json", "--pages", "1", "--max-rows", rows, *extra)
        assert result.exit_code == 0, result.stderr
        assert set(_statuses(result).values()) == {"ok"}
        assert sorted(record["key"] for record in _manifest(out)) == [f"doc{n}" for n in range(4)]
        outputs[rows] = _outputs(out)
    assert len(outputs[1]) == 8 and outputs[3] == outputs[1]


@pytest.mark.slow
def test_a_stalled_page_and_a_crash_cost_only_their_own_documents(corpus, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HSD_DEBUG_STALL", "doc0.pdf:2")
    monkeypatch.setenv("HSD_DEBUG_CRASH", "doc1.pdf:2")
    events = tmp_path / "events.ndjson"
    out = tmp_path / "out"
    result = run_hsd(
        "convert", corpus, "-o", out, "--json", "--events", events, "--max-rows", "3", "--page-timeout", "15",
        *_model_args(tiny_model),
    )
    assert result.exit_code == 1, result.stderr
    documents = {Path(d["input"]).name: d for d in json.loads(result.stdout)["documents"]}
    assert (documents["doc0.pdf"]["status"], documents["doc0.pdf"]["failed_pages"]) == ("timeout", {"2": "timeout"})
    assert (documents["doc1.pdf"]["status"], documents["doc1.pdf"]["failed_pages"]) == ("failed", {"2": "crash"})
    for name in ("doc2.pdf", "doc3.pdf"):
        assert (documents[name]["status"], documents[name]["failed_pages"]) == ("ok", {}), name
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    lost = sorted((Path(e["input"]).name, e["page"], e["reason"]) for e in lines if e["event"] == "page_lost")
    assert lost == [("doc0.pdf", 2, "timeout"), ("doc1.pdf", 2, "crash")]
    assert sorted(record["key"] for record in _manifest(out)) == [f"doc{n}" for n in range(4)]
    kept = json.loads((out / "doc3.json").read_text())
    flags = [page["flags"] for page in kept["pages"]]
    assert flags == [["vlm", "truncated"]] * 2, "read by the model, not drafts standing in"


@pytest.mark.slow
def test_batch_sizing_changes_no_markdown_byte(corpus, tiny_model, tmp_path):
    profile = half_node_profile(tmp_path / "profile.json")
    markdown = {}
    for rows, sizing in ((1, "page"), (3, "batch")):
        out = tmp_path / f"{sizing}"
        result = run_hsd("convert", corpus, "-o", out, "--json", "--pages", "1", "--max-rows", rows, "--sizing", sizing,
                         "--profile", profile, *_model_args(tiny_model))
        assert result.exit_code == 0, result.stderr
        assert set(_statuses(result).values()) == {"ok"}
        markdown[sizing] = {path.name: path.read_bytes() for path in sorted(out.glob("*.md"))}
    assert len(markdown["page"]) == 4 and markdown["batch"] == markdown["page"]


def test_an_unknown_sizing_is_refused_in_one_line(corpus, tmp_path):
    result = run_hsd("convert", corpus, "-o", tmp_path / "out", "--sizing", "rows")
    assert result.exit_code == 2 and "--sizing" in result.stderr
