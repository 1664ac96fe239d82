"""Documents run in a worker (a local process, or a Ray actor) that the parent can kill and replace.

The parent enforces the page and document timeouts: a worker stuck in a page (a looping decode,
a native library that hangs) is killed, the page is marked lost, and a fresh worker resumes the
document from its page checkpoints. A worker that dies is replaced the same way; the page it was
on is tried once more before it is marked lost, since the death may be the machine's, not the page's.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from hsd_cli.records import DocStatus
from hsd_cli.tasks import DocumentOutcome, DocumentTask

_CONTEXT = multiprocessing.get_context("spawn")  # no forked torch/onnxruntime thread state
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the parent dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass


def _reset_peak_rss() -> None:
    """Linux: restart the kernel's peak-RSS count (VmHWM) of this process."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass


def peak_rss_mib() -> int | None:
    """This process's peak resident memory since the last reset (Linux); None where unknown."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def run_document(task: DocumentTask, emit: Callable[[str, dict[str, Any]], None]) -> DocumentOutcome:
    """One document in a worker (a local process or a Ray actor), with the worker's peak memory."""
    # Imported here, in the worker only: the models and their libraries stay out of the parent.
    from hsd_cli.pipeline import process_document

    _reset_peak_rss()
    outcome = process_document(task, emit)
    return replace(outcome, peak_rss_mib=peak_rss_mib())


def _worker_main(tasks: Any, events: Any) -> None:
    _die_with_parent()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no weight-loading bars in batch logs
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle

    def emit(name: str, payload: dict[str, Any]) -> None:
        events.send((name, payload))

    while (task := tasks.get()) is not None:
        events.send(("doc_done", run_document(task, emit)))


class Worker(Protocol):
    """What the parent drives: one document at a time; its progress events end with
    ("doc_done", DocumentOutcome)."""

    documents: int

    def submit(self, task: DocumentTask) -> None: ...

    def next_event(self, timeout: float) -> tuple[str, Any] | None: ...

    def lost(self) -> str | None:
        """Why the worker is gone (a crash, a killed actor), or None while it runs."""

    def kill(self) -> None: ...

    def stop(self) -> None: ...


class ProcessWorker:
    """A worker process on this machine."""

    def __init__(self) -> None:
        self.tasks = _CONTEXT.Queue()
        # Events go through a pipe, written before the worker goes on: a queue's feeder thread
        # could still hold the last ones when the worker dies, and the parent would blame the
        # wrong page.
        self.events, sender = _CONTEXT.Pipe(duplex=False)
        self.process = _CONTEXT.Process(target=_worker_main, args=(self.tasks, sender), daemon=True)
        self.process.start()
        sender.close()
        self.documents = 0

    def submit(self, task: DocumentTask) -> None:
        self.tasks.put(task)

    def next_event(self, timeout: float) -> tuple[str, Any] | None:
        try:
            return self.events.recv() if self.events.poll(timeout) else None
        except EOFError:  # the worker is gone; lost() says why
            return None

    def lost(self) -> str | None:
        return None if self.process.is_alive() else f"crash (exit code {self.process.exitcode})"

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.tasks.cancel_join_thread()
        self.tasks.close()
        self.events.close()

    def stop(self) -> None:
        self.tasks.put(None)
        self.process.join(10)
        if self.process.is_alive():
            self.kill()


@dataclass(frozen=True)
class Limits:
    page_timeout: float  # seconds per page; 0 = none
    doc_timeout: float  # seconds per document; 0 = none
    max_docs_per_worker: int


# (event name, payload) -> None; the parent's view of progress (for --events and the display).
ProgressSink = Callable[[str, dict[str, Any]], None]

# A worker that dies (a crash, an OOM kill, a lost node) may not be the page's fault: what it was
# on (a page, or the document outside its pages) is tried again, and given up (the page lost, the
# document failed) at this many deaths there.
DEATHS_ALLOWED = 2


class ExecutorUnavailableError(RuntimeError):
    """The executor cannot run documents (Ray missing or unreachable, OUT not shared): the run ends
    before any work, with exit code 4."""

    def __init__(self, message: str, hint: str | None) -> None:
        super().__init__(message)
        self.hint = hint


class RunCancelled(Exception):
    """The run was interrupted: the document in progress is abandoned, unrecorded."""


class WorkerPool:
    """One worker at a time, replaced when killed, crashed or due for recycling; several pools run
    side by side when the executor has room for several workers."""

    def __init__(self, limits: Limits, start_worker: Callable[[], Worker], cancelled: threading.Event) -> None:
        self.limits = limits
        self.start_worker = start_worker
        self.cancelled = cancelled
        self.worker: Worker | None = None

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None

    def abort(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def _ready_worker(self) -> Worker:
        if self.worker is not None and (
            self.worker.lost() is not None or self.worker.documents >= self.limits.max_docs_per_worker
        ):
            self.close()
        if self.worker is None:
            self.worker = self.start_worker()
        return self.worker

    def convert(self, task: DocumentTask, progress: ProgressSink) -> DocumentOutcome:
        started = time.monotonic()

        def given_up(status: DocStatus, error: str) -> DocumentOutcome:
            self.abort()
            return DocumentOutcome(
                input=str(task.doc.path), status=status, error=error, seconds=time.monotonic() - started,
                sha256=task.sha256,
            )

        doc_deadline = started + self.limits.doc_timeout if self.limits.doc_timeout else float("inf")
        lost_pages = dict(task.lost_pages)
        deaths: Counter[int | None] = Counter()  # worker deaths per page in flight (None: outside any)
        while True:
            worker = self._ready_worker()
            worker.documents += 1
            worker.submit(replace(task, lost_pages=lost_pages))
            current_page: int | None = None
            page_deadline = float("inf")
            while True:
                if self.cancelled.is_set():
                    self.abort()
                    raise RunCancelled
                now = time.monotonic()
                event = worker.next_event(max(0.05, min(1.0, min(doc_deadline, page_deadline) - now)))
                now = time.monotonic()
                if event is not None:
                    name, payload = event
                    if name == "doc_done":
                        return payload
                    progress(name, payload)
                    if name == "page_started":
                        current_page = payload["page"]
                        if self.limits.page_timeout:
                            page_deadline = now + self.limits.page_timeout
                    elif name == "page_done":
                        current_page, page_deadline = None, float("inf")
                    continue
                if now >= doc_deadline:
                    return given_up(DocStatus.TIMEOUT, f"stopped after --doc-timeout {self.limits.doc_timeout:g}s")
                if now >= page_deadline:
                    self.abort()
                    progress("page_lost", {"page": current_page, "reason": "timeout"})
                    lost_pages[current_page] = "timeout"
                    break  # resend: a fresh worker resumes from the checkpoints
                death = worker.lost()
                if death is None:
                    continue
                self.abort()
                deaths[current_page] += 1
                if deaths[current_page] < DEATHS_ALLOWED:
                    progress("worker_lost", {"page": current_page, "reason": death})
                elif current_page is None:
                    return given_up(DocStatus.FAILED, f"worker {death} outside a page")
                else:
                    progress("page_lost", {"page": current_page, "reason": "crash"})
                    lost_pages[current_page] = "crash"
                break  # resend: a fresh worker resumes from the checkpoints
