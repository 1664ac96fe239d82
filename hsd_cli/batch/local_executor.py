"""Worker processes on this machine (`--executor local`): one process at a time, which converts as
many documents at once as the run has slots (runner.documents_in_flight: `--max-rows` when a model
reads the pages, else one), as a `shared_worker.SharedWorker` with a channel per document. The
next `start_worker()` after the process is gone (or due for recycling) starts a fresh process.
"""

from __future__ import annotations

import os
import signal
import threading
import traceback
from collections.abc import Callable
from typing import Any

from hsd_cli.document.draft_processes import stop_draft_processes
from hsd_cli.processes import SPAWN, die_with_parent
from hsd_cli.batch.shared_worker import Event, SharedWorker, SharedWorkers
from hsd_cli.document.tasks import DocumentTask
from hsd_cli.batch.worker import DocumentThreads


def _worker_main(tasks: Any, events: Any) -> None:
    """A worker process: each (channel, task) runs on a thread of its own until the None that stops it."""
    die_with_parent()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no weight-loading bars in batch logs
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    sending = threading.Lock()  # whole messages on the pipe from every document's thread

    def send(channel: int, name: str, payload: Any) -> None:
        with sending:
            events.send((channel, name, payload))

    def die(channel: int, exc: BaseException) -> None:
        # As an uncaught error ended a worker of one document: the parent sees the process die.
        traceback.print_exc()
        os._exit(1)

    documents = DocumentThreads(send, die)
    while (message := tasks.get()) is not None:
        documents.start(*message)
    documents.join()
    stop_draft_processes()


class SharedProcess(SharedWorker):
    """A worker process: tasks in through a queue, events out through a pipe."""

    def __init__(self, target: Callable[[Any, Any], None] = _worker_main) -> None:
        """`target(tasks, events)` is the process's main (a scripted one in the tests)."""
        self.tasks = SPAWN.Queue()
        # Events go through a pipe, written before the worker goes on: a queue's feeder thread
        # could still hold the last ones when the worker dies, and the parent would blame the
        # wrong page.
        self.events, self.sender = SPAWN.Pipe(duplex=False)
        self.process = SPAWN.Process(target=target, args=(self.tasks, self.sender), daemon=True)
        super().__init__()

    def _start(self) -> None:
        try:
            self.process.start()
        finally:
            self.sender.close()

    def _receive(self) -> Event | None:
        try:
            return self.events.recv()
        except EOFError:  # the process is gone
            pass
        except Exception:  # noqa: BLE001 - an event that cannot be read: the process is of no use
            self.process.kill()
        self.process.join(10)  # reaped: its exit code is known
        self.events.close()
        return None

    def _send(self, channel: int, task: DocumentTask) -> None:
        self.tasks.put((channel, task))

    def _finish(self) -> None:
        self.tasks.put(None)
        self.process.join(10)

    def _kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.tasks.cancel_join_thread()
        self.tasks.close()

    def _crash(self) -> str:
        return f"crash (exit code {self.process.exitcode})"


class LocalExecutor(SharedWorkers):
    """One worker process at a time (it uses every core), converting `slots` documents at once."""

    def __init__(self, slots: int, max_docs_per_worker: int) -> None:
        # SharedProcess looked up when a process starts: the tests script it.
        super().__init__(1, slots, max_docs_per_worker, lambda: SharedProcess())
