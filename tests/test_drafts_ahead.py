"""`--draft-workers`: pages rendered and drafted in draft processes beside the worker, ahead of the
page the model reads, where a process is free. The outputs are those of drafting in the worker,
byte for byte; a draft that hangs or kills its process costs its page what it costs when the
worker drafts, and leaves no process behind."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import replace
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pymupdf
import pytest

from hsd_cli.config import ConvertConfig, Executor, ModelConfig, RunConfig
from hsd_cli.records.page import Page
from hsd_cli.document.drafting import DraftsAhead
from hsd_cli.document import draft_processes
from hsd_cli.document.draft_processes import (
    DRAFT_PROCESS_BYTES,
    DraftProcesses,
    MAX_DEFAULT_DRAFT_PROCESSES,
    default_draft_processes,
    threads_per_process,
)
from hsd_cli.batch.resolve import drafting_processes
from tests.conftest import run_hsd
from tests.fixtures import resolved
from tests.test_batch import _manifest


class _Processes:
    """Draft processes that are free `free` times, whose work the test finishes by hand."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.sent: dict[int, Future] = {}

    def try_submit(self, work, doc, config, index) -> Future | None:
        if self.free == 0:
            return None
        self.free -= 1
        self.sent[index] = Future()
        return self.sent[index]


def _drafts(processes: _Processes, indices: list[int], ahead: int) -> DraftsAhead:
    return DraftsAhead(processes, None, None, indices, ahead)


def _page(index: int) -> Page:
    return Page(page_no=index + 1, size_pt=(612.0, 792.0))


def test_the_next_pages_are_sent_before_the_page_that_takes_its_draft_waits():
    processes = _Processes(free=10)
    drafts = _drafts(processes, [3, 4, 5, 6, 7], ahead=2)
    assert list(processes.sent) == [3, 4], "two pages drafting from the start"
    processes.sent[3].set_result(_page(3))
    taken = drafts.take(3)
    assert taken.page_no == 4 and "draft_wait_s" in taken.timings
    assert list(processes.sent) == [3, 4, 5], "page 5 sent when page 3 was taken, before page 4 is"
    processes.sent[4].set_exception(RuntimeError("the draft raised"))
    with pytest.raises(RuntimeError):
        drafts.take(4)
    assert drafts.take(4) is None, "the retry drafts it where it is needed"
    processes.sent[5].set_exception(BrokenProcessPool("a draft process died"))
    assert drafts.take(5) is None, "a draft process that died leaves the page to its taker"


def test_a_page_is_sent_only_where_a_process_is_free_and_else_drafted_where_needed():
    processes = _Processes(free=1)
    drafts = _drafts(processes, [0, 1, 2, 3], ahead=3)
    assert list(processes.sent) == [0]
    processes.sent[0].set_result(_page(0))
    assert drafts.take(0).page_no == 1
    assert drafts.take(1) is None, "no process was free: drafted by its taker"
    processes.free = 1
    assert drafts.take(2) is None
    assert list(processes.sent) == [0, 3], "page 3 sent once a process was free; pages already taken never are"


def test_by_default_a_model_on_a_gpu_gets_every_cpu_but_one_that_memory_holds_and_one_on_the_cpu_none(monkeypatch):
    on_gpu = ModelConfig("m", "qwen2_5_vl", "cuda", "bfloat16", False, 64, False, None)
    on_cpu = replace(on_gpu, device="cpu", dtype="float32")
    monkeypatch.setattr(draft_processes, "available_memory", lambda: 64 * DRAFT_PROCESS_BYTES)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert drafting_processes(on_gpu, RunConfig()) == 2, "resolved in the parent, by the model's device"
    assert drafting_processes(on_cpu, RunConfig()) == 0
    assert drafting_processes(None, RunConfig()) == 0, "a draft-only run drafts in its worker"
    assert drafting_processes(on_gpu, RunConfig(executor=Executor.RAY)) == 0
    assert drafting_processes(None, RunConfig(draft_workers=3)) == 3, "asked for, always"
    assert default_draft_processes(model_on_accelerator=True) == 2
    assert default_draft_processes(model_on_accelerator=False) == 0, "the model's forwards take every core"
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert default_draft_processes(model_on_accelerator=True) == MAX_DEFAULT_DRAFT_PROCESSES
    monkeypatch.setattr(draft_processes, "available_memory", lambda: 10 * DRAFT_PROCESS_BYTES)
    assert default_draft_processes(model_on_accelerator=True) == 5, "half the available memory"
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert default_draft_processes(model_on_accelerator=True) == 0


def test_draft_processes_take_work_only_where_free_and_end_when_stopped():
    processes = DraftProcesses(1, started=int)
    busy = processes.try_submit(time.sleep, 1.0)
    assert processes.try_submit(os.getpid) is None, "its one process is busy"
    busy.result()
    while (asked := processes.try_submit(os.getpid)) is None:  # the pool says it is free just after
        time.sleep(0.01)
    pid = asked.result()
    assert pid != os.getpid() and Path(f"/proc/{pid}").exists()
    processes.stop()
    assert not Path(f"/proc/{pid}").exists(), "stopped and reaped, not left to its parent's exit"


def test_draft_processes_stop_with_work_still_in_them():
    """A document that ended with drafts still sent (it raised): its worker must still stop."""
    processes = DraftProcesses(1, started=int)
    sent = processes.try_submit(time.sleep, 2.0)
    stopping = threading.Thread(target=processes.stop, daemon=True)
    stopping.start()
    stopping.join(30)
    assert not stopping.is_alive() and sent.done()


def test_draft_processes_share_the_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert [threads_per_process(n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]


def test_negative_draft_workers_are_refused_in_one_line(tmp_path):
    result = run_hsd("convert", tmp_path, "-o", tmp_path / "out", "--draft-workers", "-1")
    assert result.exit_code == 2 and "--draft-workers must be at least 0" in result.stderr


@pytest.fixture(scope="module")
def documents(docs_dir, tmp_path_factory) -> Path:
    """A born-digital document of 10 pages (the two-page report, repeated) and the scan."""
    root = tmp_path_factory.mktemp("drafts-ahead")
    with pymupdf.open(docs_dir / "report.pdf") as report, pymupdf.open() as long:
        for _ in range(5):
            long.insert_pdf(report)
        long.save(root / "long.pdf")
    (root / "scan.pdf").write_bytes((docs_dir / "scan.pdf").read_bytes())
    return root


def _model_args(tiny_model: Path) -> list:
    return ["--model", tiny_model, "--stages", "page", "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32"]


def _outputs(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(out.glob("*.md")) + sorted(out.glob("*.json"))}


def _draft_waits(out: Path) -> dict[str, list[bool]]:
    """Per document, per page: whether its draft came from a draft process (its wait recorded)."""
    return {
        Path(record["input"]).name: ["draft_wait_s" in timings for _, timings in sorted(record["timings"]["pages"].items(), key=lambda kv: int(kv[0]))]
        for record in _manifest(out)
    }


@pytest.mark.slow
@pytest.mark.parametrize("with_model", [False, True], ids=["draft", "tiny-model"])
def test_drafts_made_ahead_change_no_output_byte(with_model, documents, tmp_path, request):
    extra = [*_model_args(request.getfixturevalue("tiny_model")), "--max-rows", "2"] if with_model else []
    outputs = {}
    for workers in (0, 2):
        out = tmp_path / f"workers{workers}"
        result = run_hsd("convert", documents, "-o", out, "--json", "--draft-workers", workers, *extra)
        assert result.exit_code == 0, result.stderr
        outputs[workers] = _outputs(out)
        waits = _draft_waits(out)
        if workers == 0:
            assert not any(any(pages) for pages in waits.values()), "every page drafted in the worker"
        else:
            assert sum(waits["long.pdf"]) > 1, "pages drafted in draft processes"
    assert len(outputs[0]) == 4 and outputs[2] == outputs[0]


def _processes_marked(mark: str) -> list[int]:
    """Processes alive whose environment holds `mark` (the run's worker and its draft processes
    inherit the test's environment)."""
    alive = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark.encode() in environ.read_bytes():
                alive.append(int(environ.parent.name))
        except OSError:
            continue
    return alive


@pytest.mark.slow
@pytest.mark.parametrize("fault, lost", [("HSD_DEBUG_STALL", "timeout"), ("HSD_DEBUG_CRASH", "crash")])
def test_a_draft_that_hangs_or_kills_its_process_costs_its_page_only_and_leaves_no_process(
    fault, lost, documents, tiny_model, tmp_path, monkeypatch,
):
    mark = f"hsd-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("HSD_TEST_MARK", mark)
    monkeypatch.setenv(fault, "long.pdf:3")
    out = tmp_path / "out"
    result = run_hsd(
        "convert", documents / "long.pdf", "-o", out, "--json", "--draft-workers", "1", "--page-timeout", "8",
        "--max-page-error-rate", "0.5", *_model_args(tiny_model),
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)["documents"][0]
    assert (document["status"], document["failed_pages"]) == ("degraded", {"3": lost})
    flags = [page["flags"] for page in json.loads((out / "long.json").read_text())["pages"]]
    assert flags[2] == ["failed", lost]
    assert all(page_flags == ["vlm", "truncated"] for n, page_flags in enumerate(flags) if n != 2), "the others read by the model"
    assert "leaked" not in result.stderr
    assert _processes_marked(mark) == [], "the worker's draft processes die with it"


def test_a_worker_that_drafted_ahead_ends_by_itself_when_stopped(documents, tmp_path):
    """Its draft processes stop before its main returns: else multiprocessing joins them first and
    the worker hangs until the parent kills it (exit code -9, 10 s late)."""
    from hsd_cli.document.inputs import InputDocument, OutputPaths
    from hsd_cli.batch.local_executor import LocalExecutor
    from hsd_cli.document.tasks import DocumentTask
    from hsd_cli.batch.worker import Limits, WorkerPool

    executor = LocalExecutor(slots=1, max_docs_per_worker=50)
    channels = []
    pool = WorkerPool(Limits(0.0, 0.0, 50), lambda: channels.append(executor.start_worker()) or channels[-1], threading.Event())
    task = DocumentTask(
        doc=InputDocument(path=documents / "long.pdf", relpath=Path("long.pdf"), kind="pdf"),
        outputs=OutputPaths(markdown=tmp_path / "long.md", json=tmp_path / "long.json", images_dir=tmp_path / "long_images"),
        config=resolved(ConvertConfig(output_dir=tmp_path), run=RunConfig(draft_workers=1)), sha256="0" * 64,
        checkpoint_dir=tmp_path / "pages",
    )
    try:
        outcome = pool.convert(task, lambda name, payload: None)
    finally:
        pool.close()
        executor.close()
    assert outcome.status.value == "ok" and outcome.pages == 10
    assert len(channels) == 1 and channels[0].shared.process.exitcode == 0
