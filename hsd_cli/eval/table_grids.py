"""Tables in Markdown output as cell grids: GFM pipe tables and HTML tables (with spans).

The scorers compare structure, so a table is its cells with grid positions; pipe tables and
HTML tables come out alike, and `<th>` is just a cell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hsd_cli.html_tables import Cell, read_html_table

_HTML_TABLE = re.compile(r"<table\b.*?</table\s*>", re.IGNORECASE | re.DOTALL)
_PIPE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


@dataclass(frozen=True)
class Table:
    cells: tuple[Cell, ...]
    start: int  # character span of the table in the Markdown it came from
    end: int

    @property
    def rows(self) -> list[list[Cell]]:
        """Cells grouped by the row they start in, left to right (the HTML row structure)."""
        grouped: dict[int, list[Cell]] = {}
        for cell in self.cells:
            grouped.setdefault(cell.row, []).append(cell)
        return [sorted(grouped[row], key=lambda cell: cell.col) for row in sorted(grouped)]


def place_cells(rows: list[list[tuple[str, int, int]]]) -> list[Cell]:
    """(text, rowspan, colspan) per row -> cells on the grid, skipping slots taken by spans."""
    taken: set[tuple[int, int]] = set()
    cells: list[Cell] = []
    for row_index, row in enumerate(rows):
        col = 0
        for text, row_span, col_span in row:
            while (row_index, col) in taken:
                col += 1
            cells.append(Cell(row_index, col, text, row_span, col_span))
            taken.update((row_index + r, col + c) for r in range(row_span) for c in range(col_span))
            col += col_span
    return cells


def html_table(html: str, start: int = 0, end: int = 0) -> Table:
    rows = [[(cell.text, cell.row_span, cell.col_span) for cell in row] for row in read_html_table(html).rows]
    return Table(tuple(place_cells(rows)), start, end)


def _pipe_cells(line: str) -> list[str]:
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return [" ".join(cell.replace("\\|", "|").split()) for cell in _UNESCAPED_PIPE.split(body)]


def pipe_tables(markdown: str) -> list[Table]:
    """GFM tables: a header row, a separator row of dashes, then body rows that contain '|'."""
    tables: list[Table] = []
    lines = markdown.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    index = 0
    while index + 1 < len(lines):
        header, separator = lines[index], lines[index + 1]
        if "|" in header and "-" in separator and _PIPE_SEPARATOR.match(separator):
            end = index + 2
            while end < len(lines) and "|" in lines[end] and lines[end].strip():
                end += 1
            rows = [_pipe_cells(header)] + [_pipe_cells(line) for line in lines[index + 2 : end]]
            cells = place_cells([[(text, 1, 1) for text in row] for row in rows])
            tables.append(Table(tuple(cells), offsets[index], offsets[end]))
            index = end
        else:
            index += 1
    return tables


def find_tables(markdown: str) -> list[Table]:
    """Every pipe and HTML table in the Markdown, in reading order."""
    found = [html_table(match.group(0), match.start(), match.end()) for match in _HTML_TABLE.finditer(markdown)]
    outside_html = _HTML_TABLE.sub(lambda match: " " * len(match.group(0)), markdown)  # keep offsets
    found += pipe_tables(outside_html)
    return sorted((table for table in found if table.cells), key=lambda table: table.start)


def remove_tables(markdown: str) -> str:
    """The Markdown without its tables (for text metrics that score tables separately)."""
    pieces, last = [], 0
    for table in find_tables(markdown):
        pieces.append(markdown[last : table.start])
        last = table.end
    pieces.append(markdown[last:])
    return "".join(pieces)
