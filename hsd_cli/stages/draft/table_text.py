"""Table text for drafts: a pipe table when the grid is simple, HTML when cells span; and the
plausibility rule every draft table passes, whichever finder (PyMuPDF's table finder, its layout
model, PP-StructureV3) called it a table."""

from __future__ import annotations

import re
from dataclasses import replace

from hsd_cli.html_tables import read_html_table
from hsd_cli.records.kinds import Block, BlockKind

# A cell of this many words is a sentence, not a table entry.
SENTENCE_WORDS = 10
# A table with at most two columns over this share of the page is a page of text in a ruled box.
MOST_OF_PAGE = 0.5
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def html_table_cells(html: str) -> tuple[list[list[str]], bool]:
    """(rows of cell texts, whether any cell declares a span of rows or columns)."""
    table = read_html_table(html)
    return [[cell.text for cell in row] for row in table.rows], table.declares_spans


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


def pipe_table_cells(markdown: str) -> list[list[str]]:
    """Rows of cell texts of a Markdown pipe table (its separator row left out)."""
    rows = []
    for line in markdown.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [cell.strip().replace("\\|", "|") for cell in _UNESCAPED_PIPE.split(line[1:].removesuffix("|"))]
        if all(set(cell) <= set("-: ") for cell in cells):
            continue
        rows.append(cells)
    return rows


def is_plausible_table(rows: list[list[str]], area_share: float) -> bool:
    """Whether a detected table is one: at least two columns hold text, it does not fill most of
    the page with only two, and most of its cells are not sentences. Finders take ruled boxes of
    paragraphs and pages of display formulas for tables; those are running text."""
    columns = {index for row in rows for index, cell in enumerate(row) if cell.strip()}
    cells = [cell for row in rows for cell in row if cell.strip()]
    if len(columns) < 2:
        return False
    if area_share > MOST_OF_PAGE and len(columns) <= 2:
        return False
    sentences = sum(len(cell.split()) >= SENTENCE_WORDS for cell in cells)
    return sentences * 2 <= len(cells)


def plausible_table_block(block: Block, page_size: tuple[float, float]) -> Block:
    """`block` itself, or, for a table that is no table, a text block of its cell texts in
    reading order (row by row), one line per row."""
    if block.kind is not BlockKind.TABLE:
        return block
    rows = html_table_cells(block.html)[0] if block.html else pipe_table_cells(block.text)
    x0, y0, x1, y1 = block.bbox
    area_share = (x1 - x0) * (y1 - y0) / (page_size[0] * page_size[1])
    if not rows or is_plausible_table(rows, area_share):
        return block
    text = "\n".join(" ".join(cell for cell in row if cell.strip()) for row in rows if any(c.strip() for c in row))
    return replace(block, kind=BlockKind.TEXT, text=text, html=None)
