"""Table text for drafts: a pipe table when the grid is simple, HTML when cells span."""

from __future__ import annotations

from html.parser import HTMLParser


class _TableGrid(HTMLParser):
    """Collects rows of cell texts from one HTML table; notes whether any cell spans."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.spans = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
            if any(name in ("rowspan", "colspan") and value not in (None, "1") for name, value in attrs):
                self.spans = True
        elif tag == "br" and self._cell is not None:
            self._cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self.rows:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def html_table_cells(html: str) -> tuple[list[list[str]], bool]:
    """(rows of cell texts, whether any cell spans rows or columns)."""
    grid = _TableGrid()
    grid.feed(html)
    return [row for row in grid.rows if row], grid.spans


def pipe_table(rows: list[list[str]]) -> str:
    width = max(len(row) for row in rows)
    padded = [row + [""] * (width - len(row)) for row in rows]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(padded[0]), "|" + "---|" * width] + [line(row) for row in padded[1:]])


def table_block_text(html: str | None, markdown: str) -> tuple[str, str | None]:
    """(text for Markdown output, HTML form or None) for one detected table."""
    if not html:
        return markdown.strip(), None
    rows, spans = html_table_cells(html)
    if not rows or spans:
        return html.strip(), html.strip()
    return pipe_table(rows), html.strip()
