"""The executor's places for shared workers (shared_worker.SharedWorkers), as Ray uses them with
several actors: documents spread over the workers before they fill a worker's rows, a full
executor waits for a channel to close, a worker gone is replaced at once; a document whose
thread raised fails its own channel only; the document threads of a worker report such an error
instead of losing it. An in-process worker stands in for a process or an actor."""

from __future__ import annotations

import queue
import threading

import pytest

from hsd_cli.batch import worker
from hsd_cli.batch.shared_worker import SharedWorker, SharedWorkers
from hsd_cli.batch.worker import RESTARTED, WORKER_ERROR, DocumentThreads


class InboxWorker(SharedWorker):
    """A worker in this process: what it is sent is kept, its events come from `inbox` (None: it is gone)."""

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.sent: list = []
        super().__init__()

    def _start(self) -> None:
        pass

    def _receive(self):
        return self.inbox.get()

    def _send(self, channel, task) -> None:
        self.sent.append((channel, task))

    def _finish(self) -> None:
        pass

    def _kill(self) -> None:
        self.inbox.put(None)

    def _crash(self) -> str:
        return "crash"


@pytest.fixture
def executor():
    workers = SharedWorkers(places=2, rows=2, max_docs_per_worker=10, start=InboxWorker)
    yield workers
    workers.close()


def test_documents_spread_over_the_workers_before_they_fill_a_workers_rows(executor):
    channels = [executor.start_worker() for _ in range(4)]
    assert executor.slots == 4
    first, second = channels[0].shared, channels[1].shared
    assert first is not second, "the second document goes to a worker of its own (a device of its own)"
    assert [channel.shared for channel in channels] == [first, second, first, second]
    fifth: list = []
    waiting = threading.Thread(target=lambda: fifth.append(executor.start_worker()))
    waiting.start()
    waiting.join(1.5)
    assert waiting.is_alive(), "every row of every worker is taken: the fifth waits"
    channels[1].stop()
    waiting.join(10)
    assert fifth[0].shared is second, "the row freed is taken, on the worker that had it"


def test_a_worker_gone_is_replaced_and_its_other_channels_see_it_restarted(executor):
    killer, other = executor.start_worker(), executor.start_worker()
    third = executor.start_worker()
    assert third.shared is killer.shared
    killer.kill()
    assert third.lost() == RESTARTED and other.lost() is None
    fresh = executor.start_worker()
    assert fresh.shared not in (killer.shared, other.shared), "the gone worker's place gets a fresh one"


def test_a_document_whose_thread_raised_fails_its_own_channel_only(executor):
    failing, other = executor.start_worker(), executor.start_worker()
    other_on_it = executor.start_worker()  # the same worker as `failing`
    failing.submit("task")
    failing.shared.inbox.put((failing.number, WORKER_ERROR, "worker error (ImportError: no torch)"))
    failing.shared.inbox.put((other_on_it.number, "page_started", {"page": 1}))
    assert other_on_it.next_event(10) == ("page_started", {"page": 1})
    assert failing.lost() == "worker error (ImportError: no torch)"
    assert other_on_it.lost() is None and other.lost() is None
    assert failing.next_event(0.1) is None, "the error is the channel's end, not one of its events"


def test_document_threads_report_an_error_that_escapes_a_document(monkeypatch):
    def broken(task, emit, alone):
        emit("doc_running", {})
        raise ImportError("the pipeline cannot be imported")

    monkeypatch.setattr(worker, "run_document", broken)
    sent, errors = [], []
    threads = DocumentThreads(lambda *event: sent.append(event), lambda channel, exc: errors.append((channel, exc)))
    threads.start(7, "task")
    threads.join()
    assert sent == [(7, "doc_running", {})]
    assert [(channel, str(exc)) for channel, exc in errors] == [(7, "the pipeline cannot be imported")]
    assert threads.in_flight == 0


def test_a_documents_clocks_stop_while_it_waits_for_another_document():
    from hsd_cli.batch.worker import DocumentClocks, Limits

    clocks = DocumentClocks.start(Limits(page_timeout=2.0, doc_timeout=10.0, max_docs_per_worker=1, page_kill_grace_s=1.0), now=0.0)
    clocks.page_started(now=0.0)
    assert not clocks.page_over(2.9) and clocks.page_over(3.0), "the page's timeout and the kill grace"
    clocks.waits(now=1.0)
    assert not clocks.page_over(100.0) and not clocks.doc_over(100.0), "no clock runs while it waits"
    clocks.runs(now=5.0)
    assert not clocks.page_over(6.9) and clocks.page_over(7.0), "the page's deadline moved by the 4 s waited"
    clocks.page_done()
    assert not clocks.page_over(1e9) and not clocks.doc_over(13.9) and clocks.doc_over(14.0)
    clocks.resent()
    assert clocks.waiting_since is None and clocks.doc_deadline == 14.0, "a resend keeps the document's clock"
