"""Worker processes on this machine (`--executor local`): one process at a time, which converts as
many documents at once as the run has slots (runner.documents_in_flight: `--max-rows` when a model
reads the pages, else one).

Each WorkerPool of the run drives a `ProcessChannel`, a `worker.Worker` onto the one
`SharedProcess`: its tasks go out tagged with the channel, and a dispatcher thread routes the
process's tagged events back to each channel's queue. In the process, each document runs on a
thread of its own (their pipelines take turns: pipeline_lock). Killing through one channel (its
page or document ran out of time) kills the process: the other channels then see it lost as
`worker.RESTARTED`, and resend their documents without blame. A process that dies by itself is a
crash to the documents whose work it died of: the one running its pipeline (pipeline_lock), else
those waiting for the model (the model's forward died), else all; to the others it is
`worker.CRASHED_ELSEWHERE`. The next `start_worker()` starts a fresh process.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import traceback
from collections.abc import Callable
from typing import Any

from hsd_cli.draft_processes import stop_draft_processes
from hsd_cli.processes import SPAWN, die_with_parent
from hsd_cli.tasks import DocumentTask
from hsd_cli.worker import CRASHED_ELSEWHERE, DOCUMENT_STATES, RESTARTED, run_document

def _worker_main(tasks: Any, events: Any) -> None:
    """A worker process: each (channel, task) runs on a thread of its own until the None that stops it."""
    die_with_parent()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no weight-loading bars in batch logs
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    sending = threading.Lock()  # whole messages on the pipe from every document's thread
    counting = threading.Lock()
    in_flight = 0

    def convert(channel: int, task: DocumentTask) -> None:
        nonlocal in_flight

        def emit(name: str, payload: Any) -> None:
            with sending:
                events.send((channel, name, payload))

        try:
            with counting:
                in_flight += 1
                alone = in_flight == 1
            run_document(task, emit, alone)
            with counting:
                in_flight -= 1
        except BaseException:  # noqa: BLE001 - e.g. the pipeline cannot be imported
            # As an uncaught error ended a worker of one document: the parent sees the process die.
            traceback.print_exc()
            os._exit(1)

    threads: list[threading.Thread] = []
    while (message := tasks.get()) is not None:
        threads = [thread for thread in threads if thread.is_alive()]
        threads.append(threading.Thread(target=convert, args=message, name=f"hsd-document-{message[0]}", daemon=True))
        threads[-1].start()
    for thread in threads:
        thread.join()
    stop_draft_processes()


class SharedProcess:
    """One worker process, the channels open on it, and the dispatcher that routes its events."""

    def __init__(self, target: Callable[[Any, Any], None] = _worker_main) -> None:
        """`target(tasks, events)` is the process's main (a scripted one in the tests)."""
        self.tasks = SPAWN.Queue()
        # Events go through a pipe, written before the worker goes on: a queue's feeder thread
        # could still hold the last ones when the worker dies, and the parent would blame the
        # wrong page.
        self.events, sender = SPAWN.Pipe(duplex=False)
        self.process = SPAWN.Process(target=target, args=(self.tasks, sender), daemon=True)
        self.channels: dict[int, queue.SimpleQueue[tuple[str, Any]]] = {}
        self.opened = 0  # channels opened so far: the next one's number
        self.documents = 0
        self.accepting = True  # takes tasks: neither killed nor stopped
        self.stopped_by_parent = False  # killed (for one channel's document) or stopped while it ran: no crash
        self.states: dict[int, str] = {}  # channel -> what its document's thread last said it does
        self.blamed: set[int] | None = None  # the channels a crash is blamed on (None: all)
        self.changing = threading.Lock()  # channels, submissions and stopping, from the pools' threads
        self.ended = threading.Event()  # the process is gone and every event it sent is routed
        started = threading.Event()
        self.start_error: BaseException | None = None
        # The dispatcher starts the process: Linux's parent-death signal follows the thread that
        # started it, and the dispatcher ends only after the process has.
        self.dispatcher = threading.Thread(
            target=self._dispatch, args=(sender, started), name="hsd-dispatcher", daemon=True
        )
        self.dispatcher.start()
        started.wait()
        if self.start_error is not None:
            raise self.start_error

    def _dispatch(self, sender: Any, started: threading.Event) -> None:
        try:
            self.process.start()
        except BaseException as exc:  # noqa: BLE001 - e.g. out of file descriptors: raised in __init__
            self.start_error = exc
            self.ended.set()
            return
        finally:
            sender.close()
            started.set()
        while True:
            try:
                channel, name, payload = self.events.recv()
            except EOFError:  # the process is gone
                break
            except Exception:  # noqa: BLE001 - an event that cannot be read: the process is of no use
                self.process.kill()
                break
            with self.changing:
                route = self.channels.get(channel)
                if name in DOCUMENT_STATES:
                    self.states[channel] = name
                elif name == "doc_done":
                    self.states.pop(channel, None)
            if route is not None:
                route.put((name, payload))
        with self.changing:
            self.blamed = self._crash_blamed()
        self.process.join(10)  # reaped: its exit code is known
        self.events.close()
        self.ended.set()

    def _crash_blamed(self) -> set[int] | None:
        """Whose work the process died of: the document running its pipeline, else those waiting
        for the model (they shared the forward that died), else every document (None)."""
        for state in ("doc_running", "doc_model"):
            channels = {channel for channel, said in self.states.items() if said == state}
            if channels:
                return channels
        return None

    def open_channel(self, on_close: Callable[[], None]) -> ProcessChannel:
        with self.changing:
            number = self.opened
            self.opened += 1
            self.channels[number] = queue.SimpleQueue()
        return ProcessChannel(self, number, self.channels[number], on_close)

    def close_channel(self, number: int) -> None:
        with self.changing:
            self.channels.pop(number, None)

    @property
    def open_channels(self) -> int:
        return len(self.channels)

    @property
    def gone(self) -> bool:
        return not self.accepting or self.ended.is_set()

    def submit(self, channel: int, task: DocumentTask) -> None:
        with self.changing:
            self.documents += 1
            if self.accepting:  # else the channel sees the process lost, and its pool resends
                self.tasks.put((channel, task))

    def lost(self, channel: int) -> str | None:
        if not self.ended.is_set():
            return None
        if self.stopped_by_parent:
            return RESTARTED
        if self.blamed is not None and channel not in self.blamed:
            return CRASHED_ELSEWHERE
        return f"crash (exit code {self.process.exitcode})"

    def kill(self) -> None:
        with self.changing:
            if not self.ended.is_set():  # a process that died by itself stays a crash to the others
                self.stopped_by_parent = True
            self.accepting = False
        self.process.kill()
        self.process.join(5)
        self.tasks.cancel_join_thread()
        self.tasks.close()
        # Ended, the dispatcher lets go of this object: were it the last holder, the queue's
        # semaphores would be finalized on a daemon thread that the interpreter's exit can cut short.
        self.dispatcher.join(10)

    def stop(self) -> None:
        """Let the process finish what it has (nothing, when the executor stops it) and end."""
        with self.changing:
            running = not self.gone
            self.accepting = False
            if running:
                self.stopped_by_parent = True
                self.tasks.put(None)
        if running:
            self.process.join(10)
        self.kill()  # what did not end by itself; closes the task queue either way


class ProcessChannel:
    """A WorkerPool's worker: one document at a time on the shared process (`worker.Worker`)."""

    def __init__(
        self, shared: SharedProcess, number: int, events: queue.SimpleQueue[tuple[str, Any]], on_close: Callable[[], None]
    ) -> None:
        self.shared = shared
        self.number = number
        self.events = events
        self.on_close = on_close
        self.closed = False

    @property
    def documents(self) -> int:
        return self.shared.documents  # recycling counts the process's documents, over every channel

    def submit(self, task: DocumentTask) -> None:
        self.shared.submit(self.number, task)

    def next_event(self, timeout: float) -> tuple[str, Any] | None:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def lost(self) -> str | None:
        # Gone only once every event the process sent is read: one of them may end the page in flight.
        death = self.shared.lost(self.number)
        return death if death is not None and self.events.empty() else None

    def kill(self) -> None:
        self.shared.kill()
        self.stop()

    def stop(self) -> None:
        """Leave the process to the other channels; the executor stops it."""
        if not self.closed:
            self.closed = True
            self.shared.close_channel(self.number)
            self.on_close()


class LocalExecutor:
    """One worker process at a time (it uses every core), converting `slots` documents at once."""

    def __init__(self, slots: int, max_docs_per_worker: int) -> None:
        self.slots = slots
        self.max_docs_per_worker = max_docs_per_worker
        self.process: SharedProcess | None = None
        self.changing = threading.Condition()  # the process, against the pools' threads

    def _due(self, process: SharedProcess) -> bool:
        return process.documents >= self.max_docs_per_worker

    def _draining(self, process: SharedProcess) -> bool:
        """Due for recycling, and still converting through other channels."""
        return self._due(process) and process.open_channels > 0 and not process.gone

    def start_worker(self) -> ProcessChannel:
        """A channel onto the process; a fresh process where it is gone, or due for recycling
        (--max-docs-per-worker) once its other channels have closed: a process due takes no new
        channel, so that the pools drain it instead of holding it forever between them."""
        with self.changing:
            while self.process is not None and self._draining(self.process):
                self.changing.wait(1.0)  # woken by a channel that closes; a death is seen on the next look
            process = self.process
            if process is None or process.gone or self._due(process):
                if process is not None:
                    process.stop()
                self.process = process = SharedProcess()
            return process.open_channel(self._channel_closed)

    def _channel_closed(self) -> None:
        with self.changing:
            self.changing.notify_all()

    def close(self) -> None:
        with self.changing:
            if self.process is not None:
                self.process.stop()
                self.process = None
