"""Several documents in one local worker process (`--max-rows`), below the pipeline: the shared
process routes each event to its channel; a stop through one channel is RESTARTED to the others,
after the events they have not read; a crash is a crash to all; recycling waits for the open
channels; a crash is blamed on the document whose work it died of; the WorkerPool counts no death
for a restart or another document's crash, and stops its clocks while its document waits for another; the pipeline lock lets documents overlap only in `released()`.
A scripted worker process (or worker object) stands in for the pipeline."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from hsd_cli.batch import local_executor
from hsd_cli.config import ConvertConfig, Executor, RunConfig, UsageError
from hsd_cli.document.inputs import InputDocument, OutputPaths
from hsd_cli.batch.local_executor import LocalExecutor, SharedProcess
from hsd_cli.serving.pipeline_lock import holding, released
from hsd_cli.records.kinds import DocStatus
from hsd_cli.document.tasks import DocumentOutcome, DocumentTask
from hsd_cli.batch.worker import CRASHED_ELSEWHERE, RESTARTED, Limits, WorkerPool
from tests.conftest import run_hsd
from tests.fixtures import resolved


@pytest.fixture(autouse=True)
def importable_in_a_spawned_process(monkeypatch):
    """A spawned worker process imports this module to find `scripted_worker`, with the parent's
    sys.path: under PYTHONSAFEPATH (CI) the checkout is not on it, so it goes last (the installed
    hsd_cli still comes first)."""
    monkeypatch.setattr(sys, "path", [*sys.path, str(Path(__file__).resolve().parents[1])])


def scripted_worker(tasks, events) -> None:
    """A worker process whose tasks are lists of steps, each on a thread of its own: an event name
    to send on the task's channel, "hang", or "die" (SIGKILL, as a segfault would)."""
    sending = threading.Lock()

    def run(channel, steps) -> None:
        for step in steps:
            if step == "hang":
                time.sleep(3600)
            elif step == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            with sending:
                events.send((channel, step, {}))

    while (message := tasks.get()) is not None:
        threading.Thread(target=run, args=message, daemon=True).start()


def _names_until_done(channel) -> list[str]:
    names = []
    while not names or names[-1] != "doc_done":
        event = channel.next_event(10)
        assert event is not None, f"no event after {names}"
        names.append(event[0])
    return names


def _wait_until(condition, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def shared():
    process = SharedProcess(target=scripted_worker)
    yield process
    process.stop()


def test_each_channel_gets_its_own_events_in_order(shared):
    first, second = shared.open_channel(lambda: None), shared.open_channel(lambda: None)
    first.submit(["a1", "a2", "doc_done"])
    second.submit(["b1", "doc_done"])
    assert _names_until_done(first) == ["a1", "a2", "doc_done"]
    assert _names_until_done(second) == ["b1", "doc_done"]
    assert first.lost() is None and shared.documents == 2 and first.documents == 2


def test_a_kill_through_one_channel_is_restarted_to_the_others_after_their_unread_events(shared):
    killer, other = shared.open_channel(lambda: None), shared.open_channel(lambda: None)
    other.submit(["b1", "b2", "hang"])
    killer.submit(["hang"])
    _wait_until(lambda: other.events.qsize() == 2)
    killer.kill()
    _wait_until(shared.ended.is_set)
    assert other.lost() is None, "its events are read first: one of them may end its page"
    assert [other.next_event(1)[0], other.next_event(1)[0]] == ["b1", "b2"]
    assert other.lost() == RESTARTED and shared.gone
    other.submit(["b3"])  # a late submission to the stopped process is dropped, not an error


def test_a_process_that_dies_by_itself_is_a_crash_to_every_channel_none_of_whose_documents_said_what_it_did(shared):
    dying, other = shared.open_channel(lambda: None), shared.open_channel(lambda: None)
    other.submit(["hang"])
    dying.submit(["die"])
    _wait_until(lambda: dying.lost() is not None)
    dying.kill()  # as its pool does on a death: the others still see a crash, not a restart
    assert dying.lost() == other.lost() == "crash (exit code -9)"


@pytest.mark.parametrize("others_state", ["doc_model", "doc_waiting"])
def test_a_crash_is_blamed_on_the_document_that_ran_its_pipeline(shared, others_state):
    dying, other = shared.open_channel(lambda: None), shared.open_channel(lambda: None)
    other.submit([others_state, "hang"])
    _wait_until(lambda: other.events.qsize() == 1)
    dying.submit(["doc_running", "die"])
    assert dying.next_event(10)[0] == "doc_running"
    _wait_until(lambda: dying.lost() is not None)
    assert dying.lost() == "crash (exit code -9)"
    assert other.next_event(1)[0] == others_state and other.lost() == CRASHED_ELSEWHERE


def test_a_crash_while_no_document_ran_its_pipeline_is_blamed_on_those_waiting_for_the_model(shared):
    in_model, waiting = shared.open_channel(lambda: None), shared.open_channel(lambda: None)
    waiting.submit(["doc_waiting", "hang"])
    _wait_until(lambda: waiting.events.qsize() == 1)
    in_model.submit(["doc_model", "die"])
    assert in_model.next_event(10)[0] == "doc_model"
    _wait_until(lambda: in_model.lost() is not None)
    waiting.next_event(1)
    assert (in_model.lost(), waiting.lost()) == ("crash (exit code -9)", CRASHED_ELSEWHERE)


def test_a_process_due_for_recycling_is_replaced_once_its_channels_have_closed(monkeypatch):
    monkeypatch.setattr(local_executor, "SharedProcess", lambda: SharedProcess(target=scripted_worker))
    executor = LocalExecutor(slots=2, max_docs_per_worker=2)
    try:
        first, second = executor.start_worker(), executor.start_worker()
        assert first.shared is second.shared
        first.submit(["doc_done"])
        second.submit(["doc_done"])
        assert _names_until_done(first) == _names_until_done(second) == ["doc_done"]
        first.stop()
        fresh = []
        waiting = threading.Thread(target=lambda: fresh.append(executor.start_worker()))
        waiting.start()
        waiting.join(1.5)
        assert waiting.is_alive(), "a process due takes no new channel while another is open on it"
        second.stop()
        waiting.join(10)
        assert fresh[0].shared is not first.shared and first.shared.gone
        killed = fresh[0].shared
        fresh[0].kill()
        assert executor.start_worker().shared is not killed, "a killed process is replaced at once"
    finally:
        executor.close()


class FakeWorker:
    """A `worker.Worker` in this process: scripted (seconds after the submission, event) pairs, then
    `lost()` says `death` (None: it goes on running)."""

    def __init__(self, script: list[tuple[float, tuple[str, object]]], death: str | None = None) -> None:
        self.script = script
        self.death = death
        self.documents = 0
        self.submitted: list[DocumentTask] = []

    def submit(self, task: DocumentTask) -> None:
        self.documents += 1
        self.submitted.append(task)
        self.started = time.monotonic()

    def next_event(self, timeout: float):
        if not self.script:
            time.sleep(timeout)
            return None
        due = self.started + self.script[0][0]
        if due - time.monotonic() > timeout:
            time.sleep(timeout)
            return None
        time.sleep(max(0.0, due - time.monotonic()))
        return self.script.pop(0)[1]

    def lost(self) -> str | None:
        return self.death if not self.script else None

    def kill(self) -> None:
        pass

    def stop(self) -> None:
        pass


def _task(tmp_path: Path) -> DocumentTask:
    doc = InputDocument(path=tmp_path / "a.pdf", relpath=Path("a.pdf"), kind="pdf")
    outputs = OutputPaths(markdown=tmp_path / "a.md", json=tmp_path / "a.json", images_dir=tmp_path / "a_images")
    config = resolved(ConvertConfig(output_dir=tmp_path))
    return DocumentTask(doc=doc, outputs=outputs, config=config, sha256="0", checkpoint_dir=tmp_path)


def _convert(workers: list[FakeWorker], tmp_path: Path, page_timeout: float = 0.0) -> tuple[DocumentOutcome, list]:
    events = []
    pool = WorkerPool(Limits(page_timeout, 0.0, 50, page_kill_grace_s=0.0), lambda: workers.pop(0), threading.Event())
    outcome = pool.convert(_task(tmp_path), lambda name, payload: events.append((name, payload)))
    return outcome, events


DONE = ("doc_done", DocumentOutcome(input="a.pdf", status=DocStatus.OK))


def test_a_restart_for_another_document_resends_without_blame(tmp_path):
    restarted = FakeWorker([(0, ("page_started", {"page": 1}))], death=RESTARTED)
    fresh = FakeWorker([(0, ("page_started", {"page": 1})), (0, ("page_done", {"page": 1})), (0, DONE)])
    # Twice the same page: were a restart a death, the second would lose the page.
    outcome, events = _convert([restarted, FakeWorker(list(restarted.script), RESTARTED), fresh], tmp_path)
    assert outcome.status is DocStatus.OK
    assert [name for name, _ in events].count("worker_lost") == 2 and "page_lost" not in [name for name, _ in events]
    assert fresh.submitted[0].lost_pages == {}


def test_a_crash_of_another_documents_work_is_not_this_documents_death(tmp_path):
    def crashed_elsewhere() -> FakeWorker:
        return FakeWorker([(0, ("page_started", {"page": 1})), (0, ("doc_model", {}))], death=CRASHED_ELSEWHERE)

    outcome, events = _convert([crashed_elsewhere(), crashed_elsewhere(), FakeWorker([(0, DONE)])], tmp_path)
    assert outcome.status is DocStatus.OK, "two deaths on its page would have lost it"
    assert [payload["reason"] for name, payload in events if name == "worker_lost"] == [CRASHED_ELSEWHERE] * 2


def test_the_page_clock_stops_while_the_document_waits_for_another(tmp_path):
    script = [
        (0, ("page_started", {"page": 1})), (0.1, ("doc_waiting", {})), (1.6, ("doc_running", {})),
        (1.7, ("page_done", {"page": 1})), (1.7, DONE),
    ]
    outcome, events = _convert([FakeWorker(script)], tmp_path, page_timeout=1.0)
    assert outcome.status is DocStatus.OK and "page_lost" not in [name for name, _ in events]
    # Without the wait, the same page runs out of time.
    stalled = FakeWorker([(0, ("page_started", {"page": 1})), (1.7, ("page_done", {"page": 1}))])
    fresh = FakeWorker([(0, DONE)])
    outcome, events = _convert([stalled, fresh], tmp_path, page_timeout=1.0)
    assert ("page_lost", {"page": 1, "reason": "timeout"}) in events and fresh.submitted[0].lost_pages == {1: "timeout"}


def test_documents_overlap_only_while_they_wait_for_the_model():
    order: list[str] = []
    states: list[str] = []  # the first document's
    model_wait = threading.Event()

    def first() -> None:
        with holding(states.append):
            order.append("first draws")
            with released():
                model_wait.wait(10)  # the model reads; the second document drafts meanwhile
            order.append("first writes")

    def second() -> None:
        with holding(lambda state: None):
            order.append("second draws")
            model_wait.set()
            time.sleep(0.2)  # still holding: the first cannot go on until it lets go
            order.append("second writes")

    one = threading.Thread(target=first)
    one.start()
    _wait_until(lambda: order == ["first draws"])
    two = threading.Thread(target=second)
    two.start()
    one.join(10)
    two.join(10)
    assert order == ["first draws", "second draws", "second writes", "first writes"]
    assert states == ["running", "model", "waiting", "running"], "the first waited its turn back once, and said so"
    with released():  # no lock held on this thread: a no-op
        pass


def test_max_rows_is_an_option_with_its_checks(tmp_path):
    with pytest.raises(UsageError, match="--max-rows must be at least 1"):
        RunConfig(max_rows=0)
    assert RunConfig(max_rows=2, executor=Executor.RAY).max_rows == 2, "Ray actors take rows too"
    config = tmp_path / "hsd.toml"
    config.write_text("[convert]\nmax-rows = 3\n")
    shown = run_hsd("config", "show", "--config", config, "-o", tmp_path)
    assert f"max-rows = 3  # config {config}" in shown.stdout.splitlines()
