"""Open a PDF or image as a document and render its pages one at a time."""

from __future__ import annotations

import math
from pathlib import Path

import pymupdf
from PIL import Image

from hsd_cli.records import DocStatus, PageImage

pymupdf.TOOLS.mupdf_display_errors(False)  # MuPDF warnings go to our own messages, not stderr


class DocumentError(Exception):
    """A document that cannot be converted; carries the status it ends with."""

    def __init__(self, status: DocStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _tail_has_eof(path: Path) -> bool:
    with path.open("rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        handle.seek(max(0, size - 2048))
        return b"%%EOF" in handle.read()


def open_document(path: Path, kind: str | None, password: str | None) -> pymupdf.Document:
    """Open `path` as a PDF (images become one-page PDFs) or raise DocumentError."""
    if path.stat().st_size == 0:
        raise DocumentError(DocStatus.CORRUPT, "empty file (0 bytes)")
    if kind is None:
        raise DocumentError(DocStatus.CORRUPT, "not a PDF or image (unrecognised content)")
    if kind == "pdf" and not _tail_has_eof(path):
        raise DocumentError(DocStatus.CORRUPT, "truncated PDF (no %%EOF at the end; file cut short?)")
    try:
        doc = pymupdf.open(path, filetype=kind)
    except (pymupdf.FileDataError, pymupdf.EmptyFileError, RuntimeError) as exc:
        raise DocumentError(DocStatus.CORRUPT, f"cannot open {kind.upper()}: {exc}") from None
    if doc.needs_pass:
        if not password:
            raise DocumentError(DocStatus.ENCRYPTED, "encrypted PDF (give --password)")
        if not doc.authenticate(password):
            raise DocumentError(DocStatus.ENCRYPTED, "encrypted PDF: the --password is wrong")
    if not doc.is_pdf:
        # Images: the draft stage and the layout model work on PDF pages.
        doc = pymupdf.open("pdf", doc.convert_to_pdf())
    if doc.page_count == 0:
        raise DocumentError(DocStatus.CORRUPT, "document has no pages")
    return doc


def render_scale(size_pt: tuple[float, float], dpi: int, max_pixels: int) -> float:
    """Points-to-pixels scale for `dpi`, lowered so width * height <= max_pixels."""
    scale = dpi / 72.0
    width, height = size_pt
    pixels = width * scale * height * scale
    if pixels > max_pixels:
        scale *= math.sqrt(max_pixels / pixels)
    return scale


def render_page(page: pymupdf.Page, dpi: int, max_pixels: int) -> PageImage:
    size_pt = (page.rect.width, page.rect.height)
    scale = render_scale(size_pt, dpi, max_pixels)
    pixmap = page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), alpha=False)
    image = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples)
    return PageImage(page_no=page.number + 1, image=image, scale=scale, size_pt=size_pt)


def crop_block(image: PageImage, bbox: tuple[float, float, float, float], pad: int) -> Image.Image | None:
    """The pixels of a block (bbox in points) with `pad` pixels around it; None when too small.
    The region stage and the replay-model builder both crop here, so their crops are identical."""
    x0, y0, x1, y1 = (v * image.scale for v in bbox)
    box = (max(0, round(x0) - pad), max(0, round(y0) - pad),
           min(image.image.width, round(x1) + pad), min(image.image.height, round(y1) + pad))
    if box[2] - box[0] < 8 or box[3] - box[1] < 8:
        return None
    return image.image.crop(box)
