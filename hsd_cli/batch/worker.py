"""Documents run in a worker (a local process, or a Ray actor) that the parent can kill and replace.

The parent enforces the page and document timeouts: a worker stuck in a page (a looping decode,
a native library that hangs) is killed, the page is marked lost, and a fresh worker resumes the
document from its page checkpoints. A worker that dies is replaced the same way; the page it was
on is tried once more before it is marked lost, since the death may be the machine's, not the page's.
A worker may serve several documents at once (shared_worker, --max-rows): a page stopped there
stops the others' work too, and they resume on the fresh worker without blame.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from hsd_cli.serving.pipeline_lock import holding
from hsd_cli.records.kinds import DocStatus
from hsd_cli.document.tasks import DocumentOutcome, DocumentTask


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


def run_document(task: DocumentTask, emit: Callable[[str, Any], None], alone: bool = True) -> None:
    """One document in a worker (a local process or a Ray actor): its events, ending with
    ("doc_done", outcome) with the worker's peak memory since the document started, or since the
    process last started one alone (`alone` False: other documents are in flight in the process,
    whose counts a reset would cut short).

    The document's thread holds the pipeline lock (pipeline_lock) for all its work, its doc_done
    included: a process that dies once the lock has passed on cannot take this document's outcome
    with it. "doc_waiting", "doc_running" and "doc_model" tell the parent what the document's
    thread does (pipeline_lock): waits for another document in its process (from its arrival where
    it is not alone), runs its pipeline, or waits for the model."""
    if not alone:
        emit("doc_waiting", {})
    # Imported here, in the worker only: the models and their libraries stay out of the parent.
    from hsd_cli.document.writing import process_document

    with holding(lambda state: emit(f"doc_{state}", {}), waiting=not alone):
        if alone:
            _reset_peak_rss()
        outcome = process_document(task, emit)
        emit("doc_done", replace(outcome, peak_rss_mib=peak_rss_mib()))


class DocumentThreads:
    """The documents in flight in one worker (a local process, a Ray actor), each on a thread of its
    own, their events sent tagged with their channel; `on_error(channel, exc)` is told of an
    error that escaped a document's pipeline (e.g. the pipeline cannot be imported), from inside
    the `except` that caught it."""

    def __init__(self, send: Callable[[int, str, Any], None], on_error: Callable[[int, BaseException], None]) -> None:
        self.send = send
        self.on_error = on_error
        self.counting = threading.Lock()
        self.in_flight = 0
        self.threads: list[threading.Thread] = []

    def start(self, channel: int, task: DocumentTask) -> None:
        self.threads = [thread for thread in self.threads if thread.is_alive()]
        self.threads.append(
            threading.Thread(target=self._convert, args=(channel, task), name=f"hsd-document-{channel}", daemon=True)
        )
        self.threads[-1].start()

    def _convert(self, channel: int, task: DocumentTask) -> None:
        with self.counting:
            self.in_flight += 1
            alone = self.in_flight == 1
        try:
            run_document(task, lambda name, payload: self.send(channel, name, payload), alone)
        except BaseException as exc:  # noqa: BLE001 - reported, not raised: a thread's error would be lost
            self.on_error(channel, exc)
        finally:
            with self.counting:
                self.in_flight -= 1

    def join(self) -> None:
        for thread in self.threads:
            thread.join()


def error_line(exc: BaseException) -> str:
    """An exception in one line: its type and its message's last line (a remote traceback's
    message ends with the error itself)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__


class Worker(Protocol):
    """What the parent drives: one document at a time; its progress events end with
    ("doc_done", DocumentOutcome)."""

    documents: int  # documents submitted to the worker's process (or actor) so far, resends included

    def submit(self, task: DocumentTask) -> None: ...

    def next_event(self, timeout: float) -> tuple[str, Any] | None: ...

    def lost(self) -> str | None:
        """Why the worker is gone (a crash, a killed actor, RESTARTED), or None while it runs."""

    def kill(self) -> None: ...

    def stop(self) -> None: ...


# What `lost()` says of a worker whose process the parent stopped for another document in it (a
# page or document timeout there): this document is resent and resumes from its checkpoints, and
# no death counts against its page.
RESTARTED = "restarted (its process was stopped for another document)"
# ... and of one whose process died of another document's work (local_executor blames a crash).
CRASHED_ELSEWHERE = "restarted (its process died of another document's work)"
# The events that say what a document's thread does (pipeline_lock's states).
DOCUMENT_STATES = ("doc_waiting", "doc_running", "doc_model")
# The event of a document's thread whose pipeline raised (its payload: why, for `lost()`), where
# the worker goes on without it (a Ray actor; a local process dies of it instead).
WORKER_ERROR = "worker_error"


# The worker stops a page's model reads at --page-timeout itself (its draft stands in); the parent
# kills the worker only where the page is still not done this much later (a stuck draft stage, a
# forward that never returns).
PAGE_KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class Limits:
    page_timeout: float  # seconds per page; 0 = none
    doc_timeout: float  # seconds per document; 0 = none
    max_docs_per_worker: int
    page_kill_grace_s: float = PAGE_KILL_GRACE_S


@dataclass
class DocumentClocks:
    """A document's deadlines as the parent keeps them: --doc-timeout over the whole document and
    --page-timeout (plus the kill grace) over the page in hand. They stop while the document waits
    for another one in its process: that wait is the other document's time, not its own."""

    limits: Limits
    doc_deadline: float  # time.monotonic()
    page_deadline: float = float("inf")
    waiting_since: float | None = None  # None: the document is at work

    @classmethod
    def start(cls, limits: Limits, now: float) -> DocumentClocks:
        return cls(limits, now + limits.doc_timeout if limits.doc_timeout else float("inf"))

    def resent(self) -> None:
        """A fresh worker takes the document: no page in hand, nothing waited for."""
        self.page_deadline, self.waiting_since = float("inf"), None

    def waits(self, now: float) -> None:
        if self.waiting_since is None:
            self.waiting_since = now

    def runs(self, now: float) -> None:
        if self.waiting_since is not None:
            self.doc_deadline += now - self.waiting_since
            self.page_deadline += now - self.waiting_since
            self.waiting_since = None

    def page_started(self, now: float) -> None:
        if self.limits.page_timeout:
            self.page_deadline = now + self.limits.page_timeout + self.limits.page_kill_grace_s

    def page_done(self) -> None:
        self.page_deadline = float("inf")

    def poll_s(self, now: float) -> float:
        """How long to wait for the worker's next event before looking at the clocks again."""
        clock = 1.0 if self.waiting_since is not None else min(self.doc_deadline, self.page_deadline) - now
        return max(0.05, min(1.0, clock))

    def doc_over(self, now: float) -> bool:
        return self.waiting_since is None and now >= self.doc_deadline

    def page_over(self, now: float) -> bool:
        return self.waiting_since is None and now >= self.page_deadline


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
    side by side when the executor has room for several documents at once (Ray actors, or
    channels onto one local process: local_executor)."""

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

        clocks = DocumentClocks.start(self.limits, started)
        lost_pages = dict(task.lost_pages)
        deaths: Counter[int | None] = Counter()  # worker deaths per page in flight (None: outside any)
        while True:
            worker = self._ready_worker()
            worker.submit(replace(task, lost_pages=lost_pages))
            current_page: int | None = None
            clocks.resent()
            while True:
                if self.cancelled.is_set():
                    self.abort()
                    raise RunCancelled
                event = worker.next_event(clocks.poll_s(time.monotonic()))
                now = time.monotonic()
                if event is not None:
                    name, payload = event
                    if name == "doc_done":
                        return payload
                    if name in DOCUMENT_STATES:  # for the clocks and the blame of a crash, not progress
                        if name == "doc_waiting":
                            clocks.waits(now)
                        elif name == "doc_running":
                            clocks.runs(now)
                        continue
                    progress(name, payload)
                    if name == "page_started":
                        current_page = payload["page"]
                        clocks.page_started(now)
                    elif name == "page_done":
                        current_page = None
                        clocks.page_done()
                    continue
                if clocks.doc_over(now):
                    return given_up(DocStatus.TIMEOUT, f"stopped after --doc-timeout {self.limits.doc_timeout:g}s")
                if clocks.page_over(now):
                    self.abort()
                    progress("page_lost", {"page": current_page, "reason": "timeout"})
                    lost_pages[current_page] = "timeout"
                    break  # resend: a fresh worker resumes from the checkpoints
                death = worker.lost()
                if death is None:
                    continue
                self.abort()
                if death in (RESTARTED, CRASHED_ELSEWHERE):
                    # Not this document's doing: no death counts against its page.
                    progress("worker_lost", {"page": current_page, "reason": death})
                    break  # resend: a fresh worker resumes from the checkpoints
                deaths[current_page] += 1
                if deaths[current_page] < DEATHS_ALLOWED:
                    progress("worker_lost", {"page": current_page, "reason": death})
                elif current_page is None:
                    return given_up(DocStatus.FAILED, f"worker {death} outside a page")
                else:
                    progress("page_lost", {"page": current_page, "reason": "crash"})
                    lost_pages[current_page] = "crash"
                break  # resend: a fresh worker resumes from the checkpoints
