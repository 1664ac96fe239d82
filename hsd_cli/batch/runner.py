"""A conversion run over many documents: discovery, resume, isolation, reporting, exit code."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from enum import IntEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from hsd_cli import __version__
from hsd_cli.config import MIN_PART_PAGES, ConvertConfig, Executor, RunConfig, parse_shard
from hsd_cli.batch.inputs import InputDocument, OutputPaths, assign_outputs, discover
from hsd_cli.batch.local_executor import LocalExecutor
from hsd_cli.output.manifest import STATE_DIR, Manifest, OutputLock, remove_stale_temp_files
from hsd_cli.batch.tasks import DocumentOutcome, DocumentTask, config_hash, file_sha256, runs_model
from hsd_cli.records.kinds import DocStatus
from hsd_cli.records.totals import DecodingTotals
from hsd_cli.batch.worker import Limits, ProgressSink, WorkerPool, peak_rss_mib

if TYPE_CHECKING:
    from collections.abc import Callable

    from PIL import Image

    from hsd_cli.batch.ray_executor import RayExecutor


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
        # A near-lossless run's output is not plain decoding's: its table says so first.
        near_lossless = summary["near_lossless"]
        title = "hsd convert" if near_lossless is None else f"hsd convert (near-lossless, TAU {near_lossless:g})"
        table = Table(title=title, title_justify="left")
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
    """Documents (or parts of a long one: config.document_parts) a worker (a local process, a Ray
    actor) converts at once: --max-rows where a model reads the pages (their rows share its
    forwards), else one (without a model nothing overlaps: pipeline_lock)."""
    return run.max_rows if runs_model(config) else 1


def documents_per_process(config: ConvertConfig, run: RunConfig) -> int:
    """Documents a worker (a local process, a Ray actor) serves before it is replaced:
    --max-docs-per-worker per document in flight. A worker due takes no new document until those
    in flight are done, so its rows empty out for the slowest one's tail, and the next worker loads
    the model again: counted per row, a generation of N rows loses that tail once in as many
    documents as one row's does."""
    return run.max_docs_per_worker * documents_in_flight(config, run)


def default_max_rows(config: ConvertConfig, run: RunConfig, reporter: Reporter, documents: list[InputDocument]) -> int:
    """--max-rows where it is not given: as many rows as the model's device holds (serving.rows:
    one on the CPU), and no more than the run's `documents` split into (serving.rows.run_parts:
    this shard's, those done included, so that a resumed run chooses alike; a long document
    splits into parts of at least MIN_PART_PAGES pages), said on stderr. Per-page sizing prices
    every read at these rows: a run of one short document reads with whole trees, as `generate`'s
    rival, not as one row of a full batch. One without a model, or on Ray (the driver does not see
    the actors' devices: --max-rows N sets the rows of each actor). A budget that cannot be worked
    out is warned of and gives one row."""
    from hsd_cli.batch.tasks import vlm_options

    options = vlm_options(config)
    if options is None or run.executor is not Executor.LOCAL or not documents:
        return 1
    # Imports torch (and PyMuPDF to count pages on a GPU): only when a VLM will run.
    from hsd_cli.serving.rows import default_rows, run_parts

    try:
        choice = default_rows(options, config.dpi, config.max_pixels)
        if choice.rows == 1:
            rows = 1
        else:
            rows = run_parts([(doc.path, doc.kind) for doc in documents], config.pages, config.password, choice.rows)
    except Exception as exc:  # noqa: BLE001 - e.g. a processor that cannot be loaded alone: the run goes on
        reporter.warn(f"cannot budget the rows in flight ({type(exc).__name__}: {exc}); one row, --max-rows N for more")
        return 1
    if not reporter.quiet:
        fewer = ""
        if rows < choice.rows:
            fewer = ", one per document" if rows == len(documents) else f", one per document part of {MIN_PART_PAGES}+ pages"
        reporter.console.print(f"rows in flight: {rows}{fewer} ({choice.why})", highlight=False)
    return rows


def drafting_processes(config: ConvertConfig, run: RunConfig) -> int | None:
    """Draft processes beside a worker (--draft-workers; 0: the worker drafts each page itself).
    By default none for a draft-only run (it drafts in its worker, whose memory the README states)
    or on Ray (an actor claims one CPU); where a model reads the pages, None: the worker chooses
    by the model's device (draft_processes.default_draft_processes)."""
    if run.draft_workers is not None:
        return run.draft_workers
    if not runs_model(config) or run.executor is not Executor.LOCAL:
        return 0
    return None


def open_executor(config: ConvertConfig, run: RunConfig) -> LocalExecutor | RayExecutor:
    if run.executor is Executor.LOCAL:
        return LocalExecutor(documents_in_flight(config, run), documents_per_process(config, run))
    from hsd_cli.batch.ray_executor import RayExecutor  # imports ray: only when asked for

    return RayExecutor.connect(
        run.ray_address, run.gpus_per_worker, config.output_dir,
        documents_in_flight(config, run), documents_per_process(config, run),
    )


@dataclass
class SplitDocument:
    """A document in conversion: into how many parts it split (config.document_parts; 1: it did
    not), and the outcomes of its parts so far."""

    index: int  # in input order
    key: str
    task: DocumentTask
    started: float  # time.monotonic()
    parts: int = 1
    outcomes: list[DocumentOutcome] = field(default_factory=list)
    taking: threading.Lock = field(default_factory=threading.Lock)

    def take(self, outcome: DocumentOutcome) -> bool:
        """Keep a part's outcome; whether it was the last part out."""
        with self.taking:
            self.outcomes.append(outcome)
            return len(self.outcomes) == self.parts


@dataclass(frozen=True)
class _Part:
    document: SplitDocument
    part: int


class _Schedule:
    """What the run's pools take, in turn: the later parts of split documents first (a long
    document's pages share the model's rows), then the next document in input order."""

    def __init__(self, planned: list[tuple[InputDocument, OutputPaths]], parts: int, cancelled: threading.Event) -> None:
        self.parts = parts  # into how many parts a document may split (1: none)
        self.todo = iter(enumerate(planned))
        self.cancelled = cancelled
        self.queued: deque[_Part] = deque()
        # Documents whose first part runs and has not yet said into how many parts it splits: a
        # pool with nothing to take waits for them rather than end.
        self.splitting: set[int] = set()
        self.changed = threading.Condition()

    def take(self) -> _Part | tuple[int, tuple[InputDocument, OutputPaths]] | None:
        with self.changed:
            while not self.cancelled.is_set():
                if self.queued:
                    return self.queued.popleft()
                item = next(self.todo, None)
                if item is not None:
                    if self.parts > 1:
                        self.splitting.add(item[0])
                    return item
                if not self.splitting:
                    return None
                self.changed.wait(0.25)
            return None

    def split(self, document: SplitDocument, parts: int) -> None:
        """The document's first part says into how many parts it splits; a resent first part says
        it again, which changes nothing."""
        with self.changed:
            if document.index not in self.splitting:
                return
            document.parts = parts
            self.queued.extend(_Part(document, part) for part in range(1, parts))
            self.splitting.discard(document.index)
            self.changed.notify_all()

    def settled(self, index: int) -> None:
        """The document's first part is over, split or not."""
        with self.changed:
            self.splitting.discard(index)
            self.changed.notify_all()


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
        self.limits = Limits(run.page_timeout, run.doc_timeout, documents_per_process(config, run))
        # Held while the manifest, the display and the events take a finished document: documents
        # finish on several threads when the executor runs several workers.
        self.recording = threading.Lock()

    def convert_one(
        self, index: int, doc: InputDocument, outputs: OutputPaths, manifest: Manifest, pool: WorkerPool, schedule: _Schedule
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
            config=self.config,
            sha256=sha256,
            checkpoint_dir=self.config.output_dir / STATE_DIR / "pages" / f"{sha256[:16]}-{self.config_hash}",
            max_page_error_rate=self.run.max_page_error_rate,
            page_timeout=self.run.page_timeout,
            reads_page=self.reads_page,
            max_rows=self.run.max_rows,
            sizing=self.run.sizing,
            draft_workers=drafting_processes(self.config, self.run),
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
            manifest.append(_manifest_record(key, task.doc.path, outcome, self.config, self.config_hash))
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
        schedule = _Schedule(planned, documents_in_flight(self.config, self.run), cancelled)
        pools = [
            WorkerPool(self.limits, executor.start_worker, cancelled)
            for _ in range(min(executor.slots, len(planned) * schedule.parts))
        ]
        outcomes: list[DocumentOutcome | None] = [None] * len(planned)

        def serve(pool: WorkerPool) -> None:
            try:
                while (work := schedule.take()) is not None:
                    if isinstance(work, _Part):
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
        return ExitCode.NO_INPUT, _summary([], started, ExitCode.NO_INPUT, config, run.max_rows)
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
    if run.max_rows is None:
        run = replace(run, max_rows=default_max_rows(config, run, reporter, [doc for doc, _ in planned]))
    events.emit(
        "run_started", documents=len(missing) + len(planned), output_dir=str(config.output_dir), max_rows=run.max_rows
    )
    outcomes = BatchRun(config, run, reporter, events, reads_page).execute(planned, missing)
    failed = any(outcome.status.is_failure for outcome in outcomes)
    code = ExitCode.SOME_FAILED if failed else ExitCode.OK
    summary = _summary(outcomes, started, code, config, run.max_rows)
    events.emit("run_done", exit_code=int(code), counts=summary["counts"])
    reporter.summary(summary)
    return code, summary


def _decoding_summary(per_document: list[DecodingTotals]) -> dict[str, Any] | None:
    totals = DecodingTotals.total(per_document)
    return totals.as_json() if totals else None


def _summary(
    outcomes: list[DocumentOutcome], started: float, code: ExitCode, config: ConvertConfig, max_rows: int | None
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
        "near_lossless": config.near_lossless,
        "max_rows": max_rows,
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
