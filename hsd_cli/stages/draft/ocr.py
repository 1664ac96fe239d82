"""PaddleOCR's PP-OCR models through rapidocr (its wheel ships the ONNX models; no paddle)."""

from __future__ import annotations

import logging
import statistics
from functools import cache

import numpy as np
import pymupdf
from pymupdf4llm.ocr.exec_ocr_interface import exec_ocr_full

from hsd_cli.records.kinds import BBox, Block
from hsd_cli.stages.draft.layout import layout_blocks
from hsd_cli.stages.rasterize import render_scale

# One OCR line: (x0, y0, x1, y1) in PDF points, recognition score.
OcrLine = tuple[BBox, float]

# The recognised lines are written into the page in this font (Droid Sans Fallback: every script
# the recogniser returns), so that the layout model reads them like any text layer.
_OCR_FONT = pymupdf.Font("cjk")
_OCR_FONT_NAME = "hsd-ocr"


# Threads each OCR model runs on in this process (None: onnxruntime's default, every core). A draft
# process beside others takes its share of the cores (`use_threads`, before the first page).
_threads: int | None = None


def use_threads(count: int) -> None:
    global _threads
    _threads = count


@cache
def _engine():
    from rapidocr import RapidOCR

    # The text-direction classifier flips upright lines upside down on clean pages; off.
    params = {"Global.use_cls": False, "Global.log_level": "error"}
    if _threads is not None:
        params["EngineConfig.onnxruntime.intra_op_num_threads"] = _threads
    engine = RapidOCR(params=params)
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


def recognise_page(page: pymupdf.Page, dpi: int, max_pixels: int) -> list[tuple[pymupdf.Rect, str, float]]:
    """(line box in points, text, score) for every line OCR reads in the page's rendering."""
    scale = render_scale((page.rect.width, page.rect.height), dpi, max_pixels)
    pixmap = page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), alpha=False)
    image = np.frombuffer(pixmap.samples, dtype=np.uint8).reshape(pixmap.height, pixmap.width, 3)
    result = _engine()(image)
    if result.boxes is None:
        return []
    lines = []
    for box, text, score in zip(result.boxes, result.txts, result.scores):
        xs, ys = [p[0] / scale for p in box], [p[1] / scale for p in box]
        rect = pymupdf.Rect(min(xs), min(ys), max(xs), max(ys))
        if text.strip() and not rect.is_empty:
            lines.append((rect, text, float(score)))
    return lines


def replace_text_layer(page: pymupdf.Page, lines: list[tuple[pymupdf.Rect, str, float]]) -> None:
    """Drop every character of the page's own text layer (images and drawings stay) and write
    the OCR lines in its place, each stretched to its box."""
    page.add_redact_annot(page.rect, fill=False, cross_out=False)
    page.apply_redactions(
        images=pymupdf.PDF_REDACT_IMAGE_NONE,
        graphics=pymupdf.PDF_REDACT_LINE_ART_NONE,
        text=pymupdf.PDF_REDACT_TEXT_REMOVE,
    )
    if not lines:
        return
    page.insert_font(fontname=_OCR_FONT_NAME, fontbuffer=_OCR_FONT.buffer)
    for rect, text, _ in lines:
        fontsize = rect.height
        length = _OCR_FONT.text_length(text, fontsize)
        stretch = pymupdf.Matrix(rect.width / length if length > 0 else 1, 1)
        page.insert_text(
            rect.bl + (0, -0.2 * fontsize),  # baseline above the descenders
            text,
            fontsize=fontsize,
            fontname=_OCR_FONT_NAME,
            morph=(rect.bl, stretch),
        )


class OcrDraft:
    """OCR on every page, whatever its text layer says: the page's rendering is recognised, its
    own text layer is replaced by the recognised lines (in memory only), then the layout model
    groups them into typed blocks as for `pdf-text`.

    With `keep_text_layer` (how `auto` OCRs the pages PyMuPDF's analysis flags), legible text of
    the layer stays and only the rest of the page (pictures of text, illegible glyphs) is OCR'd."""

    name = "ocr"

    def __init__(self, dpi: int, max_pixels: int, keep_text_layer: bool = False) -> None:
        self.dpi = dpi
        self.max_pixels = max_pixels
        self.keep_text_layer = keep_text_layer
        self.rendering_ocr = RenderingOcr(dpi, max_pixels)

    def blocks(self, page: pymupdf.Page) -> list[Block]:
        # Unrotated, the rendering's coordinates are the ones text is written in.
        page.remove_rotation()
        if self.keep_text_layer:
            boxes = _ocr_around_text_layer(page, self.dpi)
        else:
            boxes = _ocr_in_place_of_text_layer(page, self.dpi, self.max_pixels)
        return layout_blocks(page, source=self.name, confidence=lambda bbox: _mean_score_inside(boxes, bbox))


class RenderingOcr:
    """OCR of a page's rendering and of nothing else of the page: the draft where reading the page's
    own content (text layer, images, drawings) raises. The rendering becomes a page of its own, as
    a scan is, so that neither the OCR nor the layout touches again what raised."""

    name = OcrDraft.name

    def __init__(self, dpi: int, max_pixels: int) -> None:
        self.dpi = dpi
        self.max_pixels = max_pixels

    def blocks(self, page: pymupdf.Page) -> list[Block]:
        scale = render_scale((page.rect.width, page.rect.height), self.dpi, self.max_pixels)
        rendering = page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), alpha=False)
        with pymupdf.open() as scan:
            scan_page = scan.new_page(width=page.rect.width, height=page.rect.height)
            scan_page.insert_image(scan_page.rect, pixmap=rendering)
            boxes = _ocr_in_place_of_text_layer(scan_page, self.dpi, self.max_pixels)
            return layout_blocks(
                scan_page,
                source=self.name,
                confidence=lambda bbox: _mean_score_inside(boxes, bbox),
                page_no=page.number + 1,
            )


def _ocr_in_place_of_text_layer(page: pymupdf.Page, dpi: int, max_pixels: int) -> list[OcrLine]:
    """OCR of the page's rendering, written into the page in place of its own text layer."""
    lines = recognise_page(page, dpi, max_pixels)
    replace_text_layer(page, lines)
    return [((r.x0, r.y0, r.x1, r.y1), score) for r, _, score in lines]


def _ocr_around_text_layer(page: pymupdf.Page, dpi: int) -> list[OcrLine]:
    """pymupdf4llm's OCR of a page rendered without its legible text, written into the page."""
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

    exec_ocr_full(page, recognise, dpi=dpi, keep_ocr_text=False)
    return lines
