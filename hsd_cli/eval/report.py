"""Human-readable summaries of the eval reports, printed on stderr."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def show_olmocr_bench(console: Console, report: dict[str, Any]) -> None:
    low, high = report["overall"]["ci95"]
    table = Table(title="olmOCR-Bench", title_justify="left")
    for column in ("group", "score", "passed", "tests"):
        table.add_column(column, justify="left" if column == "group" else "right")
    for name, row in report["by_file"].items():
        table.add_row(f"file {name}", _pct(row["score"]), str(row["passed"]), str(row["total"]))
    for name, row in report["by_type"].items():
        table.add_row(f"type {name}", _pct(row["score"]), str(row["passed"]), str(row["total"]))
    table.add_row("[bold]overall[/bold]", f"[bold]{_pct(report['overall']['score'])}[/bold]", "", "")
    console.print(table)
    console.print(
        f"overall {_pct(report['overall']['score'])} (95% CI {_pct(low)} - {_pct(high)}), "
        f"math: {report['math_render']['mode']}",
        highlight=False,
    )
    if report["missing_pages"]:
        console.print(f"[yellow]warning:[/yellow] {len(report['missing_pages'])} pages have no output", highlight=False)


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
