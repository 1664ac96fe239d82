"""`--executor ray` on a local Ray cluster that the tests start: the same bytes and statuses as a
local run, a killed worker actor replaced without losing or repeating a document, resume after
the driver is killed, and clear errors where Ray cannot run the batch. With a model and
`--max-rows N`, each actor converts N documents at once, as a local worker process does: the
bytes of one document at a time, and an actor killed with its rows in flight costs no page."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import run_hsd
from tests.fixtures import distinct_copies
from tests.test_batch import _manifest, _statuses
from tests.test_max_rows import _model_args, _outputs

ray = pytest.importorskip("ray")

# Every test here starts Ray or drives a run through it: the slow tier.
pytestmark = pytest.mark.slow


# Ray puts a driver's working directory first on its workers' import path. The tests run in the
# checkout, whose hsd_cli is not the installed package (CI installs a wheel): drivers here start
# in a directory that holds no source tree, as users' runs do.
NEUTRAL_DIR = Path(tempfile.gettempdir())


@pytest.fixture(scope="module")
def cluster() -> str:
    """A 2-CPU Ray instance for this module; yields its address for drivers in other processes."""
    here = Path.cwd()
    os.chdir(NEUTRAL_DIR)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        os.chdir(here)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture
def corpus(tmp_path, docs_dir) -> Path:
    """Born-digital copies with distinct bytes, the scan, and a file that is no PDF."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    data = (docs_dir / "report.pdf").read_bytes()
    for n in range(3):
        (root / f"doc{n}.pdf").write_bytes(data + f"\n% copy {n}\n".encode())
    (root / "sub" / "scan.pdf").write_bytes((docs_dir / "scan.pdf").read_bytes())
    (root / "broken.pdf").write_text("not a pdf")
    return root


def _files(out: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(out)): path.read_bytes()
        for path in sorted(out.rglob("*"))
        if path.is_file() and ".hsd" not in path.parts
    }


def _manifest_statuses(out: Path) -> dict[str, str]:
    return {record["key"]: record["status"] for record in _manifest(out)}


def _driver(corpus: Path, out: Path, address: str, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "hsd_cli.cli", "convert", str(corpus), "-o", str(out), "-q",
               "--executor", "ray", "--ray-address", address, *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=NEUTRAL_DIR)


def _wait_for(condition, seconds: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None and not condition():
        time.sleep(0.1)
    assert proc.poll() is None, f"the run ended before the kill: {proc.communicate()}"
    assert condition(), "the run never got there"


def test_ray_writes_the_bytes_and_statuses_of_a_local_run(cluster, corpus, tmp_path):
    local = run_hsd("convert", corpus, "-o", tmp_path / "local", "--json")
    on_ray = run_hsd("convert", corpus, "-o", tmp_path / "ray", "--json", "--executor", "ray")
    assert local.exit_code == on_ray.exit_code == 1  # broken.pdf
    assert _statuses(on_ray) == _statuses(local) == {
        "doc0.pdf": "ok", "doc1.pdf": "ok", "doc2.pdf": "ok", "scan.pdf": "ok", "broken.pdf": "corrupt",
    }
    assert [d["input"] for d in json.loads(on_ray.stdout)["documents"]] == [
        d["input"] for d in json.loads(local.stdout)["documents"]
    ], "the summary lists documents in input order, whatever order they finished in"
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")
    assert _manifest_statuses(tmp_path / "ray") == _manifest_statuses(tmp_path / "local")
    again = run_hsd("convert", corpus, "-o", tmp_path / "ray", "--json", "--executor", "ray")
    assert set(_statuses(again).values()) == {"skipped", "corrupt"}, "resume works the same on Ray"


def _actor_pids() -> list[int]:
    found = subprocess.run(["pgrep", "-f", "ray::DocumentActor"], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split()]


def test_a_worker_actor_killed_mid_run_loses_and_repeats_nothing(cluster, corpus, tmp_path):
    (corpus / "broken.pdf").unlink()
    out, events = tmp_path / "out", tmp_path / "events.ndjson"
    proc = _driver(corpus, out, cluster, "--events", str(events), "--json")

    def on_a_page() -> bool:
        return events.exists() and '"page_started"' in events.read_text() and bool(_actor_pids())

    _wait_for(on_a_page, 240, proc)
    for pid in _actor_pids():
        os.kill(pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    assert json.loads(stdout)["counts"]["ok"] == 4, "stdout holds the summary only, not Ray's notices"
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert any(line["event"] == "worker_lost" for line in lines), "the kill hit a worker at work"
    assert not any(line["event"] == "page_lost" for line in lines), "one death costs no page"
    assert sorted(record["key"] for record in _manifest(out)) == ["doc0", "doc1", "doc2", "sub/scan"]
    assert {record["status"] for record in _manifest(out)} == {"ok"}
    assert not list(out.rglob("*.tmp"))


def test_a_killed_ray_driver_resumes_where_it_stopped(cluster, corpus, tmp_path):
    (corpus / "broken.pdf").unlink()
    for n in range(3, 8):
        (corpus / f"doc{n}.pdf").write_bytes((corpus / "doc0.pdf").read_bytes() + f"% {n}\n".encode())
    out = tmp_path / "out"
    proc = _driver(corpus, out, cluster)
    manifest = out / ".hsd" / "manifest.jsonl"
    _wait_for(lambda: manifest.exists() and len(manifest.read_text().splitlines()) >= 2, 240, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {record["key"] for record in _manifest(out)}
    assert 2 <= len(done_before) < 9

    events = tmp_path / "events.ndjson"
    rerun = run_hsd("convert", corpus, "-o", out, "--json", "--executor", "ray", "--events", events)
    assert rerun.exit_code == 0
    started = {Path(json.loads(line)["input"]).stem for line in events.read_text().splitlines()
               if json.loads(line)["event"] == "doc_started"}
    assert started.isdisjoint({Path(key).name for key in done_before}), "finished documents are not redone"
    assert sorted(record["key"] for record in _manifest(out) if record["status"] == "ok") == sorted(
        [f"doc{n}" for n in range(8)] + ["sub/scan"]
    )
    assert not list(out.rglob("*.tmp"))


def test_an_unreachable_cluster_is_one_clear_error_before_any_work(docs_dir, tmp_path):
    # A driver process of its own: in this one, Ray may be connected to the tests' cluster already.
    command = [sys.executable, "-m", "hsd_cli.cli", "convert", str(docs_dir), "-o", str(tmp_path),
               "--executor", "ray", "--ray-address", "127.0.0.1:1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 4
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in result.stderr and "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*.md"))


def test_ray_options_without_ray_executor_are_a_usage_error(docs_dir, tmp_path):
    result = run_hsd("convert", docs_dir, "-o", tmp_path, "--gpus-per-worker", "1")
    assert result.exit_code == 2 and "need --executor ray" in result.stderr


def test_output_not_shared_with_a_node_is_refused(cluster, docs_dir, tmp_path, monkeypatch):
    """A node that reads something else at OUT's path (its own disk) must stop the run at start."""
    from hsd_cli.batch import ray_executor

    # The driver writes one token and the nodes read another at the same path.
    monkeypatch.setattr(ray_executor, "_write_probe", lambda path, token: path.write_text("a node's own file"))
    result = run_hsd("convert", docs_dir, "-o", tmp_path, "--executor", "ray")
    assert result.exit_code == 4
    assert "is not visible from Ray node(s)" in result.stderr and "shared filesystem" in result.stderr
    assert not list(tmp_path.glob("*.md"))


def test_worker_actors_size_onnxruntime_to_their_cpus(cluster):
    """onnxruntime sizes its pools to the node's cores unless told; actors of one CPU each on a
    node must not each run pools as wide as the node (measured: twice the time per document)."""
    from hsd_cli.batch.ray_executor import DocumentActor

    def threads(actor: object) -> tuple[str | None, str | None]:
        return os.environ.get("ORT_INTRA_OP_NUM_THREADS"), os.environ.get("OMP_NUM_THREADS")

    for cpus in (1, 2):
        actor = DocumentActor.options(num_cpus=cpus).remote()
        try:
            assert ray.get(actor.__ray_call__.remote(threads), timeout=120) == (str(cpus), str(cpus))
        finally:
            ray.kill(actor)


def test_workers_that_cannot_import_hsd_end_the_run_before_any_work(cluster, docs_dir, tmp_path):
    """A driver started beside another `hsd_cli` (Ray gives its workers the driver's directory
    first on the import path): the actors cannot start, and the run ends at once with exit code 4
    and the workers' error in one line, as for any environment error (before, the error escaped the
    driver's worker thread, and an error in the actor's pipeline thread left the driver waiting)."""
    shadow = tmp_path / "cwd" / "hsd_cli"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('a source tree, not the installed hsd')\n")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "hsd_cli.cli", "convert", str(docs_dir / "report.pdf"), "-o", str(out),
               "--executor", "ray", "--ray-address", cluster, "--json", "-q"]
    # PYTHONSAFEPATH: the driver itself imports the installed hsd, only the workers see the shadow.
    proc = subprocess.run(command, capture_output=True, text=True, cwd=shadow.parent, timeout=600,
                          env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert proc.returncode == 4, proc.stderr
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "Ray workers could not start" in error and "a source tree, not the installed hsd" in error
    assert "Traceback" not in proc.stderr and not list(out.glob("*.md"))


@pytest.fixture(scope="module")
def model_corpus(docs_dir, tmp_path_factory) -> Path:
    """Four two-page born-digital documents with distinct bytes, for runs with the tiny model."""
    return distinct_copies(docs_dir / "report.pdf", tmp_path_factory.mktemp("ray-rows-corpus"), 4)


@pytest.fixture(scope="module")
def one_at_a_time(model_corpus, tiny_model, tmp_path_factory) -> dict[str, bytes]:
    """The outputs of a local run of one document at a time."""
    out = tmp_path_factory.mktemp("ray-rows-local")
    result = run_hsd("convert", model_corpus, "-o", out, "--json", "--max-rows", "1", *_model_args(tiny_model))
    assert result.exit_code == 0, result.stderr
    return _outputs(out)


def test_each_actor_takes_as_many_documents_as_it_has_rows(cluster, tmp_path):
    from hsd_cli.batch.ray_executor import RayExecutor

    (tmp_path / ".hsd").mkdir()  # a run's state directory, made by its output lock
    executor = RayExecutor.connect(None, 0.0, tmp_path, rows=2, max_docs_per_worker=100)
    try:
        channels = [executor.start_worker() for _ in range(4)]
        actors = [channel.shared for channel in channels]
        assert executor.slots == 4, "two actors (one per CPU of the cluster) of two rows each"
        assert actors[0] is not actors[1] and actors == [actors[0], actors[1], actors[0], actors[1]]
    finally:
        executor.close()


def test_actors_with_several_rows_write_the_bytes_of_one_document_at_a_time(cluster, model_corpus, tiny_model,
                                                                            one_at_a_time, tmp_path):
    out = tmp_path / "out"
    result = run_hsd("convert", model_corpus, "-o", out, "--json", "--executor", "ray", "--max-rows", "2",
                     *_model_args(tiny_model))
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["max_rows"] == 2 and set(_statuses(result).values()) == {"ok"}
    assert sorted(record["key"] for record in _manifest(out)) == [f"doc{n}" for n in range(4)]
    assert len(one_at_a_time) == 8 and _outputs(out) == one_at_a_time


def test_an_actor_killed_with_its_rows_in_flight_loses_and_repeats_nothing(cluster, model_corpus, tiny_model,
                                                                          one_at_a_time, tmp_path):
    out, events = tmp_path / "out", tmp_path / "events.ndjson"
    proc = _driver(model_corpus, out, cluster, "--events", str(events), "--json", "--max-rows", "2",
                   *map(str, _model_args(tiny_model)))

    def rows_in_flight() -> bool:
        started = events.read_text().count('"page_started"') if events.exists() else 0
        return started >= 2 and bool(_actor_pids())

    _wait_for(rows_in_flight, 240, proc)
    for pid in _actor_pids():
        os.kill(pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    assert json.loads(stdout)["counts"]["ok"] == 4
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert any(line["event"] == "worker_lost" for line in lines), "the kill hit documents at work"
    assert not any(line["event"] == "page_lost" for line in lines), "one death costs no page"
    assert sorted(record["key"] for record in _manifest(out)) == [f"doc{n}" for n in range(4)]
    assert _outputs(out) == one_at_a_time
    assert not list(out.rglob("*.tmp"))
