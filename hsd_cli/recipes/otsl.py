"""OTSL, the table language MinerU2.5 and PaddleOCR-VL answer "Table Recognition:" in, to HTML as
their makers convert it, and an HTML table (hsd's draft) to OTSL, so that a table's draft is in
the model's own dialect.

OTSL writes a table row by row: `<fcel>` a cell with text (the text follows the tag), `<ecel>`
an empty cell, `<lcel>` a cell merged with the one to its left, `<ucel>` with the one above,
`<xcel>` with both, `<nl>` the end of a row. The conversion follows mineru_vl_utils'
post_process/otsl2html.py (0.1.22) and paddlex's paddleocr_vl/uilts.py (3.7.2), docling's code
both: PaddleOCR-VL first pads the rows to one width (`pad_rows`); MinerU passes an answer that is
already an HTML table through.
"""

from __future__ import annotations

import html
import itertools
import re

from hsd_cli.html_tables import Cell, read_html_table

NL, FCEL, ECEL, LCEL, UCEL, XCEL = "<nl>", "<fcel>", "<ecel>", "<lcel>", "<ucel>", "<xcel>"
TAGS = (NL, FCEL, ECEL, LCEL, UCEL, XCEL)
_TAG = re.compile("(" + "|".join(TAGS) + ")")
# A cell tag and the text up to the next tag (paddlex's OTSL_FIND_PATTERN).
_CELL = re.compile("(?:" + "|".join(TAGS) + ").*?(?=" + "(?:" + "|".join(TAGS) + ")|$)", re.DOTALL)


def pad_rows(otsl: str) -> str:
    """PaddleOCR-VL's repair (otsl_pad_to_sqr_v2): every row cut or padded with `<ecel>` to the
    width that changes the fewest cells, no narrower than the last `<fcel>` of any row."""
    otsl = otsl.strip()
    if NL not in otsl:
        return otsl + NL
    rows = [cells for line in otsl.split(NL) if line and (cells := _CELL.findall(line))]
    if not rows:
        return NL
    narrowest = max(max((i + 1 for i, cell in enumerate(cells) if cell.startswith(FCEL)), default=0) for cells in rows)
    widest = max(narrowest, max(len(cells) for cells in rows))
    width = min(range(narrowest, widest + 1), key=lambda w: sum(abs(len(cells) - w) for cells in rows))
    return NL.join("".join((cells + [ECEL] * width)[:width]) for cells in rows) + NL


def _aligned_texts(texts: list[str], rows: list[list[str]]) -> list[str]:
    """The makers' walk that re-aligns the answer's tags and texts with the rows padded to one
    width: each tag of the padded rows, followed by the answer's text where the answer had one
    there, and `<nl>` after each row."""
    aligned: list[str] = []
    at = 0
    for row in rows:
        for tag in row:
            aligned.append(tag)
            if at < len(texts) and texts[at] == tag:
                at += 1
                if at < len(texts) and texts[at] not in TAGS:
                    aligned.append(texts[at])
                    at += 1
        aligned.append(NL)
        if at < len(texts) and texts[at] == NL:
            at += 1
    return aligned


def _run(rows: list[list[str]], row: int, col: int, merged: tuple[str, ...], down: bool) -> int:
    """How many cells from (row, col) on, rightwards or downwards, are `merged` tags."""
    span = 0
    while row < len(rows) and col < len(rows[row]) and rows[row][col] in merged:
        span += 1
        row, col = (row + 1, col) if down else (row, col + 1)
    return span


def parse_otsl(otsl: str, fcel_takes_next: bool = False) -> tuple[list[Cell], int, int]:
    """The cells of an OTSL answer with their spans, and the table's rows and columns.
    `fcel_takes_next`: paddlex's reading, where an `<fcel>` followed by a tag takes that tag as
    its text (MinerU's leaves the cell empty)."""
    tags = _TAG.findall(otsl)
    texts = [part for part in _TAG.split(otsl) if part.strip()]
    rows = [list(group) for is_nl, group in itertools.groupby(tags, lambda tag: tag == NL) if not is_nl]
    if rows:
        width = max(len(row) for row in rows)
        rows = [row + [ECEL] * (width - len(row)) for row in rows]
        texts = _aligned_texts(texts, rows)
    cells: list[Cell] = []
    row = col = 0
    for i, item in enumerate(texts):
        if item in (FCEL, ECEL):
            text, right = "", i + 1
            if item == FCEL and (fcel_takes_next or texts[i + 1] not in TAGS):
                text, right = texts[i + 1], i + 2
            col_span = 1 + (_run(rows, row, col + 1, (LCEL, XCEL), False) if right < len(texts) and texts[right] in (LCEL, XCEL) else 0)
            below = rows[row + 1][col] if row + 1 < len(rows) and col < len(rows[row + 1]) else ""
            row_span = 1 + (_run(rows, row + 1, col, (UCEL, XCEL), True) if below in (UCEL, XCEL) else 0)
            cells.append(Cell(row, col, text.strip(), row_span, col_span))
        if item in (FCEL, ECEL, LCEL, UCEL, XCEL):
            col += 1
        elif item == NL:
            row, col = row + 1, 0
    return cells, len(rows), max((len(r) for r in rows), default=0)


def cells_to_html(cells: list[Cell], rows: int, cols: int) -> str:
    """The makers' export_to_html: a cell written where it starts, later cells over earlier ones
    where spans overlap, `rowspan`/`colspan` above 1, texts escaped; no cells, no table."""
    if not cells:
        return ""
    grid: dict[tuple[int, int], Cell] = {}
    for cell in cells:
        for r in range(min(cell.row, rows), min(cell.row + cell.row_span, rows)):
            for c in range(min(cell.col, cols), min(cell.col + cell.col_span, cols)):
                grid[r, c] = cell
    body = []
    for r in range(rows):
        body.append("<tr>")
        for c in range(cols):
            cell = grid.get((r, c), Cell(r, c, ""))
            if (cell.row, cell.col) != (r, c):
                continue
            spans = (f' rowspan="{cell.row_span}"' if cell.row_span > 1 else "") + (f' colspan="{cell.col_span}"' if cell.col_span > 1 else "")
            body.append(f"<td{spans}>{html.escape(cell.text.strip())}</td>")
        body.append("</tr>")
    return "<table>" + "".join(body) + "</table>"


def mineru_otsl_to_html(otsl: str) -> str:
    """MinerU's conversion (mineru_vl_utils.post_process.otsl2html.convert_otsl_to_html)."""
    if otsl.startswith("<table") and otsl.endswith("</table>"):
        return otsl
    return cells_to_html(*parse_otsl(otsl))


def paddle_otsl_to_html(otsl: str) -> str:
    """PaddleOCR-VL's conversion (paddlex ... paddleocr_vl.uilts.convert_otsl_to_html): rows padded first."""
    return cells_to_html(*parse_otsl(pad_rows(otsl), fcel_takes_next=True))


def html_to_otsl(table_html: str) -> str:
    """An HTML table in OTSL: each cell's text after `<fcel>` (`<ecel>` where empty), the cells a
    span covers as `<lcel>`, `<ucel>` or `<xcel>`, rows ended by `<nl>`. A table the conversion
    above reads back the same (spans that overlap aside)."""
    table = read_html_table(table_html)
    grid: dict[tuple[int, int], str] = {}
    for r, row in enumerate(table.rows):
        c = 0
        for cell in row:
            while (r, c) in grid:
                c += 1
            for dr in range(cell.row_span):
                for dc in range(cell.col_span):
                    grid.setdefault((r + dr, c + dc), _covered(cell.text, dr, dc))
            c += cell.col_span
    if not grid:
        return ""
    rows = max(r for r, _ in grid) + 1
    cols = max(c for _, c in grid) + 1
    return "".join("".join(grid.get((r, c), ECEL) for c in range(cols)) + NL for r in range(rows))


def _covered(text: str, dr: int, dc: int) -> str:
    if dr == 0 and dc == 0:
        return FCEL + text if text else ECEL
    return XCEL if dr and dc else (UCEL if dr else LCEL)
