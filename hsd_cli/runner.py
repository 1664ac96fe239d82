"""A conversion run over many documents: discovery, resume, isolation, reporting, exit code."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import IntEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from hsd_cli import __version__
from hsd_cli.config import ConvertConfig, Executor, RunConfig, parse_shard
from hsd_cli.inputs import InputDocument, OutputPaths, assign_outputs, discover
from hsd_cli.local_executor import LocalExecutor
from hsd_cli.output.manifest import STATE_DIR, Manifest, OutputLock, remove_stale_temp_files
from hsd_cli.tasks import DocumentOutcome, DocumentTask, config_hash, file_sha256, runs_model
from hsd_cli.records import DocStatus
from hsd_cli.stats import DecodingTotals
from hsd_cli.worker import Limits, WorkerPool, peak_rss_mib

if TYPE_CHECKING:
    from collections.abc import Callable

    from PIL import Image

    from hsd_cli.ray_executor import RayExecutor


class ExitCode(IntEnum):
    OK = 0
    SOME_FAILED = 1
    USAGE = 2
    NO_INPUT = 3
    ENVIRONMENT = 4
    INTERRUPTED = 130


_STATUS_STYLE = {
    DocStatus.OK: "green",
    DocStatus.DEGRADED: "yellow",
    DocStatus.SKIPPED: "dim",
}


class EventLog:
    """NDJSON events (run/doc/page started, done, failed) for --events FILE|-."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream = stream
        self.writing = threading.Lock()  # whole lines from every worker thread

    def emit(self, event: str, **fields: Any) -> None:
        if self.stream is None:
            return
        record = {"event": event, "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), **fields}
        with self.writing:
            self.stream.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.stream.flush()


@dataclass
class Reporter:
    """Everything human goes to stderr: a progress bar on a TTY, else one line per document."""

    console: Console
    quiet: bool = False
    debug: bool = False
    progress: Progress | None = field(default=None, init=False)

    def warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {escape(message)}", highlight=False, soft_wrap=True)

    def error(self, message: str, hint: str | None = None) -> None:
        self.console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
        if hint:
            self.console.print(f"  hint: {escape(hint)}", highlight=False, soft_wrap=True)

    def start(self, total: int) -> None:
        if self.console.is_terminal and not self.quiet:
            self.progress = Progress(
                TextColumn("[bold]converting"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=self.console,
                transient=True,
            )
            self.progress.start()
            self.progress.add_task("", total=total)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def document(self, outcome: DocumentOutcome) -> None:
        if self.progress is not None:
            self.progress.advance(0)
            self.progress.update(0, description=Path(outcome.input).name)
        style = _STATUS_STYLE.get(outcome.status, "red")
        label = f"[{style}]{outcome.status.value:<9}[/{style}]"
        if outcome.error:
            self.console.print(f"{label} {escape(outcome.input)}: {escape(outcome.error)}", highlight=False, soft_wrap=True)
        elif not self.quiet:
            backends = ", ".join(f"{name} x{count}" for name, count in sorted(outcome.draft_backends.items()))
            detail = f"{outcome.pages} pages, {outcome.seconds:.1f}s, draft: {backends}" if outcome.pages else outcome.note
            if outcome.decoding:
                speedup = outcome.decoding.speedup
                unit = "x" if speedup.kind == "measured" else "x est."
                detail += f", tau {outcome.decoding.tau:.2f}, speedup {speedup.value:.2f}{unit}"
            self.console.print(f"{label} {escape(outcome.input)} ({escape(detail)})", highlight=False, soft_wrap=True)
        for warning in outcome.warnings:
            self.warn(f"{outcome.input}: {warning}")
        if self.debug and outcome.traceback:
            self.console.print(outcome.traceback, highlight=False, markup=False)

    def summary(self, summary: dict[str, Any]) -> None:
        if self.quiet:
            return
        table = Table(title="hsd convert", title_justify="left")
        counts = {status: n for status, n in summary["counts"].items() if n}
        decoding = summary["decoding"]
        extra = ("tau", "speedup") if decoding else ()
        for column in ("documents", *counts, "pages", "seconds", "pages/s", *extra):
            table.add_column(column, justify="right", no_wrap=True)
        cells = [
            str(len(summary["documents"])),
            *(str(n) for n in counts.values()),
            str(summary["pages"]),
            f"{summary['seconds']:.1f}",
            f"{summary['pages_per_second']:.2f}",
        ]
        if decoding:
            speedup = decoding["speedup"]
            cells += [f"{decoding['tau']:.2f}", f"{speedup['value']:.2f}x" + ("" if speedup["kind"] == "measured" else " est.")]
        table.add_row(*cells)
        self.console.print(table)


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


def _manifest_record(
    key: str, path: Path, outcome: DocumentOutcome, config: ConvertConfig, chash: str
) -> dict[str, Any]:
    return {
        "key": key,
        "input": str(path),
        "size": path.stat().st_size if path.exists() else None,
        "sha256": outcome.sha256,
        "pages": outcome.pages,
        "page_count": outcome.page_count,
        "config_hash": chash,
        "model": config.model,
        "model_revision": None,
        "hsd_version": __version__,
        "status": outcome.status.value,
        "error": outcome.error,
        "failed_pages": {str(n): why for n, why in outcome.failed_pages.items()},
        "warnings": list(outcome.warnings),  # a page's notice among them: why it is not the model's full reading
        "outputs": outcome.outputs,
        "timings": {
            "seconds": round(outcome.seconds, 3),
            "pages": {str(n): {k: round(v, 4) for k, v in t.items()} for n, t in outcome.page_timings.items()},
        },
        "stats": {
            "draft_backends": outcome.draft_backends,
            "decoding": outcome.decoding.as_json() if outcome.decoding else None,
            "peak_rss_mib": outcome.peak_rss_mib,
        },
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def documents_in_flight(config: ConvertConfig, run: RunConfig) -> int:
    """Documents a local worker process converts at once: --max-rows where a model reads the pages
    (their rows share its forwards), else one (without a model nothing overlaps: pipeline_lock)."""
    return run.max_rows if runs_model(config) else 1


def open_executor(config: ConvertConfig, run: RunConfig) -> LocalExecutor | RayExecutor:
    if run.executor is Executor.LOCAL:
        return LocalExecutor(documents_in_flight(config, run), run.max_docs_per_worker)
    from hsd_cli.ray_executor import RayExecutor  # imports ray: only when asked for

    return RayExecutor.connect(run.ray_address, run.gpus_per_worker, config.output_dir)


class BatchRun:
    """One `hsd convert` invocation over its documents, holding the output lock throughout."""

    def __init__(
        self, config: ConvertConfig, run: RunConfig, reporter: Reporter, events: EventLog,
        reads_page: Callable[[Image.Image], bool] | None = None,
    ) -> None:
        self.config = config
        self.run = run
        self.reads_page = reads_page
        self.reporter = reporter
        self.events = events
        self.config_hash = config_hash(config, run.page_timeout)
        self.limits = Limits(run.page_timeout, run.doc_timeout, run.max_docs_per_worker)
        # Held while the manifest, the display and the events take a finished document: documents
        # finish on several threads when the executor runs several workers.
        self.recording = threading.Lock()

    def convert_one(
        self, doc: InputDocument, outputs: OutputPaths, manifest: Manifest, pool: WorkerPool
    ) -> DocumentOutcome:
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
        checkpoints = self.config.output_dir / STATE_DIR / "pages" / f"{sha256[:16]}-{self.config_hash}"
        task = DocumentTask(
            doc=doc,
            outputs=outputs,
            config=self.config,
            sha256=sha256,
            checkpoint_dir=checkpoints,
            max_page_error_rate=self.run.max_page_error_rate,
            page_timeout=self.run.page_timeout,
            reads_page=self.reads_page,
            max_rows=self.run.max_rows,
            sizing=self.run.sizing,
        )
        self.events.emit("doc_started", input=str(doc.path))
        outcome = pool.convert(task, lambda name, payload: self.events.emit(name, input=str(doc.path), **payload))
        with self.recording:
            manifest.append(_manifest_record(key, doc.path, outcome, self.config, self.config_hash))
        shutil.rmtree(checkpoints, ignore_errors=True)
        self.events.emit(
            "doc_failed" if outcome.status.is_failure else "doc_done",
            input=str(doc.path),
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
        manifest.append(_manifest_record(str(path.absolute()), path, outcome, self.config, self.config_hash))
        self.events.emit("doc_failed", input=str(path), status=outcome.status.value, error=outcome.error, pages=0)
        return self.record(outcome)

    def execute(self, planned: list[tuple[InputDocument, OutputPaths]], missing: list[Path]) -> list[DocumentOutcome]:
        """Missing inputs first, so a typo shows before a long batch; then the documents, on as
        many workers as the executor has room for. Outcomes come back in input order."""
        with OutputLock(self.config.output_dir):
            remove_stale_temp_files(self.config.output_dir)
            manifest = Manifest(self.config.output_dir)
            executor = open_executor(self.config, self.run)
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
        pools = [WorkerPool(self.limits, executor.start_worker, cancelled) for _ in range(min(executor.slots, len(planned)))]
        todo = iter(enumerate(planned))
        taking = threading.Lock()
        outcomes: list[DocumentOutcome | None] = [None] * len(planned)

        def serve(pool: WorkerPool) -> None:
            try:
                while not cancelled.is_set():
                    with taking:
                        index, (doc, outputs) = next(todo, (None, (None, None)))
                    if index is None:
                        return
                    outcomes[index] = self.convert_one(doc, outputs, manifest, pool)
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
    reads_page: Callable[[Image.Image], bool] | None = None,
) -> tuple[ExitCode, dict[str, Any]]:
    """Convert everything `inputs` (and the --files-from entries `listed`) name; the
    OutputLockedError of a busy OUT propagates. `reads_page`: which pages the model reads (a
    replay model's), given to the page stage.

    A named path that does not exist is a failed input (status missing, exit code 1), also when
    nothing else is left to convert: exit code 3 means only that no directory or glob matched."""
    started = time.perf_counter()
    events = events or EventLog(None)
    found = discover(inputs, config.recursive, listed)
    for arg in found.unmatched:
        reporter.warn(f"no document matched {arg!r}")
    if not found.documents and not found.missing:
        return ExitCode.NO_INPUT, _summary([], started, ExitCode.NO_INPUT, config)
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
    events.emit("run_started", documents=len(missing) + len(planned), output_dir=str(config.output_dir))
    outcomes = BatchRun(config, run, reporter, events, reads_page).execute(planned, missing)
    failed = any(outcome.status.is_failure for outcome in outcomes)
    code = ExitCode.SOME_FAILED if failed else ExitCode.OK
    summary = _summary(outcomes, started, code, config)
    events.emit("run_done", exit_code=int(code), counts=summary["counts"])
    reporter.summary(summary)
    return code, summary


def _decoding_summary(per_document: list[DecodingTotals]) -> dict[str, Any] | None:
    totals = DecodingTotals.total(per_document)
    return totals.as_json() if totals else None


def _summary(
    outcomes: list[DocumentOutcome], started: float, code: ExitCode, config: ConvertConfig
) -> dict[str, Any]:
    seconds = time.perf_counter() - started
    pages = sum(outcome.pages for outcome in outcomes if not outcome.status.is_failure)
    counts = Counter(outcome.status.value for outcome in outcomes)
    return {
        "decoding": _decoding_summary([o.decoding for o in outcomes if o.decoding]),
        "peak_rss_mib": {
            "parent": peak_rss_mib(),
            "worker": max((o.peak_rss_mib for o in outcomes if o.peak_rss_mib is not None), default=None),
        },
        "hsd_version": __version__,
        "exit_code": int(code),
        "output_dir": str(config.output_dir),
        "model": config.model,
        "counts": {status.value: counts.get(status.value, 0) for status in DocStatus},
        "pages": pages,
        "seconds": round(seconds, 3),
        "pages_per_second": round(pages / seconds, 3) if seconds > 0 else 0.0,
        "documents": [
            {
                "input": outcome.input,
                "status": outcome.status.value,
                "error": outcome.error,
                "pages": outcome.pages,
                "page_count": outcome.page_count,
                "failed_pages": {str(n): why for n, why in outcome.failed_pages.items()},
                "seconds": round(outcome.seconds, 3),
                "sha256": outcome.sha256,
                "draft_backends": outcome.draft_backends,
                "outputs": outcome.outputs,
                "warnings": list(outcome.warnings),
                "note": outcome.note,
                "decoding": outcome.decoding.as_json() if outcome.decoding else None,
                "peak_rss_mib": outcome.peak_rss_mib,
            }
            for outcome in outcomes
        ],
    }
