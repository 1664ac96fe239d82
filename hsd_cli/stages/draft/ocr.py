"""PaddleOCR's PP-OCR models through rapidocr (its wheel ships the ONNX models; no paddle)."""

from __future__ import annotations

import logging
import statistics
from functools import cache

import numpy as np
import pymupdf
from pymupdf4llm.ocr.exec_ocr_interface import exec_ocr_full

from hsd_cli.records import BBox, Block
from hsd_cli.stages.draft.layout import layout_blocks

# One OCR line: (x0, y0, x1, y1) in PDF points, recognition score.
OcrLine = tuple[BBox, float]


@cache
def _engine():
    from rapidocr import RapidOCR

    # The text-direction classifier flips upright lines upside down on clean pages; off.
    engine = RapidOCR(params={"Global.use_cls": False, "Global.log_level": "error"})
    logging.getLogger("RapidOCR").setLevel(logging.ERROR)
    return engine


def _mean_score_inside(lines: list[OcrLine], bbox: BBox) -> float | None:
    x0, y0, x1, y1 = bbox
    scores = [
        score
        for (lx0, ly0, lx1, ly1), score in lines
        if x0 <= (lx0 + lx1) / 2 <= x1 and y0 <= (ly0 + ly1) / 2 <= y1
    ]
    return round(statistics.fmean(scores), 4) if scores else None


class OcrDraft:
    """Recognises every line on the page, then groups lines into typed blocks with the layout model."""

    name = "ocr"

    def __init__(self, dpi: int) -> None:
        self.dpi = dpi

    def blocks(self, page: pymupdf.Page) -> list[Block]:
        lines: list[OcrLine] = []
        page_width = page.rect.width

        def recognise(image: np.ndarray) -> list[tuple[list, str, float]]:
            result = _engine()(image)
            if result.boxes is None:
                return []
            to_points = page_width / image.shape[1]
            for box, score in zip(result.boxes, result.scores):
                xs, ys = [p[0] * to_points for p in box], [p[1] * to_points for p in box]
                lines.append(((min(xs), min(ys), max(xs), max(ys)), float(score)))
            return list(zip(result.boxes.tolist(), result.txts, result.scores))

        def ocr_into_page(page: pymupdf.Page, dpi: int = 150, language=None, keep_ocr_text=False, **_):
            exec_ocr_full(page, recognise, dpi=dpi, keep_ocr_text=keep_ocr_text)

        return layout_blocks(
            page,
            source=self.name,
            ocr_function=ocr_into_page,
            ocr_dpi=self.dpi,
            confidence=lambda bbox: _mean_score_inside(lines, bbox),
        )
