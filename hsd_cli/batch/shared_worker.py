"""A worker that converts several documents at once (a local process: local_executor; a Ray actor:
ray_executor), one channel per document in flight, and the executor's places for such workers.

Each WorkerPool of the run drives a `WorkerChannel`, a `worker.Worker` onto one `SharedWorker`:
its tasks go out tagged with the channel, and a dispatcher thread routes the worker's tagged
events back to each channel's queue. In the worker, each document runs on a thread of its own
(worker.DocumentThreads; their pipelines take turns: pipeline_lock). Killing through one channel
(its page or document ran out of time) kills the worker: the other channels then see it lost as
`worker.RESTARTED`, and resend their documents without blame. A worker that dies by itself is a
crash to the documents whose work it died of: the one running its pipeline (pipeline_lock), else
those waiting for the model (the model's forward died), else all; to the others it is
`worker.CRASHED_ELSEWHERE`.

A subclass is the transport: how the worker starts, takes a task, sends its events, ends.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from hsd_cli.document.tasks import DocumentTask
from hsd_cli.batch.worker import CRASHED_ELSEWHERE, DOCUMENT_STATES, RESTARTED, WORKER_ERROR

Event = tuple[int, str, Any]  # (channel, name, payload), as a worker sends it


class SharedWorker:
    """One worker, the channels open on it, and the dispatcher that routes its events."""

    def __init__(self) -> None:
        self.channels: dict[int, queue.SimpleQueue[tuple[str, Any]]] = {}
        self.opened = 0  # channels opened so far: the next one's number
        self.documents = 0
        self.accepting = True  # takes tasks: neither killed nor stopped
        self.stopped_by_parent = False  # killed (for one channel's document) or stopped while it ran: no crash
        self.states: dict[int, str] = {}  # channel -> what its document's thread last said it does
        self.failed: dict[int, str] = {}  # channel -> why its document's thread raised (the worker goes on)
        self.blamed: set[int] | None = None  # the channels a crash is blamed on (None: all)
        self.changing = threading.Lock()  # channels, submissions and stopping, from the pools' threads
        self.ended = threading.Event()  # the worker is gone and every event it sent is routed
        started = threading.Event()
        self.start_error: BaseException | None = None
        # The dispatcher starts the worker: Linux's parent-death signal follows the thread that
        # started a process, and the dispatcher ends only after the worker has.
        self.dispatcher = threading.Thread(target=self._dispatch, args=(started,), name="hsd-dispatcher", daemon=True)
        self.dispatcher.start()
        started.wait()
        if self.start_error is not None:
            raise self.start_error

    # The transport.
    def _start(self) -> None:
        """Start the worker (on the dispatcher's thread)."""
        raise NotImplementedError

    def _receive(self) -> Event | None:
        """The worker's next event; None once it is gone (reaped: why it died is known)."""
        raise NotImplementedError

    def _send(self, channel: int, task: DocumentTask) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        """Let the worker finish what it has (nothing, when the executor stops it) and end."""
        raise NotImplementedError

    def _kill(self) -> None:
        raise NotImplementedError

    def _crash(self) -> str:
        """How the worker died by itself, in a few words."""
        raise NotImplementedError

    def _dispatch(self, started: threading.Event) -> None:
        try:
            self._start()
        except BaseException as exc:  # noqa: BLE001 - e.g. out of file descriptors: raised in __init__
            self.start_error = exc
            self.ended.set()
            return
        finally:
            started.set()
        while (event := self._receive()) is not None:
            channel, name, payload = event
            with self.changing:
                route = self.channels.get(channel)
                if name in DOCUMENT_STATES:
                    self.states[channel] = name
                elif name == "doc_done":
                    self.states.pop(channel, None)
                elif name == WORKER_ERROR:
                    self.failed[channel] = payload
                    continue
            if route is not None:
                route.put((name, payload))
        with self.changing:
            self.blamed = self._crash_blamed()
        self.ended.set()

    def _crash_blamed(self) -> set[int] | None:
        """Whose work the worker died of: the document running its pipeline, else those waiting
        for the model (they shared the forward that died), else every document (None)."""
        for state in ("doc_running", "doc_model"):
            channels = {channel for channel, said in self.states.items() if said == state}
            if channels:
                return channels
        return None

    def open_channel(self, on_close: Callable[[], None]) -> WorkerChannel:
        with self.changing:
            number = self.opened
            self.opened += 1
            self.channels[number] = queue.SimpleQueue()
        return WorkerChannel(self, number, self.channels[number], on_close)

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
            if self.accepting:  # else the channel sees the worker lost, and its pool resends
                self._send(channel, task)

    def lost(self, channel: int) -> str | None:
        if channel in self.failed:
            return self.failed[channel]
        if not self.ended.is_set():
            return None
        if self.stopped_by_parent:
            return RESTARTED
        if self.blamed is not None and channel not in self.blamed:
            return CRASHED_ELSEWHERE
        return self._crash()

    def kill(self) -> None:
        with self.changing:
            if not self.ended.is_set():  # a worker that died by itself stays a crash to the others
                self.stopped_by_parent = True
            self.accepting = False
        self._kill()
        # Ended, the dispatcher lets go of this object: were it the last holder, a process's queue
        # would be finalized on a daemon thread that the interpreter's exit can cut short.
        self.dispatcher.join(10)

    def stop(self) -> None:
        """Let the worker finish what it has (nothing, when the executor stops it) and end."""
        with self.changing:
            running = not self.gone
            self.accepting = False
            if running:
                self.stopped_by_parent = True
        if running:
            self._finish()
        self.kill()  # what did not end by itself


class WorkerChannel:
    """A WorkerPool's worker: one document at a time on a shared worker (`worker.Worker`)."""

    def __init__(
        self, shared: SharedWorker, number: int, events: queue.SimpleQueue[tuple[str, Any]], on_close: Callable[[], None]
    ) -> None:
        self.shared = shared
        self.number = number
        self.events = events
        self.on_close = on_close
        self.closed = False

    @property
    def documents(self) -> int:
        return self.shared.documents  # recycling counts the worker's documents, over every channel

    def submit(self, task: DocumentTask) -> None:
        self.shared.submit(self.number, task)

    def next_event(self, timeout: float) -> tuple[str, Any] | None:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def lost(self) -> str | None:
        # Gone only once every event the worker sent is read: one of them may end the page in flight.
        death = self.shared.lost(self.number)
        return death if death is not None and self.events.empty() else None

    def kill(self) -> None:
        self.shared.kill()
        self.stop()

    def stop(self) -> None:
        """Leave the worker to the other channels; the executor stops it."""
        if not self.closed:
            self.closed = True
            self.shared.close_channel(self.number)
            self.on_close()


class SharedWorkers:
    """Places for `places` shared workers of `rows` channels each (`slots` documents at once),
    started as needed and replaced when gone, or when due for recycling (`max_docs_per_worker`
    documents) once their channels have closed: a worker due takes no new channel, so that the
    pools drain it instead of holding it forever between them."""

    def __init__(self, places: int, rows: int, max_docs_per_worker: int, start: Callable[[], SharedWorker]) -> None:
        self.rows = rows
        self.max_docs_per_worker = max_docs_per_worker
        self.start = start
        self.places: list[SharedWorker | None] = [None] * places
        self.changing = threading.Condition()  # the places, against the pools' threads

    @property
    def slots(self) -> int:
        return len(self.places) * self.rows

    def _due(self, worker: SharedWorker) -> bool:
        return worker.documents >= self.max_docs_per_worker

    def _room(self) -> list[tuple[int, bool, int]]:
        """(channels a new one would join, whether a fresh worker starts for it, place) of every
        place with room: a running worker's, else a fresh one where the place is empty, its worker
        gone, or due and drained (a worker due with channels open drains; a full one has no room)."""
        room = []
        for place, worker in enumerate(self.places):
            if worker is None or worker.gone or (self._due(worker) and worker.open_channels == 0):
                room.append((0, True, place))
            elif not self._due(worker) and worker.open_channels < self.rows:
                room.append((worker.open_channels, False, place))
        return room

    def start_worker(self) -> WorkerChannel:
        """A channel onto the least busy place's worker (documents spread over the workers: each
        has a device of its own); a fresh worker where it is gone or due and drained."""
        with self.changing:
            while not (room := self._room()):
                self.changing.wait(1.0)  # woken by a channel that closes; a death is seen on the next look
            _, fresh, place = min(room)
            worker = self.places[place]
            if fresh:
                if worker is not None:
                    worker.stop()
                self.places[place] = worker = self.start()
            return worker.open_channel(self._channel_closed)

    def _channel_closed(self) -> None:
        with self.changing:
            self.changing.notify_all()

    def close(self) -> None:
        with self.changing:
            for place, worker in enumerate(self.places):
                if worker is not None:
                    worker.stop()
                    self.places[place] = None
