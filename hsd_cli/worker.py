"""Documents run in a worker process that the parent can kill and replace.

The parent enforces the page and document timeouts: a worker stuck in a page (a looping decode,
a native library that hangs) is killed, the page is marked lost, and a fresh worker resumes the
document from its page checkpoints. A worker that crashes is handled the same way.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

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


def _worker_main(tasks: Any, events: Any) -> None:
    _die_with_parent()
    # Imported here, in the worker only: the models and their libraries stay out of the parent.
    from hsd_cli.pipeline import process_document

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no weight-loading bars in batch logs
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle

    def emit(name: str, payload: dict[str, Any]) -> None:
        events.put((name, payload))

    while (task := tasks.get()) is not None:
        _reset_peak_rss()
        outcome = process_document(task, emit)
        events.put(("doc_done", replace(outcome, peak_rss_mib=peak_rss_mib())))


class Worker:
    def __init__(self) -> None:
        self.tasks = _CONTEXT.Queue()
        self.events = _CONTEXT.Queue()
        self.process = _CONTEXT.Process(target=_worker_main, args=(self.tasks, self.events), daemon=True)
        self.process.start()
        self.documents = 0

    def next_event(self, timeout: float) -> tuple[str, Any] | None:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        for channel in (self.tasks, self.events):
            channel.cancel_join_thread()
            channel.close()

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


class WorkerPool:
    """One worker at a time, replaced when killed, crashed or due for recycling."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
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
            not self.worker.process.is_alive() or self.worker.documents >= self.limits.max_docs_per_worker
        ):
            self.close()
        if self.worker is None:
            self.worker = Worker()
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
        while True:
            worker = self._ready_worker()
            worker.documents += 1
            worker.tasks.put(replace(task, lost_pages=lost_pages))
            current_page: int | None = None
            page_deadline = float("inf")
            while True:
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
                stalled = now >= page_deadline
                crashed = not worker.process.is_alive()
                if not (stalled or crashed):
                    continue
                reason = "timeout" if stalled else "crash"
                if current_page is None or current_page in lost_pages:
                    detail = reason if stalled else f"crash (exit code {worker.process.exitcode})"
                    return given_up(DocStatus.FAILED, f"worker {detail} outside a page")
                self.abort()
                progress("page_lost", {"page": current_page, "reason": reason})
                lost_pages[current_page] = reason
                break  # resend: a fresh worker resumes from the checkpoints
