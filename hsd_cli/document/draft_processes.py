"""Draft processes: the pages of the documents in a worker are rendered and drafted here, ahead of
the model (`--draft-workers`), so that a row of the model's batch does not stand empty while its
document's next page is drafted, and drafting is not one page at a time under the pipeline lock.

Work goes to a draft process only where one is free (`try_submit`): a draft sent is running at
once, so a page that waits for its draft waits for its own work, never for another page's (a
draft stuck in one process delays no other page, and a page's clock may run while it waits).

A `concurrent.futures.ProcessPoolExecutor` of spawned processes (no forked torch or onnxruntime
thread state). Linux's parent-death signal kills each process with the worker, even by SIGKILL (a
page timeout kills the worker while a draft is stuck); that signal follows the thread that
started the process, so the processes are started by a thread of the pool's own that lives as long
as the worker, never by a document's thread, which ends with its document. A pool whose process
died (`BrokenProcessPool`) is replaced on the next submit.

Nothing of hsd_cli but `processes` is imported here: the pipeline submits its own function.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from hsd_cli.processes import SPAWN, available_memory, die_with_parent


def _ready() -> None:
    """A task that only makes the pool start a process."""


def _start_process(started: Callable[[], None]) -> None:
    die_with_parent()
    started()


class DraftProcesses:
    """`processes` draft processes, started on first use and again after one died."""

    def __init__(self, processes: int, started: Callable[[], None]) -> None:
        """`started()` runs first in each process (its own setup; the parent-death signal is set
        before it)."""
        self.processes = processes
        self.started = started
        self._pool: ProcessPoolExecutor | None = None
        self._retired = threading.Event()  # set: the pool's starting thread ends, and its processes with it
        self._changing = threading.Lock()
        self._busy = 0  # work sent and not yet done

    def try_submit(self, work: Callable[..., Any], *args: Any) -> Future | None:
        """`work(*args)` in a free draft process, or None where every one is busy."""
        with self._changing:
            if self._busy >= self.processes:
                return None
            future = self._submit(work, *args)
            self._busy += 1
        future.add_done_callback(self._done)
        return future

    def _done(self, _: Future) -> None:
        with self._changing:
            self._busy -= 1

    def _submit(self, work: Callable[..., Any], *args: Any) -> Future:
        if self._pool is not None:
            try:
                return self._pool.submit(work, *args)
            except BrokenProcessPool:  # a process died: the work it and the others had failed
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._retired.set()
        self._retired = threading.Event()
        self._pool = self._started_pool(self._retired)
        return self._pool.submit(work, *args)

    def stop(self) -> None:
        """End the processes (their work done first). A worker process must, before it returns:
        multiprocessing joins a process's children as soon as its main returns, before the pool
        would tell them to end, and the worker would hang until its parent kills it."""
        with self._changing:
            pool, self._pool = self._pool, None
        # Outside the lock: work still running ends in the pool's thread, whose `_done` takes it.
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self._retired.set()

    def _started_pool(self, retired: threading.Event) -> ProcessPoolExecutor:
        """A pool whose processes are all running, started from a thread that lives until `retired`: the pool
        spawns a process on a submit that finds none idle, so `processes` submits at once start all
        of them, and later submits (from documents' threads) start none."""
        # The local worker is a daemonic process (its parent ends it when it exits), and
        # multiprocessing refuses children to those; the flag is this process's own copy, and it
        # dies with its parent all the same (parent-death signal).
        multiprocessing.current_process().daemon = False
        started: list[ProcessPoolExecutor | BaseException] = []
        ready = threading.Event()

        def start_and_stay() -> None:
            try:
                pool = ProcessPoolExecutor(
                    self.processes, mp_context=SPAWN, initializer=_start_process, initargs=(self.started,)
                )
                wait([pool.submit(_ready) for _ in range(self.processes)])
                started.append(pool)
            except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread below
                started.append(exc)
            ready.set()
            retired.wait()  # the parent-death signal of the pool's processes is this thread's

        threading.Thread(target=start_and_stay, name="hsd-draft-processes", daemon=True).start()
        ready.wait()
        if isinstance(started[0], BaseException):
            raise started[0]
        return started[0]


# A draft process's peak memory: its OCR and layout models and a page (measured: 0.8-1.2 GiB).
DRAFT_PROCESS_BYTES = 5 << 28
MAX_DEFAULT_DRAFT_PROCESSES = 16


def default_draft_processes(model_on_accelerator: bool) -> int:
    """Draft processes where --draft-workers is not given and a model reads the pages. With the
    model on a GPU the CPUs are free for drafting: one process per CPU but one (the worker's own
    work), as many as half the available memory holds, at most MAX_DEFAULT_DRAFT_PROCESSES. With
    the model on the CPU its forwards take the cores drafting would use: none (on 2 cores, one
    process changed nothing beyond run-to-run noise; docs/BENCHMARKS.md)."""
    if not model_on_accelerator:
        return 0
    available = available_memory()
    by_memory = MAX_DEFAULT_DRAFT_PROCESSES if available is None else available // 2 // DRAFT_PROCESS_BYTES
    return max(0, min(MAX_DEFAULT_DRAFT_PROCESSES, (os.cpu_count() or 1) - 1, by_memory))


def threads_per_process(processes: int) -> int:
    """The cores each of `processes` draft processes may use, so that together they fill the
    machine without oversubscribing it."""
    return max(1, (os.cpu_count() or 1) // processes)


_SHARED: dict[int, DraftProcesses] = {}
_SHARING = threading.Lock()


def shared_draft_processes(processes: int, started: Callable[[], None]) -> DraftProcesses:
    """The worker process's draft processes: one pool for every document in flight in it."""
    with _SHARING:
        if processes not in _SHARED:
            _SHARED[processes] = DraftProcesses(processes, started)
        return _SHARED[processes]


def stop_draft_processes() -> None:
    """End this process's draft processes, if it has any (DraftProcesses.stop)."""
    with _SHARING:
        for processes in _SHARED.values():
            processes.stop()
        _SHARED.clear()
