"""A conversion run over many documents: discovery, resume, isolation, reporting, exit code."""

from __future__ import annotations

import hashlib
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import replace
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hsd_cli.document.inputs import InputDocument, OutputPaths, assign_outputs, discover
from hsd_cli.batch.local_executor import LocalExecutor
from hsd_cli.batch.reporting import EventLog, Reporter, manifest_record, run_summary
from hsd_cli.batch.resolve import resolve_schedule
from hsd_cli.batch.schedule import Part, Schedule, SplitDocument
from hsd_cli.document.tasks import DocumentOutcome, DocumentTask, config_hash, file_sha256
from hsd_cli.batch.worker import Limits, ProgressSink, WorkerPool
from hsd_cli.config import ConvertConfig, Executor, ModelConfig, ResolvedConfig, RunConfig, parse_shard
from hsd_cli.output.manifest import STATE_DIR, Manifest, OutputLock, remove_stale_temp_files
from hsd_cli.records.kinds import DocStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    from hsd_cli.batch.ray_executor import RayExecutor


class ExitCode(IntEnum):
    OK = 0
    SOME_FAILED = 1
    USAGE = 2
    NO_INPUT = 3
    ENVIRONMENT = 4
    INTERRUPTED = 130


def read_files_from(source: str, null_separated: bool) -> list[str]:
    """Paths listed in a file or on stdin ('-'), one per line or NUL-separated."""
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    items = text.split("\0") if null_separated else text.splitlines()
    return [item for item in items if item.strip()]


def in_shard(relpath: Path, shard: str | None) -> bool:
    """Stable across machines and input sets: the shard depends on the document's own path only."""
    if shard is None:
        return True
    index, count = parse_shard(shard)
    digest = hashlib.sha256(str(relpath).encode()).digest()
    return int.from_bytes(digest[:8], "big") % count == index - 1


def open_executor(config: ConvertConfig, run: RunConfig, resolved: ResolvedConfig) -> LocalExecutor | RayExecutor:
    schedule = resolved.schedule
    if run.executor is Executor.LOCAL:
        return LocalExecutor(schedule.rows, schedule.docs_per_worker)
    from hsd_cli.batch.ray_executor import RayExecutor  # imports ray: only when asked for

    return RayExecutor.connect(
        run.ray_address, run.gpus_per_worker, config.output_dir, schedule.rows, schedule.docs_per_worker,
    )


class BatchRun:
    """One `hsd convert` invocation over its documents, holding the output lock throughout."""

    def __init__(
        self, config: ConvertConfig, run: RunConfig, resolved: ResolvedConfig, reporter: Reporter, events: EventLog,
    ) -> None:
        self.config = config
        self.run = run
        self.resolved = resolved
        self.reporter = reporter
        self.events = events
        self.config_hash = config_hash(resolved)
        schedule = resolved.schedule
        self.limits = Limits(schedule.page_timeout, schedule.doc_timeout, schedule.docs_per_worker)
        # Held while the manifest, the display and the events take a finished document: documents
        # finish on several threads when the executor runs several workers.
        self.recording = threading.Lock()

    def convert_one(
        self, index: int, doc: InputDocument, outputs: OutputPaths, manifest: Manifest, pool: WorkerPool, schedule: Schedule
    ) -> DocumentOutcome | None:
        """The document's outcome, or None where it split into parts (config.document_parts):
        the schedule then holds its other parts, and the pool that finishes the last one records it."""
        key = str(outputs.markdown.relative_to(self.config.output_dir).with_suffix(""))
        try:
            sha256 = file_sha256(doc.path)
        except OSError as exc:
            return self.record(DocumentOutcome(input=str(doc.path), status=DocStatus.FAILED, error=f"cannot read: {exc.strerror}"))
        decision = manifest.decide(
            key, sha256, self.config_hash, self.config.model, self.run.overwrite, self.run.retry_failed
        )
        if not decision.run:
            return self.record(DocumentOutcome(
                input=str(doc.path), status=decision.status, error=decision.error, sha256=sha256, note=decision.reason
            ))
        task = DocumentTask(
            doc=doc,
            outputs=outputs,
            config=self.resolved,
            sha256=sha256,
            checkpoint_dir=self.config.output_dir / STATE_DIR / "pages" / f"{sha256[:16]}-{self.config_hash}",
            parts=schedule.parts,
        )
        self.events.emit("doc_started", input=str(doc.path))
        document = SplitDocument(index, key, task, time.monotonic())
        outcome = pool.convert(task, self._progress(task, lambda parts: schedule.split(document, parts)))
        if document.parts == 1:
            return self.finish(key, task, outcome, manifest)
        return self.part_done(document, outcome, pool, manifest)

    def convert_part(self, document: SplitDocument, part: int, pool: WorkerPool, manifest: Manifest) -> DocumentOutcome | None:
        """A later part of a split document; its document's outcome where this was the last part out."""
        task = replace(document.task, part=part)
        return self.part_done(document, pool.convert(task, self._progress(task)), pool, manifest)

    def part_done(
        self, document: SplitDocument, outcome: DocumentOutcome, pool: WorkerPool, manifest: Manifest
    ) -> DocumentOutcome | None:
        """The document's outcome where `outcome` was its last part out: a part that failed as a
        whole (--doc-timeout, a worker lost outside a page) fails it, else a last task assembles it
        from the parts' page checkpoints and writes it, as one document."""
        if not document.take(outcome):
            return None
        parts = document.outcomes
        failed = next((part for part in parts if part.status.is_failure), None)
        if failed is None:
            task = replace(document.task, parts=1, part=0)
            runs = [*parts, pool.convert(task, self._progress(task))]
        else:
            runs = parts
        tracebacks = "\n".join(run.traceback for run in runs if run.traceback)
        peaks = [run.peak_rss_mib for run in runs if run.peak_rss_mib is not None]
        whole = replace(
            failed or runs[-1], seconds=time.monotonic() - document.started, traceback=tracebacks or None,
            peak_rss_mib=max(peaks, default=None),
        )
        return self.finish(document.key, document.task, whole, manifest)

    def _progress(self, task: DocumentTask, on_parts: Callable[[int], None] | None = None) -> ProgressSink:
        """The document's progress events, to --events; "doc_parts" (into how many parts it splits)
        to `on_parts`."""

        def progress(name: str, payload: dict[str, Any]) -> None:
            if name == "doc_parts":
                if on_parts is not None:
                    on_parts(payload["parts"])
                return
            self.events.emit(name, input=str(task.doc.path), **payload)

        return progress

    def finish(self, key: str, task: DocumentTask, outcome: DocumentOutcome, manifest: Manifest) -> DocumentOutcome:
        """Record a converted document in the manifest, the events and the display; drop its checkpoints."""
        with self.recording:
            manifest.append(manifest_record(key, task.doc.path, outcome, self.config.model, self.config_hash))
        shutil.rmtree(task.checkpoint_dir, ignore_errors=True)
        self.events.emit(
            "doc_failed" if outcome.status.is_failure else "doc_done",
            input=str(task.doc.path),
            status=outcome.status.value,
            error=outcome.error,
            pages=outcome.pages,
        )
        return self.record(outcome)

    def record(self, outcome: DocumentOutcome) -> DocumentOutcome:
        with self.recording:
            self.reporter.document(outcome)
        return outcome

    def record_missing(self, path: Path, manifest: Manifest) -> DocumentOutcome:
        """A named input that does not exist: a failure in the summary and the manifest, keyed by
        its absolute path (output keys are relative, so the two never meet)."""
        outcome = DocumentOutcome(input=str(path), status=DocStatus.MISSING, error="no such file or directory")
        manifest.append(manifest_record(str(path.absolute()), path, outcome, self.config.model, self.config_hash))
        self.events.emit("doc_failed", input=str(path), status=outcome.status.value, error=outcome.error, pages=0)
        return self.record(outcome)

    def execute(self, planned: list[tuple[InputDocument, OutputPaths]], missing: list[Path]) -> list[DocumentOutcome]:
        """Missing inputs first, so a typo shows before a long batch; then the documents, on as
        many workers as the executor has room for. Outcomes come back in input order."""
        with OutputLock(self.config.output_dir):
            remove_stale_temp_files(self.config.output_dir)
            manifest = Manifest(self.config.output_dir)
            executor = open_executor(self.config, self.run, self.resolved)
            self.reporter.start(len(missing) + len(planned))
            try:
                outcomes = [self.record_missing(path, manifest) for path in missing]
                return outcomes + self._convert_all(planned, manifest, executor)
            finally:
                self.reporter.stop()
                executor.close()

    def _convert_all(
        self, planned: list[tuple[InputDocument, OutputPaths]], manifest: Manifest, executor: LocalExecutor | RayExecutor
    ) -> list[DocumentOutcome]:
        cancelled = threading.Event()
        schedule = Schedule(planned, self.resolved.schedule.rows, cancelled)
        pools = [
            WorkerPool(self.limits, executor.start_worker, cancelled)
            for _ in range(min(executor.slots, len(planned) * schedule.parts))
        ]
        outcomes: list[DocumentOutcome | None] = [None] * len(planned)

        def serve(pool: WorkerPool) -> None:
            try:
                while (work := schedule.take()) is not None:
                    if isinstance(work, Part):
                        index = work.document.index
                        outcome = self.convert_part(work.document, work.part, pool, manifest)
                    else:
                        index, (doc, outputs) = work
                        try:
                            outcome = self.convert_one(index, doc, outputs, manifest, pool, schedule)
                        finally:
                            schedule.settled(index)
                    if outcome is not None:
                        outcomes[index] = outcome
            finally:
                pool.close()

        threads = ThreadPoolExecutor(max_workers=max(1, len(pools)), thread_name_prefix="hsd-worker")
        futures = [threads.submit(serve, pool) for pool in pools]
        try:
            # The main thread waits in short slices so that Ctrl-C reaches it at once.
            while not all(future.done() for future in futures):
                wait(futures, timeout=0.25)
            for future in futures:
                future.result()  # a driver-side error (not a document's) ends the run
        except BaseException:
            cancelled.set()
            threads.shutdown(wait=True, cancel_futures=True)
            raise
        threads.shutdown(wait=True)
        return [outcome for outcome in outcomes if outcome is not None]


def run_convert(
    inputs: list[str],
    config: ConvertConfig,
    run: RunConfig,
    reporter: Reporter,
    events: EventLog | None = None,
    listed: list[str] | None = None,
    model: ModelConfig | None = None,
) -> tuple[ExitCode, dict[str, Any]]:
    """Convert everything `inputs` (and the --files-from entries `listed`) name, with `model` (the
    model options as serving.resolve resolved them; None: no model reads the pages); the
    OutputLockedError of a busy OUT propagates. The schedule is resolved here, before any worker
    starts, and every task carries the resolved options whole.

    A named path that does not exist is a failed input (status missing, exit code 1), also when
    nothing else is left to convert: exit code 3 means only that no directory or glob matched."""
    started = time.perf_counter()
    events = events or EventLog(None)
    found = discover(inputs, config.recursive, listed)
    for arg in found.unmatched:
        reporter.warn(f"no document matched {arg!r}")
    if not found.documents and not found.missing:
        return ExitCode.NO_INPUT, run_summary(
            [], started, int(ExitCode.NO_INPUT), config.output_dir, config.model, run.max_rows, config.near_lossless
        )
    # A missing file belongs to one shard, as it would if it existed.
    missing = [path for path in found.missing if in_shard(Path(path.name), run.shard)]
    # Output names come from the whole input set, so every shard names a document alike.
    planned = [
        (doc, outputs)
        for doc, outputs in zip(found.documents, assign_outputs(found.documents, config.output_dir), strict=True)
        if in_shard(doc.relpath, run.shard)
    ]
    if config.model is None and not reporter.quiet:
        reporter.warn("no VLM configured: converting with the draft pipeline only (name one with --model ID|DIR)")
    schedule = resolve_schedule(config, model, run, reporter, [doc for doc, _ in planned])
    resolved = ResolvedConfig(document=config.document, model=model, schedule=schedule)
    events.emit(
        "run_started", documents=len(missing) + len(planned), output_dir=str(config.output_dir), max_rows=schedule.rows
    )
    outcomes = BatchRun(config, run, resolved, reporter, events).execute(planned, missing)
    failed = any(outcome.status.is_failure for outcome in outcomes)
    code = ExitCode.SOME_FAILED if failed else ExitCode.OK
    summary = run_summary(outcomes, started, int(code), config.output_dir, config.model, schedule.rows, config.near_lossless)
    events.emit("run_done", exit_code=int(code), counts=summary["counts"])
    reporter.summary(summary)
    return code, summary
