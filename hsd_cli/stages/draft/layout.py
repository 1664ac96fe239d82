"""Blocks from PyMuPDF's layout model (via pymupdf4llm) over a page's text layer.

Both the `pdf-text` and the `ocr` backends end here: OCR first replaces the page's text layer with
the lines it recognised, then the same layout analysis turns text into typed blocks.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import unicodedata
from collections.abc import Callable, Iterator

import numpy as np
import pymupdf

from hsd_cli.records.kinds import BBox, Block, BlockKind
from hsd_cli.stages.draft.table_text import table_block_text

with contextlib.redirect_stdout(io.StringIO()):  # pymupdf4llm prints notices on import
    from pymupdf4llm.helpers import document_layout

# Parser notices ("OCR on page ...") become debug logging, never stdout or stderr noise.
pymupdf.set_messages(pylogging=True, pylogging_level=logging.DEBUG)

_KINDS = {
    "title": BlockKind.TITLE,
    "section-header": BlockKind.SECTION_HEADER,
    "text": BlockKind.TEXT,
    "list-item": BlockKind.LIST,
    "table": BlockKind.TABLE,
    "formula": BlockKind.FORMULA,
    "picture": BlockKind.FIGURE,
    "caption": BlockKind.CAPTION,
    "footnote": BlockKind.FOOTNOTE,
    "code": BlockKind.CODE,
    "page-header": BlockKind.PAGE_HEADER,
    "page-footer": BlockKind.PAGE_FOOTER,
}

_HEADING_MARKS = re.compile(r"^#{1,6}\s+")
_PICTURE_COMMENTS = re.compile(r"<!-- (Start|End) of picture text -->")
_BR = re.compile(r"<br\s*/?>")
# TeX-made text layers write an accented letter as a spacing accent then the letter ("J´an");
# the combining accent after the letter composes to the one character a model writes ("Ján").
# (No backtick: it opens code spans.)
_COMBINING = {"´": "\u0301", "ˆ": "\u0302", "¨": "\u0308", "˜": "\u0303", "ˇ": "\u030c",
              "¸": "\u0327", "˘": "\u0306", "˙": "\u0307", "˚": "\u030a"}
_SPACING_ACCENT = re.compile(f"([{''.join(_COMBINING)}])([A-Za-z])")
SOFT_HYPHEN = "\u00ad"

# The layout model asks MuPDF for a text page segmented with the page's vector paths in it, and
# that segmentation grows far faster than the paths where they are scattered: a 24 x 36 inch sheet
# of 40,000 short lines took 90 s to draft (issue 31's, of 38,556 paths, over 120 s). Above this
# many paths the layout reads the page without its line art, in seconds. The most on a page of our
# corpora is 8,630 (a plot, 10 s), so every page we have lays out as before. Scattered paths below
# the cap can still be slow (2,000 on such a sheet: 2.5 min), but a cap low enough for them would
# take the rules off tables and the marks off plots, which have hundreds to thousands.
MAX_LAYOUT_DRAWINGS = 10_000


def repair_text_layer(text: str) -> str:
    """Accents composed with their letters; soft hyphens (invisible unless a line breaks there) out."""
    text = _SPACING_ACCENT.sub(
        lambda m: unicodedata.normalize("NFC", m.group(2) + _COMBINING[m.group(1)]), text
    )
    return text.replace(SOFT_HYPHEN, "")

def _clean_block_text(kind: BlockKind, markdown: str) -> str:
    text = repair_text_layer(markdown.strip())
    if kind in (BlockKind.TITLE, BlockKind.SECTION_HEADER):
        text = _HEADING_MARKS.sub("", text)
        if text.startswith("**") and text.endswith("**") and text.count("**") == 2:
            text = text[2:-2].strip()
    elif kind in (BlockKind.FIGURE, BlockKind.FORMULA):
        text = _BR.sub("\n", _PICTURE_COMMENTS.sub("", text)).strip()
        text = re.sub(r"^!\[\]\([^)]*\)\s*", "", text)
    return text


def drawings_beyond_layout(page: pymupdf.Page) -> int:
    """The page's vector paths where there are more than the layout looks at, else 0."""
    count = len(page.get_cdrawings())
    return count if count > MAX_LAYOUT_DRAWINGS else 0


@contextlib.contextmanager
def _without_line_art(page: pymupdf.Page) -> Iterator[pymupdf.Page]:
    """A copy of the page, in a document of its own, with its vector paths removed. The page itself
    stays whole: OCR may render it next, and text drawn as paths must then still be there."""
    with pymupdf.open() as copy:
        copy.insert_pdf(page.parent, from_page=page.number, to_page=page.number)
        light = copy[0]
        light.add_redact_annot(light.rect, fill=False, cross_out=False)
        light.apply_redactions(
            images=pymupdf.PDF_REDACT_IMAGE_NONE,
            graphics=pymupdf.PDF_REDACT_LINE_ART_REMOVE_IF_TOUCHED,
            text=pymupdf.PDF_REDACT_TEXT_NONE,
        )
        yield light


def layout_blocks(
    page: pymupdf.Page,
    source: str,
    confidence: Callable[[BBox], float | None] = lambda bbox: None,
    page_no: int | None = None,
) -> list[Block]:
    """Typed blocks in reading order for one page's text layer, their ids numbered for `page_no`
    (default: the page's own number; a page copied into a document of its own has another)."""
    page_no = page_no or page.number + 1
    if drawings_beyond_layout(page):
        with _without_line_art(page) as light:
            return _layout_blocks(light, source, confidence, page_no)
    return _layout_blocks(page, source, confidence, page_no)


def _layout_blocks(
    page: pymupdf.Page, source: str, confidence: Callable[[BBox], float | None], page_no: int
) -> list[Block]:
    # pymupdf4llm prints blank lines to stdout, which belongs to --json; its layout features
    # take log(0) on degenerate boxes, which numpy reports as warnings.
    with contextlib.redirect_stdout(io.StringIO()), np.errstate(divide="ignore", invalid="ignore"):
        parsed = document_layout.parse_document(
            page.parent,
            pages=[page.number],
            use_ocr=document_layout.OCRMode.NEVER,
            force_text=True,
            render_html_tables=True,
        )
        chunk = parsed.to_markdown(page_chunks=True, header=True, footer=True)[0]
    layout = parsed.pages[0]
    blocks: list[Block] = []
    for box, info in zip(layout.boxes, chunk["page_boxes"], strict=True):
        kind = _KINDS.get(box.boxclass, BlockKind.TEXT)
        start, end = info["pos"]
        markdown = chunk["text"][start:end]
        html = None
        if kind is BlockKind.TABLE and box.table:
            text, html = table_block_text(box.table.get("html"), markdown)
        else:
            text = _clean_block_text(kind, markdown)
        if not text and kind not in (BlockKind.FIGURE, BlockKind.FORMULA):
            continue
        bbox = (round(box.x0, 2), round(box.y0, 2), round(box.x1, 2), round(box.y1, 2))
        blocks.append(
            Block(
                id=f"p{page_no}-b{len(blocks) + 1}",
                kind=kind,
                bbox=bbox,
                order=len(blocks),
                text=text,
                confidence=confidence(bbox),
                source=source,
                level=(box.header_level or 1) if kind in (BlockKind.TITLE, BlockKind.SECTION_HEADER) else 0,
                html=html,
            )
        )
    return blocks
