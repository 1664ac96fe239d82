"""The draft stage: typed layout blocks with text for one page, behind one small interface."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import pymupdf
from pymupdf4llm.helpers.utils import analyze_page

from hsd_cli.config import DocumentConfig, DraftBackendName
from hsd_cli.records.page import Page
from hsd_cli.records.kinds import Block
from hsd_cli.stages.draft.layout import MAX_LAYOUT_DRAWINGS, drawings_beyond_layout
from hsd_cli.stages.draft.ocr import OcrDraft, RenderingOcr
from hsd_cli.stages.draft.paddle import PaddleDraft, PaddleJsonDraft
from hsd_cli.stages.draft.pdf_text import PdfTextDraft
from hsd_cli.stages.draft.table_text import plausible_table_block
from hsd_cli.stages.outcome import drafted_page


class DraftBackend(Protocol):
    name: str
    # Where reading the page's own content (text layer, images, drawings) raises, OCR of its
    # rendering alone stands in; None where the backend reads nothing else of the page.
    rendering_ocr: RenderingOcr | None

    def blocks(self, page: pymupdf.Page) -> list[Block]: ...


class AutoDraft:
    """Per page: the text layer where it is usable, OCR where PyMuPDF's page analysis says it is
    not (keeping what legible text the layer has), or where the text layer turns out to hold no
    text at all (image-only pages that the analysis misjudges)."""

    name = "auto"

    def __init__(self, text: DraftBackend, ocr: OcrDraft) -> None:
        self.text = text
        self.ocr = ocr
        self.rendering_ocr = ocr.rendering_ocr

    def run(self, page: pymupdf.Page) -> tuple[str, list[Block]]:
        if not analyze_page(page).get("needs_ocr", False):
            blocks = self.text.blocks(page)
            if any(block.text.strip() for block in blocks):
                return self.text.name, blocks
        return self.ocr.name, self.ocr.blocks(page)

    def blocks(self, page: pymupdf.Page) -> list[Block]:
        return self.run(page)[1]


def make_draft_backend(config: DocumentConfig, document_stem: str) -> DraftBackend:
    match config.draft_backend:
        case DraftBackendName.PDF_TEXT:
            return PdfTextDraft(RenderingOcr(config.dpi, config.max_pixels))
        case DraftBackendName.OCR:
            return OcrDraft(config.dpi, config.max_pixels)
        case DraftBackendName.PADDLEOCR if config.draft_json_dir is not None:
            return PaddleJsonDraft(Path(config.draft_json_dir), document_stem)
        case DraftBackendName.PADDLEOCR:
            return PaddleDraft(config.dpi)
        case _:
            return AutoDraft(PdfTextDraft(), OcrDraft(config.dpi, config.max_pixels, keep_text_layer=True))


# The backends whose blocks come from the layout model over the page (auto resolves to one of them).
_LAID_OUT = (PdfTextDraft.name, OcrDraft.name)

# MuPDF's errors say "code=7: unknown image file format"; the code means nothing to a reader.
_MUPDF_CODE = re.compile(r"^code=\d+: ")


def exception_line(exc: Exception) -> str:
    """An exception as a page's notice names it: "TypeName: message", on one line."""
    message = _MUPDF_CODE.sub("", " ".join(str(exc).split()))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def draft_page(backend: DraftBackend, page: pymupdf.Page, rendered: Page | None = None) -> Page:
    """The page record (`rendered`, or one of the page's number and size) with its draft: blocks,
    the backend that ran and flags. Where reading the page raises (an image MuPDF cannot decode,
    say), OCR of its rendering stands in, flagged `degraded` with a notice that says why; so it
    does where the layout left out the page's vector paths. An error of that OCR itself propagates."""
    started = time.perf_counter()
    try:
        name, blocks = backend.run(page) if isinstance(backend, AutoDraft) else (backend.name, backend.blocks(page))
    except Exception as exc:  # noqa: BLE001 - MuPDF raises many kinds on broken content; the rendering still reads
        if backend.rendering_ocr is None:
            raise
        name, blocks = backend.rendering_ocr.name, backend.rendering_ocr.blocks(page)
        reason = f"text layer unreadable ({exception_line(exc)}); OCR of the rendering"
    else:
        reason = _drawings_left_out(page) if name in _LAID_OUT else None
    page_size = (page.rect.width, page.rect.height)
    record = rendered or Page(page_no=page.number + 1, size_pt=page_size)
    drafted = replace(
        record, blocks=tuple(plausible_table_block(block, page_size) for block in blocks), backend=name,
        timings=record.timings | {"draft_s": time.perf_counter() - started},
    )
    return drafted_page(drafted, reason)


def _drawings_left_out(page: pymupdf.Page) -> str | None:
    drawings = drawings_beyond_layout(page)
    if not drawings:
        return None
    return f"{drawings:,} vector drawings, over the {MAX_LAYOUT_DRAWINGS:,} the layout reads: laid out without them"

