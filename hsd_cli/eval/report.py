"""Human-readable summaries of the eval reports, printed on stderr."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def show_olmocr_bench(console: Console, report: dict[str, Any]) -> None:
    table = Table(title="olmOCR-Bench", title_justify="left")
    for column in ("group", "score", "passed", "tests"):
        table.add_column(column, justify="left" if column == "group" else "right")
    for name, row in report["by_file"].items():
        table.add_row(f"file {name}", *_bench_cells(row))
    for name, row in report["by_type"].items():
        table.add_row(f"type {name}", *_bench_cells(row))
    excluded = report["overall"]["excludes"]
    label = "overall" if excluded is None else f"overall, {excluded['tests']} unscored left out"
    table.add_row(f"[bold]{label}[/bold]", f"[bold]{_pct(report['overall']['score'])}[/bold]", "", "")
    console.print(table)
    console.print(escape(_overall_line(report)), highlight=False, soft_wrap=True)
    if report["missing_pages"]:
        console.print(f"[yellow]warning:[/yellow] {len(report['missing_pages'])} pages have no output", highlight=False)


def _bench_cells(row: dict[str, Any]) -> tuple[str, str, str]:
    """score, passed, tests of one group; a group with unscored tests says how many."""
    if not row["unscored"]:
        return _pct(row["score"]), str(row["passed"]), str(row["total"])
    if row["score"] is None:
        return "unscored", "-", f"0 (+{row['unscored']} unscored)"
    return _pct(row["score"]), str(row["passed"]), f"{row['total']} (+{row['unscored']} unscored)"


def _overall_line(report: dict[str, Any]) -> str:
    overall = report["overall"]
    line = f"overall {_pct(overall['score'])}"
    if overall["ci95"] is not None:
        low, high = overall["ci95"]
        line += f" (95% CI {_pct(low)} - {_pct(high)})"
    excluded = overall["excludes"]
    if excluded is None:
        return f"{line}, math: {report['math_render']['mode']}"
    kinds = ", ".join(f"{count} {kind}" for kind, count in excluded["by_type"].items())
    return f"{line}, excluding {excluded['tests']} unscored tests ({kinds}): {excluded['reason']}"


def show_omnidocbench(console: Console, report: dict[str, Any]) -> None:
    table = Table(title="OmniDocBench (page level)", title_justify="left")
    for column in ("page", "text edit", "table TEDS", "TEDS-S", "order edit"):
        table.add_column(column, justify="left" if column == "page" else "right")

    def number(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    for page in report["pages"]:
        table.add_row(
            page["image"][:48],
            number(page["text_edit"]),
            number(page["table_teds"]),
            number(page["table_teds_struct"]),
            number(page["reading_order_edit"]),
        )
    overall = report["overall"]
    table.add_row(
        "[bold]overall[/bold]",
        number(overall["text_edit"]),
        number(overall["table_teds"]),
        number(overall["table_teds_struct"]),
        number(overall["reading_order_edit"]),
    )
    console.print(table)


def show_tables(console: Console, report: dict[str, Any]) -> None:
    table = Table(title="ICDAR 2013 cell adjacency", title_justify="left")
    for column in ("document", "variant", "precision", "recall", "F1"):
        table.add_column(column, justify="left" if column in ("document", "variant") else "right")
    for doc in report["documents"]:
        table.add_row(doc["document"], doc["variant"] or "-", _pct(doc["precision"]), _pct(doc["recall"]), _pct(doc["f1"]))
    overall = report["overall"]
    table.add_row("[bold]overall (micro)[/bold]", "", _pct(overall["precision"]), _pct(overall["recall"]), _pct(overall["f1"]))
    console.print(table)
