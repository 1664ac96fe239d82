"""The pipeline lock: the documents in flight in one worker process (`--max-rows`, one thread each)
run their pipeline one at a time, and overlap only while they wait for the model.

PyMuPDF is not thread-safe, and the draft stage (PyMuPDF, onnxruntime's OCR sessions), the page
checkpoints and the output files are not written for concurrent use either: a document's thread
holds this lock for all its work (`holding`, taken by `worker.run_document`). The VLM stage
calls `released()` around its waits for the batching engine, so that another document renders,
drafts or writes meanwhile and the model's forwards gather the rows of several documents. Without
a model nothing releases the lock, and the documents of a process run one after another.

Nothing of hsd_cli is imported here: the stages (`serving/model.py`) import `released`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_PIPELINE = threading.Lock()
_holder = threading.local()  # on the thread that holds the lock: its `on_state`

# What a document's thread is doing, told as it changes: WAITING for the lock (another document
# holds it: the parent stops the document's clocks meanwhile, worker.WorkerPool), RUNNING its
# pipeline (holding the lock: a process that dies now died of this document's work) or IN_MODEL
# (waiting for the model's batch, the lock let go). local_executor blames a crash by these.
WAITING, RUNNING, IN_MODEL = "waiting", "running", "model"
StateSink = Callable[[str], None]


def _acquire(on_state: StateSink, told_waiting: bool = False) -> None:
    if not _PIPELINE.acquire(blocking=False):
        if not told_waiting:
            on_state(WAITING)
        started = time.monotonic()
        _PIPELINE.acquire()
        _holder.waited_s = waited_s() + time.monotonic() - started
    on_state(RUNNING)


def waited_s() -> float:
    """Seconds this thread has waited for other documents' turns so far: not its own time, as the
    parent's clocks count it (a page's deadline moves by them)."""
    return getattr(_holder, "waited_s", 0.0)


@contextmanager
def holding(on_state: StateSink, waiting: bool = False) -> Iterator[None]:
    """Hold the pipeline lock for one document's work on this thread; `waiting`: the thread was
    told waiting already (it arrived while other documents were in flight)."""
    _acquire(on_state, told_waiting=waiting)
    _holder.on_state = on_state
    try:
        yield
    finally:
        _holder.on_state = None
        _PIPELINE.release()


@contextmanager
def released() -> Iterator[None]:
    """Around a wait for the model: other documents' threads run their pipeline meanwhile, and this
    one takes the lock back (waiting its turn) before it goes on. Nothing may touch PyMuPDF, the
    draft backends, checkpoints or files inside. A no-op on a thread that does not hold the lock
    (a bench calling the stages directly)."""
    on_state = getattr(_holder, "on_state", None)
    if on_state is None:
        yield
        return
    _holder.on_state = None  # a nested released() inside is a no-op
    on_state(IN_MODEL)
    _PIPELINE.release()
    try:
        yield
    finally:
        _acquire(on_state)
        _holder.on_state = on_state
