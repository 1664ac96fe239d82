"""Documents on a Ray cluster (`--executor ray`): one worker actor per slot, driven like a local
worker process, one document at a time (`--max-rows` above 1 is refused with Ray: config.RunConfig).

The driver keeps everything a run guarantees (the manifest, the lock, deadlines, resume): an
actor only converts the document it is sent, writing its outputs and page checkpoints to OUT,
which every node must see, and streams its progress events back. An actor that dies (a crash, a
SIGKILL, a lost node) is replaced, and the document resumes from its checkpoints on the new one.
The only module that imports ray.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsd_cli.output.manifest import STATE_DIR
from hsd_cli.tasks import DocumentTask
from hsd_cli.worker import ExecutorUnavailableError

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


@ray.remote(max_restarts=0, max_task_retries=0)
class DocumentActor:
    """A worker on a Ray node; the pipeline's models load once per actor, as in a worker process."""

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no weight-loading bars in batch logs
        # Ray sizes torch's threads (OMP_NUM_THREADS) to the actor's CPUs, but onnxruntime (the draft's
        # layout and OCR models) sizes its pools to the node's cores: with one actor per CPU the
        # pools oversubscribe the node and each document took twice as long. Read when a session
        # is created, which is after this (the pipeline loads in `convert`).
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
        os.environ.setdefault("ORT_INTRA_OP_NUM_THREADS", str(max(1, int(cpus))))

    def sees(self, probe: str) -> str | None:
        """The probe file's content as this actor's node reads it (None: not there)."""
        try:
            return Path(probe).read_text()
        except OSError:
            return None

    def convert(self, task: DocumentTask) -> Iterator[tuple[str, Any]]:
        """The document's progress events as they happen, then ("doc_done", outcome)."""
        from hsd_cli.worker import run_document

        events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

        def work() -> None:
            try:
                run_document(task, lambda name, payload: events.put((name, payload)))
            except BaseException as exc:  # noqa: BLE001 - e.g. the worker cannot import the pipeline
                events.put(("worker_error", exc))

        # The pipeline reports through a callback; a thread lets this generator yield meanwhile.
        threading.Thread(target=work, daemon=True).start()
        while True:
            event = events.get()
            if event[0] == "worker_error":
                # Raised here, the driver sees the worker fail instead of waiting for an outcome.
                raise event[1]
            yield event
            if event[0] == "doc_done":
                return


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


class RayWorker:
    """The driver's handle on one actor (the `Worker` a WorkerPool drives)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.stream: Any = None
        self.gone: str | None = None
        self.documents = 0

    def submit(self, task: DocumentTask) -> None:
        self.documents += 1
        self.stream = self.actor.convert.remote(task)

    def next_event(self, timeout: float) -> tuple[str, Any] | None:
        ready, _ = ray.wait([self.stream], timeout=timeout)
        if not ready:
            return None
        try:
            return ray.get(next(self.stream))
        except StopIteration:
            self.gone = "stream ended without an outcome"
        except RayActorError as exc:
            self.gone = f"crash ({type(exc).__name__})"
        except RayError as exc:  # the worker raised: its cause, in one line
            cause = getattr(exc, "cause", None) or exc
            self.gone = f"worker error ({type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''})"
        return None

    def lost(self) -> str | None:
        return self.gone

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)

    def stop(self) -> None:
        self.kill()  # an actor between documents holds nothing to flush


@dataclass
class RayExecutor:
    """A connection to a Ray cluster with room for `slots` worker actors."""

    slots: int
    actor_options: dict[str, Any]
    started_ray: bool  # this run started Ray on this machine, and stops it at the end
    # Ray prints cluster errors (a worker died, ...) on sys.stdout, where `--json` writes its one
    # object: while Ray is connected, sys.stdout is stderr (streams opened before, such as
    # `--events -`, keep the real stdout).
    stdout: Any = field(default_factory=lambda: sys.stdout)

    def __post_init__(self) -> None:
        sys.stdout = sys.stderr

    @classmethod
    def connect(cls, address: str | None, gpus_per_worker: float, output_dir: Path) -> RayExecutor:
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
            slots = int(resources.get("GPU", 0) // gpus_per_worker)
            options = {"num_cpus": 1, "num_gpus": gpus_per_worker}
        else:
            slots = int(resources.get("CPU", 0))
            options = {"num_cpus": 1}
        executor = cls(slots=slots, actor_options=options, started_ray=started_ray)
        if slots < 1:
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

    def start_worker(self) -> RayWorker:
        return RayWorker(DocumentActor.options(**self.actor_options).remote())

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
                raise ExecutorUnavailableError(f"Ray workers could not start: {exc}", None) from None
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
        if self.started_ray:
            ray.shutdown()
        sys.stdout = self.stdout
