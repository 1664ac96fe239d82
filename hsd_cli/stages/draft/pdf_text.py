"""The PDF's own text layer, grouped into typed blocks by PyMuPDF's layout model."""

from __future__ import annotations

import pymupdf

from hsd_cli.records.kinds import Block
from hsd_cli.stages.draft.layout import layout_blocks
from hsd_cli.stages.draft.math import with_math
from hsd_cli.stages.draft.ocr import RenderingOcr
from hsd_cli.stages.draft.rtl import logical_order


class PdfTextDraft:
    name = "pdf-text"

    def __init__(self, rendering_ocr: RenderingOcr | None = None) -> None:
        self.rendering_ocr = rendering_ocr

    def blocks(self, page: pymupdf.Page) -> list[Block]:
        # Text from the file itself is what the author wrote: certain, hence confidence 1.
        blocks = layout_blocks(page, source=self.name, confidence=lambda bbox: 1.0)
        return [_rebuilt(page, block) for block in blocks]


def _rebuilt(page: pymupdf.Page, block: Block) -> Block:
    """Text the layout text gets wrong, rebuilt from the glyphs: right-to-left blocks in logical
    order, or else inline math as LaTeX."""
    ordered = logical_order(page, block)
    return ordered if ordered is not block else with_math(page, block)
