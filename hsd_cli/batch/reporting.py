"""What a run tells: the progress and documents on stderr, the NDJSON events, the manifest
record of a document, and the summary."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from hsd_cli import __version__
from hsd_cli.document.tasks import DocumentOutcome
from hsd_cli.batch.worker import peak_rss_mib
from hsd_cli.records.kinds import DocStatus
from hsd_cli.records.totals import DecodingTotals

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


def manifest_record(key: str, path: Path, outcome: DocumentOutcome, model: str | None, chash: str) -> dict[str, Any]:
    return {
        "key": key,
        "input": str(path),
        "size": path.stat().st_size if path.exists() else None,
        "sha256": outcome.sha256,
        "pages": outcome.pages,
        "page_count": outcome.page_count,
        "config_hash": chash,
        "model": model,
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


def _decoding_summary(per_document: list[DecodingTotals]) -> dict[str, Any] | None:
    totals = DecodingTotals.total(per_document)
    return totals.as_json() if totals else None


def run_summary(
    outcomes: list[DocumentOutcome], started: float, code: int, output_dir: Path, model: str | None, max_rows: int | None,
    near_lossless: float | None = None,
) -> dict[str, Any]:
    """The run's JSON summary (`--json`), which the table on stderr shows in part."""
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
        "output_dir": str(output_dir),
        "model": model,
        "near_lossless": near_lossless,
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
