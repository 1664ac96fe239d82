"""The one reading of an HTML table, for the drafts (stages/draft/tables.py) and the table scorers
(eval/table_grids.py): its rows of cell texts with their spans. Standard library only, so that the
scorers need not load the draft stage to read a table."""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser


@dataclass(frozen=True)
class HtmlCell:
    text: str  # whitespace collapsed to single spaces; <br> is a space
    row_span: int = 1
    col_span: int = 1


@dataclass(frozen=True)
class Cell:
    """A cell placed on a table's grid (the scorers' tables, OTSL's): its top-left slot and spans."""

    row: int
    col: int
    text: str
    row_span: int = 1
    col_span: int = 1


@dataclass(frozen=True)
class HtmlTable:
    rows: tuple[tuple[HtmlCell, ...], ...]  # empty rows left out
    # Some <td>/<th> carries a rowspan or colspan other than "1", even one that does not parse or
    # whose cell never closes: the draft keeps such a table as HTML rather than guess at its grid.
    declares_spans: bool


class _HtmlTableParser(HTMLParser):
    """Rows of cells of one HTML table; nested tables are flattened, and a cell before any <tr>
    opens a row. A cell that is never closed is left out."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[HtmlCell]] = []
        self.declares_spans = False
        self._cell: list[str] | None = None
        self._spans = (1, 1)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            values = dict(attrs)
            self._cell = []
            self._spans = (_span(values.get("rowspan")), _span(values.get("colspan")))
            if any(name in ("rowspan", "colspan") and value not in (None, "1") for name, value in attrs):
                self.declares_spans = True
        elif tag == "br" and self._cell is not None:
            self._cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            if not self.rows:
                self.rows.append([])
            self.rows[-1].append(HtmlCell(" ".join("".join(self._cell).split()), *self._spans))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _span(value: str | None) -> int:
    """A span attribute as a count of rows or columns: 1 if it does not parse, at most 1000."""
    try:
        return max(1, min(int(value or 1), 1000))
    except ValueError:
        return 1


def read_html_table(html: str) -> HtmlTable:
    parser = _HtmlTableParser()
    try:
        parser.feed(html)
        parser.close()
    except AssertionError:  # Python 3.11's parser asserts on a marked section it does not know (`<![x`)
        pass  # the rows read up to there
    return HtmlTable(tuple(tuple(row) for row in parser.rows if row), parser.declares_spans)
