"""A conversion run over many documents: discovery, per-document isolation, reporting, exit code."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from rich.console import Console
from rich.table import Table

from hsd_cli import __version__
from hsd_cli.config import ConvertConfig
from hsd_cli.inputs import assign_outputs, discover
from hsd_cli.pipeline import DocumentOutcome, process_document
from hsd_cli.records import DocStatus


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


@dataclass
class Reporter:
    """Everything human goes to stderr; `quiet` keeps only errors, `debug` adds tracebacks."""

    console: Console
    quiet: bool = False
    debug: bool = False

    def warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)

    def document(self, outcome: DocumentOutcome) -> None:
        style = _STATUS_STYLE.get(outcome.status, "red")
        label = f"[{style}]{outcome.status.value:<9}[/{style}]"
        if outcome.error:
            self.console.print(f"{label} {outcome.input}: {outcome.error}", highlight=False, soft_wrap=True)
            if self.debug and outcome.traceback:
                self.console.print(outcome.traceback, highlight=False, markup=False)
        elif not self.quiet:
            backends = ", ".join(f"{name} x{count}" for name, count in sorted(outcome.draft_backends.items()))
            self.console.print(
                f"{label} {outcome.input} ({outcome.pages} pages, {outcome.seconds:.1f}s, draft: {backends})",
                highlight=False,
                soft_wrap=True,
            )
        for warning in outcome.warnings:
            self.warn(f"{outcome.input}: {warning}")

    def summary(self, summary: dict[str, Any]) -> None:
        if self.quiet:
            return
        table = Table(title="hsd convert", title_justify="left")
        counts = {status: n for status, n in summary["counts"].items() if n}
        for column in ("documents", *counts, "pages", "seconds", "pages/s"):
            table.add_column(column, justify="right", no_wrap=True)
        table.add_row(
            str(len(summary["documents"])),
            *(str(n) for n in counts.values()),
            str(summary["pages"]),
            f"{summary['seconds']:.1f}",
            f"{summary['pages_per_second']:.2f}",
        )
        self.console.print(table)


def run_convert(inputs: list[str], config: ConvertConfig, reporter: Reporter) -> tuple[ExitCode, dict[str, Any]]:
    started = time.perf_counter()
    documents, unmatched = discover(inputs, config.recursive)
    for arg in unmatched:
        reporter.warn(f"no document matched {arg!r}")
    if not documents:
        return ExitCode.NO_INPUT, _summary([], started, ExitCode.NO_INPUT, config)
    if config.model is None and not reporter.quiet:
        reporter.warn("no VLM configured: converting with the draft pipeline only (name one with --model ID|DIR)")
    outcomes: list[DocumentOutcome] = []
    for doc, outputs in zip(documents, assign_outputs(documents, config.output_dir), strict=True):
        outcome = process_document(doc, outputs, config)
        reporter.document(outcome)
        outcomes.append(outcome)
    failed = any(outcome.status.is_failure for outcome in outcomes)
    code = ExitCode.SOME_FAILED if failed else ExitCode.OK
    summary = _summary(outcomes, started, code, config)
    reporter.summary(summary)
    return code, summary


def _summary(
    outcomes: list[DocumentOutcome], started: float, code: ExitCode, config: ConvertConfig
) -> dict[str, Any]:
    seconds = time.perf_counter() - started
    pages = sum(outcome.pages for outcome in outcomes)
    counts = Counter(outcome.status.value for outcome in outcomes)
    return {
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
                "seconds": round(outcome.seconds, 3),
                "sha256": outcome.sha256,
                "draft_backends": outcome.draft_backends,
                "outputs": outcome.outputs,
                "warnings": list(outcome.warnings),
            }
            for outcome in outcomes
        ],
    }
