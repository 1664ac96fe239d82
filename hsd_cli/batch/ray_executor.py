"""Documents on a Ray cluster (`--executor ray`): one worker actor per slot of the cluster (a CPU,
or `--gpus-per-worker` GPUs), each converting as many documents at once as a local worker process
does (runner.documents_in_flight: `--max-rows` with a model), as a `shared_worker.SharedWorker`
with a channel per document: the same routing, recycling and blame of a crash.

The driver keeps everything a run guarantees (the manifest, the lock, deadlines, resume): an
actor only converts the documents it is sent, writing their outputs and page checkpoints to OUT,
which every node must see, and streams their progress events back. An actor that dies (a crash, a
SIGKILL, a lost node) is replaced, and its documents resume from their checkpoints on the new one.
Events an actor had sent but the driver had not read when it died are lost with it (Ray drops a
dead actor's unread stream), so a crash is blamed by the documents' states as last read.
The only module that imports ray.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsd_cli.output.manifest import STATE_DIR
from hsd_cli.batch.shared_worker import Event, SharedWorker, SharedWorkers, WorkerChannel
from hsd_cli.document.tasks import DocumentTask
from hsd_cli.batch.worker import (
    WORKER_ERROR,
    DocumentThreads,
    ExecutorUnavailableError,
    error_line,
)

try:
    import ray
    from ray.exceptions import RayActorError, RayError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as exc:  # the [ray] extra is optional
    raise ExecutorUnavailableError(
        "--executor ray needs Ray, which is not installed", "pip install 'hsd-cli[ray]'"
    ) from exc

# Settings that the worker reads from the environment (HSD_DEBUG_STALL, ...) reach actors on any
# node only through the job's runtime environment.
_FORWARDED_PREFIX = "HSD_"
CONNECT_TIMEOUT_S = 10


# Threaded: the event stream holds one of the actor's threads for its life, and `submit` (and
# the tests' probes) must run beside it. The documents run on threads of their own.
@ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=4)
class DocumentActor:
    """A worker on a Ray node; the pipeline's models load once per actor, as in a worker process."""

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no weight-loading bars in batch logs
        # Ray sizes torch's threads (OMP_NUM_THREADS) to the actor's CPUs, but onnxruntime (the draft's
        # layout and OCR models) sizes its pools to the node's cores: with one actor per CPU the
        # pools oversubscribe the node and each document took twice as long. Read when a session
        # is created, which is after this (the pipeline loads with the first document).
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
        os.environ.setdefault("ORT_INTRA_OP_NUM_THREADS", str(max(1, int(cpus))))
        self.outbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.documents = DocumentThreads(lambda *event: self.outbox.put(event), self._failed)

    def _failed(self, channel: int, exc: BaseException) -> None:
        # The actor goes on (a death would lose this reason with the stream): the driver sees the
        # channel lost, and its pool replaces the actor.
        self.outbox.put((channel, WORKER_ERROR, f"worker error ({error_line(exc)})"))

    def sees(self, probe: str) -> str | None:
        """The probe file's content as this actor's node reads it (None: not there)."""
        try:
            return Path(probe).read_text()
        except OSError:
            return None

    def submit(self, channel: int, task: DocumentTask) -> None:
        self.documents.start(channel, task)

    def events(self) -> Any:
        """Every document's (channel, name, payload) events, as they happen, for the actor's life."""
        while True:
            yield self.outbox.get()


class SharedActor(SharedWorker):
    """A worker actor: tasks in by method calls, events out through its one stream."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.actor: Any = None
        self.stream: Any = None
        self.death = "crash"
        super().__init__()

    def _start(self) -> None:
        self.actor = DocumentActor.options(**self.options).remote()
        self.stream = self.actor.events.remote()

    def _receive(self) -> Event | None:
        try:
            return ray.get(next(self.stream))
        except RayActorError as exc:
            # An actor whose start raised (it could not import hsd, ...): the error is the reason.
            self.death = f"worker error ({error_line(exc)})" if exc.actor_init_failed else f"crash ({type(exc).__name__})"
        except Exception as exc:  # noqa: BLE001 - any other end of the stream: the actor is of no use
            self.death = f"worker error ({error_line(getattr(exc, 'cause', None) or exc)})"
        return None

    def _send(self, channel: int, task: DocumentTask) -> None:
        self.actor.submit.remote(channel, task)

    def _finish(self) -> None:
        pass  # stopped when no document is in flight: an actor between documents holds nothing to flush

    def _kill(self) -> None:
        ray.kill(self.actor, no_restart=True)

    def _crash(self) -> str:
        return self.death


def _write_probe(path: Path, token: str) -> None:
    path.write_text(token)


def _check_reachable(address: str | None) -> None:
    """Ray retries an unreachable HOST:PORT for minutes, logging as it goes: fail at once instead."""
    if not address or address == "auto":
        return
    host, _, port = address.rpartition("://")[2].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise ExecutorUnavailableError(
            f"cannot reach the Ray cluster at {address}: {exc}",
            "start one with `ray start --head` and give the address it prints (or --ray-address auto on its head node)",
        ) from None


@dataclass
class RayExecutor:
    """A connection to a Ray cluster with room for `workers.places` worker actors."""

    workers: SharedWorkers
    started_ray: bool  # this run started Ray on this machine, and stops it at the end
    # Ray prints cluster errors (a worker died, ...) on sys.stdout, where `--json` writes its one
    # object: while Ray is connected, sys.stdout is stderr (streams opened before, such as
    # `--events -`, keep the real stdout).
    stdout: Any = field(default_factory=lambda: sys.stdout)

    def __post_init__(self) -> None:
        sys.stdout = sys.stderr

    @classmethod
    def connect(
        cls, address: str | None, gpus_per_worker: float, output_dir: Path, rows: int, max_docs_per_worker: int
    ) -> RayExecutor:
        """`rows`: documents each actor converts at once; `max_docs_per_worker`: an actor's
        documents before it is replaced (over all its rows)."""
        started_ray = not ray.is_initialized()
        if started_ray:
            _check_reachable(address)
            env = {key: value for key, value in os.environ.items() if key.startswith(_FORWARDED_PREFIX)}
            try:
                ray.init(
                    address=address, logging_level=logging.ERROR, log_to_driver=False, include_dashboard=False,
                    runtime_env={"env_vars": env} if env else None,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ExecutorUnavailableError(
                    f"cannot reach the Ray cluster {address or os.environ.get('RAY_ADDRESS') or '(local)'}: {exc}",
                    "start one with `ray start --head`, or give --ray-address HOST:PORT",
                ) from None
        resources = ray.cluster_resources()
        if gpus_per_worker:
            actors = int(resources.get("GPU", 0) // gpus_per_worker)
            options = {"num_cpus": 1, "num_gpus": gpus_per_worker}
        else:
            actors = int(resources.get("CPU", 0))
            options = {"num_cpus": 1}
        workers = SharedWorkers(actors, rows, max_docs_per_worker, lambda: SharedActor(options))
        executor = cls(workers=workers, started_ray=started_ray)
        if actors < 1:
            executor.close()
            raise ExecutorUnavailableError(
                f"the Ray cluster has no room for a worker ({resources.get('CPU', 0):g} CPUs, "
                f"{resources.get('GPU', 0):g} GPUs; --gpus-per-worker {gpus_per_worker:g})",
                "add nodes, or lower --gpus-per-worker",
            )
        try:
            executor.check_shared_output(output_dir)
        except ExecutorUnavailableError:
            executor.close()
            raise
        return executor

    @property
    def slots(self) -> int:
        return self.workers.slots

    def start_worker(self) -> WorkerChannel:
        return self.workers.start_worker()

    def check_shared_output(self, output_dir: Path) -> None:
        """Every node that may run a worker must see OUT: a probe written here is read back by
        actors spread over the nodes, before any document is sent."""
        probe = output_dir.absolute() / STATE_DIR / f"ray-probe-{secrets.token_hex(8)}"
        token = secrets.token_hex(16)
        _write_probe(probe, token)
        try:
            nodes = [node for node in ray.nodes() if node.get("Alive")]
            actors = [
                DocumentActor.options(
                    num_cpus=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                ).remote()
                for node in nodes
            ]
            try:
                seen = ray.get([actor.sees.remote(str(probe)) for actor in actors], timeout=120)
            except RayError as exc:
                # e.g. a node without hsd, or a source tree named hsd_cli where the driver started:
                # Ray puts that directory first on its workers' import path.
                raise ExecutorUnavailableError(
                    f"Ray workers could not start: {error_line(exc)}",
                    "install the same hsd on every node, and start the driver outside a source tree of hsd_cli",
                ) from None
            finally:
                for actor in actors:
                    ray.kill(actor)
        finally:
            probe.unlink(missing_ok=True)
        blind = [node.get("NodeManagerAddress", "?") for node, read in zip(nodes, seen) if read != token]
        if blind:
            raise ExecutorUnavailableError(
                f"output directory {output_dir} is not visible from Ray node(s) {', '.join(blind)}: "
                "workers write their outputs there",
                "give -o a path on storage every node mounts at the same place (a shared filesystem)",
            )

    def close(self) -> None:
        self.workers.close()
        if self.started_ray:
            ray.shutdown()
        sys.stdout = self.stdout
