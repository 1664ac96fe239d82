"""Draft texts in the model's dialect: how a family's models write tables, emphasis and
paragraphs (its settings say), so that drafts match the output token for token.

Where a family's dialect is uncertain, a block gets every alternative (a table as a pipe table
and as HTML); the proposer's trie verifies them all and follows whichever the model writes.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

from hsd_cli.models.settings import ModelSettings
from hsd_cli.records import Block, BlockKind
from hsd_cli.stages.draft.tables import html_table_cells, pipe_table, pipe_table_cells

# Running headers and footers are left out of page outputs, so they are no drafts at all.
NOT_DRAFT_KINDS = {BlockKind.PAGE_HEADER, BlockKind.PAGE_FOOTER}
# A figure's text (chart labels from the text layer, a page of notes the layout model took for a
# picture) can be in the page output, so it is a page draft; its crop is not worth a region pass.
NO_REGION_KINDS = NOT_DRAFT_KINDS | {BlockKind.FIGURE}
# Blocks whose lines are one paragraph's (or one heading's) wrapped lines.
PARAGRAPH_KINDS = {
    BlockKind.TITLE, BlockKind.SECTION_HEADER, BlockKind.TEXT, BlockKind.CAPTION, BlockKind.FOOTNOTE,
}
# Italic and bold as pymupdf4llm writes them: _x_, *x*, **x**, __x__ around non-space text.
_EMPHASIS = re.compile(r"(?<![\w*_])(\*\*|__|\*|_)(?=\S)(.+?)(?<=\S)\1(?![\w*_])")
_INLINE_TAGS = re.compile(r"</?(?:sup|sub|u|b|i|em|strong)>")
# A word broken at a line end ("improv-\ning") is one word in a model's output; a compound whose
# hyphen falls there ("Anglo-\nSaxon", "COVID-\n19") keeps its hyphen.
_LINE_END_HYPHEN = re.compile(r"(\w)-\n(?=[a-z])")
_LINE_END_COMPOUND = re.compile(r"(\w-)\n(?=[A-Z0-9])")
_LINE_BREAK = re.compile(r"[ \t]*\n[ \t]*(?=\S)")


def html_table(rows: list[list[str]]) -> str:
    """A plain HTML table (first row as header cells), as OCR models write one."""
    def row_html(cells: list[str], tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}>{html.escape(cell, quote=False)}</{tag}>" for cell in cells) + "</tr>"

    return "<table>" + row_html(rows[0], "th") + "".join(row_html(row, "td") for row in rows[1:]) + "</table>"


def table_forms(block: Block, table_format: str) -> list[str]:
    """The table's text in the family's table dialect(s): `html`, `pipe` or `either` (both).
    Cells that span rows or columns keep their spans in HTML; a pipe table lists each row's cells."""
    rows = html_table_cells(block.html)[0] if block.html else pipe_table_cells(block.text)
    if not rows:
        return [block.text]
    forms = []
    if table_format in ("html", "either"):
        forms.append(block.html or html_table(rows))
    if table_format in ("pipe", "either"):
        forms.append(pipe_table(rows))
    return forms


def paragraph_text(text: str, line_breaks: str) -> str:
    """`joined`: a paragraph on one line, words broken at line ends made whole again (models
    write paragraphs unwrapped); `kept`: the lines as the page wraps them."""
    if line_breaks == "kept":
        return text
    text = _LINE_END_COMPOUND.sub(r"\1", _LINE_END_HYPHEN.sub(r"\1", text))
    return _LINE_BREAK.sub(" ", text)


def plain_text(text: str, emphasis: str) -> str:
    """Inline HTML tags from the text layer dropped (their text kept); emphasis marks dropped too
    when the family's models do not write them (`emphasis = "strip"`)."""
    text = _INLINE_TAGS.sub("", text)
    if emphasis == "strip":
        previous = None
        while previous != text:  # nested marks (***x***) come off one pair at a time
            previous, text = text, _EMPHASIS.sub(r"\2", text)
    return text


def block_drafts(block: Block, settings: ModelSettings) -> list[str]:
    """One block's draft text(s) in the family's dialect."""
    if block.kind is BlockKind.TABLE:
        return table_forms(block, settings.table_format)
    text = plain_text(block.text, settings.emphasis)
    if block.kind in PARAGRAPH_KINDS:
        text = paragraph_text(text, settings.line_breaks)
    return [text]


def draft_plan(blocks: tuple[Block, ...], wants_region: Callable[[Block], bool]) -> list[tuple[Block, bool]]:
    """The blocks whose text drafts the page, in reading order, each with whether it gets a region
    pass first."""
    return [
        (block, block.kind not in NO_REGION_KINDS and wants_region(block))
        for block in blocks
        if block.text and block.kind not in NOT_DRAFT_KINDS
    ]


def page_drafts(blocks: tuple[Block, ...], settings: ModelSettings) -> list[str]:
    """The page stage's drafts when no region pass runs (`--stages page`, `hsd bench acceptance`)."""
    return [text for block, _ in draft_plan(blocks, lambda block: False) for text in block_drafts(block, settings)]
