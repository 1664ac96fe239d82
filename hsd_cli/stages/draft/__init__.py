"""The draft stage: typed layout blocks with text for one page, behind one small interface."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import pymupdf
from pymupdf4llm.helpers.utils import analyze_page

from hsd_cli.config import ConvertConfig, DraftBackendName
from hsd_cli.records import Block, PageDraft
from hsd_cli.stages.draft.ocr import OcrDraft
from hsd_cli.stages.draft.paddle import PaddleDraft, PaddleJsonDraft
from hsd_cli.stages.draft.pdf_text import PdfTextDraft
from hsd_cli.stages.draft.tables import plausible_table_block


class DraftBackend(Protocol):
    name: str

    def blocks(self, page: pymupdf.Page) -> list[Block]: ...


class AutoDraft:
    """Per page: the text layer where it is usable, OCR where PyMuPDF's page analysis says it is
    not (keeping what legible text the layer has), or where the text layer turns out to hold no
    text at all (image-only pages that the analysis misjudges)."""

    name = "auto"

    def __init__(self, text: DraftBackend, ocr: DraftBackend) -> None:
        self.text = text
        self.ocr = ocr

    def run(self, page: pymupdf.Page) -> tuple[str, list[Block]]:
        if not analyze_page(page).get("needs_ocr", False):
            blocks = self.text.blocks(page)
            if any(block.text.strip() for block in blocks):
                return self.text.name, blocks
        return self.ocr.name, self.ocr.blocks(page)

    def blocks(self, page: pymupdf.Page) -> list[Block]:
        return self.run(page)[1]


def make_draft_backend(config: ConvertConfig, document_stem: str) -> DraftBackend:
    match config.draft_backend:
        case DraftBackendName.PDF_TEXT:
            return PdfTextDraft()
        case DraftBackendName.OCR:
            return OcrDraft(config.dpi, config.max_pixels)
        case DraftBackendName.PADDLEOCR if config.draft_json_dir is not None:
            return PaddleJsonDraft(Path(config.draft_json_dir), document_stem)
        case DraftBackendName.PADDLEOCR:
            return PaddleDraft(config.dpi)
        case _:
            return AutoDraft(PdfTextDraft(), OcrDraft(config.dpi, config.max_pixels, keep_text_layer=True))


def draft_page(backend: DraftBackend, page: pymupdf.Page) -> PageDraft:
    started = time.perf_counter()
    name, blocks = backend.run(page) if isinstance(backend, AutoDraft) else (backend.name, backend.blocks(page))
    page_size = (page.rect.width, page.rect.height)
    return PageDraft(
        page_no=page.number + 1,
        blocks=tuple(plausible_table_block(block, page_size) for block in blocks),
        backend=name,
        seconds=time.perf_counter() - started,
    )
