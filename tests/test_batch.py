"""Batch guarantees: manifest and resume, timeouts that fire, kill -9 recovery, locks, shards, config."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hsd_cli.output.manifest import OutputLock
from tests import fixtures
from tests.conftest import run_hsd


def _manifest(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / ".hsd" / "manifest.jsonl").read_text().splitlines()]


def _statuses(result) -> dict[str, str]:
    return {Path(d["input"]).name: d["status"] for d in json.loads(result.stdout)["documents"]}


@pytest.fixture
def corpus(tmp_path, docs_dir) -> Path:
    """Several small born-digital documents (copies with distinct content)."""
    root = tmp_path / "corpus"
    root.mkdir()
    data = (docs_dir / "report.pdf").read_bytes()
    for n in range(4):
        (root / f"doc{n}.pdf").write_bytes(data + f"\n% copy {n}\n".encode())
    return root


def test_resume_skips_done_documents_and_redoes_changed_ones(corpus, tmp_path):
    out = tmp_path / "out"
    first = run_hsd("convert", corpus, "-o", out, "--json", "--pages", "1")
    assert first.exit_code == 0 and set(_statuses(first).values()) == {"ok"}
    before = {p: p.stat().st_mtime_ns for p in out.glob("*.json")}

    again = run_hsd("convert", corpus, "-o", out, "--json", "--pages", "1")
    assert again.exit_code == 0 and set(_statuses(again).values()) == {"skipped"}
    assert before == {p: p.stat().st_mtime_ns for p in out.glob("*.json")}

    (corpus / "doc1.pdf").write_bytes((corpus / "doc1.pdf").read_bytes() + b"% edited\n")
    changed = run_hsd("convert", corpus, "-o", out, "--json", "--pages", "1")
    assert _statuses(changed) == {"doc0.pdf": "skipped", "doc1.pdf": "ok", "doc2.pdf": "skipped", "doc3.pdf": "skipped"}

    other_config = run_hsd("convert", corpus, "-o", out, "--json", "--pages", "1", "--dpi", "100")
    assert set(_statuses(other_config).values()) == {"ok"}
    forced = run_hsd("convert", corpus / "doc0.pdf", "-o", out, "--json", "--pages", "1", "--dpi", "100", "--overwrite")
    assert _statuses(forced) == {"doc0.pdf": "ok"}

    records = _manifest(out)
    assert len(records) == 4 + 1 + 4 + 1  # one per attempt; resume skips are not attempts
    assert {"sha256", "config_hash", "hsd_version", "status", "outputs", "timings"} <= set(records[0])


def test_failed_documents_wait_for_retry_failed(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "bad.pdf").write_text("not a pdf")
    out = tmp_path / "out"
    assert run_hsd("convert", src, "-o", out).exit_code == 1
    second = run_hsd("convert", src, "-o", out, "--json")
    assert second.exit_code == 1 and _statuses(second) == {"bad.pdf": "corrupt"}, "still a failure, not retried"
    assert len(_manifest(out)) == 1
    retried = run_hsd("convert", src, "-o", out, "--json", "--retry-failed")
    assert _statuses(retried) == {"bad.pdf": "corrupt"} and retried.exit_code == 1
    assert len(_manifest(out)) == 2


@pytest.mark.slow
def test_a_hanging_page_times_out_and_the_run_ends(docs_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HSD_DEBUG_STALL", "report.pdf:2")
    started = time.monotonic()
    strict = run_hsd("convert", docs_dir, "-o", tmp_path / "a", "--json", "--page-timeout", "30")
    assert time.monotonic() - started < 120
    assert strict.exit_code == 1
    summary = json.loads(strict.stdout)
    report = next(d for d in summary["documents"] if d["input"].endswith("report.pdf"))
    assert report["status"] == "timeout" and report["failed_pages"] == {"2": "timeout"}
    assert _statuses(strict)["scan.pdf"] == "ok"  # the next document still ran

    lenient = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path / "b", "--json",
        "--page-timeout", "10", "--max-page-error-rate", "0.5",
    )
    assert lenient.exit_code == 0 and _statuses(lenient) == {"report.pdf": "degraded"}
    document = json.loads((tmp_path / "b" / "report.json").read_text())
    assert document["pages"][1]["flags"] == ["failed", "timeout"]
    assert document["pages"][0]["blocks"], "the page before the hang is kept"
    line = "failed (the page ran past --page-timeout and its worker was stopped); the page is left empty"
    assert document["pages"][1]["notice"] == line and f"report.pdf: page 2: {line}" in lenient.stderr


def test_document_timeout_fires(docs_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HSD_DEBUG_STALL", "report.pdf:1")
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path, "--json", "--doc-timeout", "4")
    assert result.exit_code == 1 and _statuses(result) == {"report.pdf": "timeout"}
    assert not (tmp_path / "report.md").exists()


@pytest.mark.slow
def test_a_worker_that_dies_on_a_page_is_replaced_and_the_page_lost_only_the_second_time(docs_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HSD_DEBUG_CRASH", "report.pdf:2")
    events = tmp_path / "events.ndjson"
    result = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--json", "--events", events,
        "--max-page-error-rate", "0.5",
    )
    assert result.exit_code == 0 and _statuses(result) == {"report.pdf": "degraded"}
    deaths = [json.loads(line) for line in events.read_text().splitlines()]
    deaths = [(e["event"], e["page"]) for e in deaths if e["event"] in ("worker_lost", "page_lost")]
    assert deaths == [("worker_lost", 2), ("page_lost", 2)], "tried once more, then given up"
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    assert document["pages"][1]["flags"] == ["failed", "crash"]
    assert document["pages"][0]["blocks"], "the page before the crash is kept"
    assert "report.pdf: page 2: failed (the worker died on this page twice); the page is left empty" in result.stderr


def test_a_page_whose_draft_raises_fails_with_its_exception_in_the_json_the_manifest_and_stderr(docs_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HSD_DEBUG_RAISE", "report.pdf:2")
    line = "failed (the draft stage raised RuntimeError: HSD_DEBUG_RAISE on the draft stage); the page is left empty"
    lenient = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "a", "--max-page-error-rate", "0.5", "--debug")
    assert lenient.exit_code == 0, lenient.stderr
    page = json.loads((tmp_path / "a" / "report.json").read_text())["pages"][1]
    assert page["flags"] == ["failed", "error"] and page["notice"] == line
    assert f"report.pdf: page 2: {line}" in lenient.stderr
    assert "Traceback" in lenient.stderr and "debug_fault" in lenient.stderr, "--debug shows where it raised"
    assert f"page 2: {line}" in _manifest(tmp_path / "a")[-1]["warnings"]
    # Above --max-page-error-rate the document fails, and still says why.
    strict = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "b", "--json")
    assert strict.exit_code == 1 and "RuntimeError: HSD_DEBUG_RAISE" in json.loads(strict.stdout)["documents"][0]["error"]
    assert "Traceback" not in strict.stderr and f"report.pdf: page 2: {line}" in strict.stderr
    record = _manifest(tmp_path / "b")[-1]
    assert record["status"] == "failed" and "RuntimeError: HSD_DEBUG_RAISE" in record["error"]


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_loses_and_duplicates_nothing(corpus, tmp_path):
    for n in range(4, 8):
        (corpus / f"doc{n}.pdf").write_bytes((corpus / "doc0.pdf").read_bytes() + f"% {n}\n".encode())
    out = tmp_path / "out"
    command = [sys.executable, "-m", "hsd_cli.cli", "convert", str(corpus), "-o", str(out), "-q"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest = out / ".hsd" / "manifest.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if manifest.exists() and len(manifest.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {r["key"] for r in _manifest(out)}
    assert 3 <= len(done_before) < 8, "the kill must land half way"

    events = tmp_path / "events.ndjson"
    rerun = run_hsd("convert", corpus, "-o", out, "--json", "--events", events)
    assert rerun.exit_code == 0
    started = {Path(json.loads(line)["input"]).stem for line in events.read_text().splitlines()
               if json.loads(line)["event"] == "doc_started"}
    assert started.isdisjoint(done_before), "finished documents are not recomputed"
    assert started | done_before == {f"doc{n}" for n in range(8)}
    assert sorted(p.name for p in out.glob("*.md")) == [f"doc{n}.md" for n in range(8)]
    assert not list(out.rglob("*.tmp"))
    ok = [r for r in _manifest(out) if r["status"] == "ok"]
    assert sorted(r["key"] for r in ok) == [f"doc{n}" for n in range(8)]


def _pages_in_the_model(events: Path) -> tuple[int, set[tuple[str, int]]]:
    """From an --events file: the pages drafted and not yet done (rows in the model), and the pages done."""
    drafted, done = set(), set()
    for line in events.read_text().splitlines() if events.exists() else []:
        if not line.endswith("}"):
            continue  # the line being written
        event = json.loads(line)
        page = (Path(event.get("input", "")).stem, event.get("page"))
        drafted |= {page} if event["event"] == "page_drafted" else set()
        done |= {page} if event["event"] == "page_done" else set()
    return len(drafted - done), done


def _rows_run(corpus: Path, model: Path, out: Path, events: Path) -> list[str]:
    # Drafts made ahead (--draft-workers) keep every document's next page ready, so the model holds 8
    # rows for most of a pass instead of 7 while a page drafts.
    return [
        sys.executable, "-m", "hsd_cli.cli", "convert", str(corpus), "-o", str(out), "-q", "--model", str(model),
        "--dtype", "float32", "--max-rows", "8", "--max-new-tokens", "96", "--draft", "pdf-text",
        "--draft-workers", "1", "--events", str(events),
    ]


@pytest.mark.slow
def test_sigkill_with_8_rows_in_the_model_then_rerun_reads_every_page_once_to_the_same_bytes(tiny_model, docs_dir, tmp_path):
    """kill -9 of the run (parent and worker) while 8 pages are in the model and every document has a
    page done, then the same command: no page finished before the kill is read again (its checkpoint
    stands), every page is read to the end once, and the files are the bytes of a run not interrupted."""
    (tmp_path / "corpus").mkdir()
    corpus = fixtures.distinct_copies(docs_dir / "report.pdf", tmp_path / "corpus", 8)  # 8 documents of 2 pages
    whole = subprocess.run(_rows_run(corpus, tiny_model, tmp_path / "whole", tmp_path / "whole.events"), capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    pages = {(f"doc{n}", page) for n in range(8) for page in (1, 2)}

    out, before = tmp_path / "out", tmp_path / "before.events"
    proc = subprocess.Popen(_rows_run(corpus, tiny_model, out, before), start_new_session=True, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        in_model, done = _pages_in_the_model(before)
        if in_model >= 8 and len(done) >= 8:  # every first page done, every second one in the model
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    in_model, done_before = _pages_in_the_model(before)
    assert in_model == 8 and len(done_before) == 8, "the kill must land with 8 rows in the model"
    assert not (out / ".hsd" / "manifest.jsonl").exists() or not _manifest(out), "no document finished before the kill"

    after = tmp_path / "after.events"
    rerun = subprocess.run(_rows_run(corpus, tiny_model, out, after), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    _, done_after = _pages_in_the_model(after)
    assert done_before.isdisjoint(done_after), "a page done before the kill was read again"
    assert done_before | done_after == pages
    written = sorted(path.relative_to(out) for path in out.rglob("*") if path.is_file() and ".hsd" not in path.parts)
    assert written == sorted(path.relative_to(tmp_path / "whole") for path in (tmp_path / "whole").rglob("*")
                             if path.is_file() and ".hsd" not in path.parts)
    assert all((out / path).read_bytes() == (tmp_path / "whole" / path).read_bytes() for path in written)
    assert sorted(r["key"] for r in _manifest(out) if r["status"] == "ok") == [f"doc{n}" for n in range(8)]


def test_a_second_run_on_the_same_output_is_refused(docs_dir, tmp_path):
    with OutputLock(tmp_path):
        result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path)
    assert result.exit_code == 4 and "another hsd run" in result.stderr


def test_shards_partition_the_inputs(corpus, tmp_path):
    seen = []
    for index in (1, 2):
        result = run_hsd("convert", corpus, "-o", tmp_path / "out", "--json", "--pages", "1", "--shard", f"{index}/2")
        assert result.exit_code == 0
        seen.append(set(_statuses(result)))
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == {f"doc{n}.pdf" for n in range(4)}
    assert run_hsd("convert", corpus, "-o", tmp_path, "--shard", "3/2").exit_code == 2


def test_files_from_reads_lists_and_nul_separated_stdin(corpus, tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text(f"{corpus / 'doc0.pdf'}\n{corpus / 'doc2.pdf'}\n")
    result = run_hsd("convert", "--files-from", listing, "-o", tmp_path / "a", "--json", "--pages", "1")
    assert set(_statuses(result)) == {"doc0.pdf", "doc2.pdf"}
    from typer.testing import CliRunner

    from hsd_cli.cli import app

    stdin = f"{corpus / 'doc1.pdf'}\0{corpus / 'doc3.pdf'}\0"
    piped = CliRunner().invoke(
        app, ["convert", "--files-from", "-", "-0", "-o", str(tmp_path / "b"), "--json", "--pages", "1"], input=stdin
    )
    assert set(_statuses(piped)) == {"doc1.pdf", "doc3.pdf"}


def test_stale_temp_files_are_removed_at_start(docs_dir, tmp_path):
    stale = tmp_path / ".report.md.abc123.tmp"
    stale.write_text("half written")
    assert run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path, "-q").exit_code == 0
    assert not stale.exists()


def test_config_file_env_and_flags_in_that_order(docs_dir, tmp_path, monkeypatch):
    config = tmp_path / "hsd.toml"
    config.write_text('[convert]\ndpi = 110\npages = "1"\nmax-pixels = 500000\n')
    monkeypatch.setenv("HSD_PAGES", "2")
    result = run_hsd(
        "config", "show", "--config", config, "--max-pixels", "600000", "-o", tmp_path
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert f"dpi = 110  # config {config}" in lines
    assert 'pages = "2"  # env HSD_PAGES' in lines
    assert "max-pixels = 600000  # command line" in lines
    assert 'draft = "auto"  # default' in lines

    converted = run_hsd("convert", docs_dir / "report.pdf", "--config", config, "-o", tmp_path / "o", "--json")
    assert converted.exit_code == 0, converted.stderr
    document = json.loads((tmp_path / "o" / "report.json").read_text())
    assert [p["page"] for p in document["pages"]] == [2] and document["config"]["dpi"] == 110

    config.write_text("[convert]\nno_such_option = 1\n")
    bad = run_hsd("convert", docs_dir / "report.pdf", "--config", config, "-o", tmp_path / "p")
    assert bad.exit_code == 2 and "no_such_option" in bad.stderr
