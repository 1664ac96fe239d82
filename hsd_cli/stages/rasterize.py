"""Open a PDF or image as a document and render its pages one at a time."""

from __future__ import annotations

import io
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pymupdf
from PIL import Image, ImageFile, ImageSequence, UnidentifiedImageError

from hsd_cli.recipes.recipe import Render
from hsd_cli.recipes.sizes import hsd_render_scale as render_scale
from hsd_cli.recipes.sizes import pdf_box_size, render_size
from hsd_cli.records.page import Page
from hsd_cli.records.kinds import DocStatus

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


@contextmanager
def _pil_decoding(lenient: bool) -> Iterator[None]:
    """PIL set to refuse (strict) or fill in (lenient) image data that is cut short, quietly."""
    previous = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = lenient
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PIL's warnings (EXIF, large images) are not the user's news
            yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = previous


def _image_damage(path: Path) -> str | None:
    """What stops the image file from decoding cleanly (data cut short or broken), or None.
    MuPDF converts such images without a word, holding whatever the damage left."""
    with _pil_decoding(lenient=False):
        try:
            with Image.open(path) as image:
                for frame in ImageSequence.Iterator(image):
                    if image.format == "JPEG":
                        frame.draft(frame.mode, (frame.width // 8, frame.height // 8))  # still reads every byte
                    frame.load()
        except Image.DecompressionBombError:
            return None  # too large for PIL to check by default: MuPDF alone decodes it, as before
        except UnidentifiedImageError:
            return "header or image directory unreadable; file cut short?"
        except (OSError, SyntaxError, ValueError) as exc:
            return str(exc) or type(exc).__name__
    return None


def _decodable_frames(path: Path) -> list[Image.Image]:
    """The frames of a damaged image as far as they decode: the rest of a cut-short frame is
    PIL's fill, frames after the damage are lost."""
    frames: list[Image.Image] = []
    with _pil_decoding(lenient=True):
        try:
            with Image.open(path) as image:
                for frame in ImageSequence.Iterator(image):
                    frame.load()
                    frames.append(frame.convert("RGB") if frame.mode not in ("1", "L", "RGB") else frame.copy())
        except (OSError, SyntaxError, ValueError):
            pass
    return frames


def _is_blank(image: Image.Image) -> bool:
    extrema = image.getextrema()
    bands = extrema if isinstance(extrema[0], tuple) else (extrema,)
    return all(low == high for low, high in bands)


def _partial_image_document(path: Path, kind: str, damage: str) -> pymupdf.Document:
    """A PDF of what decodes of a damaged image; DocumentError(CORRUPT) when nothing does (no
    frame, or only PIL's one-colour fill)."""
    frames = _decodable_frames(path)
    if all(_is_blank(frame) for frame in frames):
        raise DocumentError(DocStatus.CORRUPT, f"damaged {kind.upper()}: no image data decodes ({damage})")
    doc = pymupdf.open()
    for frame in frames:
        buffer = io.BytesIO()
        frame.save(buffer, format="PNG", dpi=frame.info.get("dpi", (72, 72)))
        with pymupdf.open("png", buffer.getvalue()) as image:
            doc.insert_pdf(pymupdf.open("pdf", image.convert_to_pdf()))
    return doc


def open_document(path: Path, kind: str | None, password: str | None) -> tuple[pymupdf.Document, str | None]:
    """Open `path` as a PDF (images become one-page PDFs) or raise DocumentError. With it, what is
    wrong with an image that decodes only in part (its document is then degraded), else None."""
    if path.stat().st_size == 0:
        raise DocumentError(DocStatus.CORRUPT, "empty file (0 bytes)")
    if kind is None:
        raise DocumentError(DocStatus.CORRUPT, "not a PDF or image (unrecognised content)")
    if kind == "pdf" and not _tail_has_eof(path):
        raise DocumentError(DocStatus.CORRUPT, "truncated PDF (no %%EOF at the end; file cut short?)")
    if kind != "pdf" and (damage := _image_damage(path)) is not None:
        return (
            _partial_image_document(path, kind, damage),
            f"damaged {kind.upper()} ({damage}): only what decodes is converted",
        )
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
        try:
            doc = pymupdf.open("pdf", doc.convert_to_pdf())
        except pymupdf.mupdf.FzErrorBase as exc:  # image data MuPDF refuses though PIL took it
            raise DocumentError(DocStatus.CORRUPT, f"cannot decode {kind.upper()}: {exc}") from None
    if doc.page_count == 0:
        raise DocumentError(DocStatus.CORRUPT, "document has no pages")
    return doc, None


def render_page(page: pymupdf.Page, dpi: int, max_pixels: int) -> Page:
    """The page record's first slots: its number, size and picture."""
    started = time.perf_counter()
    size_pt = (page.rect.width, page.rect.height)
    scale = render_scale(size_pt, dpi, max_pixels)
    pixmap = page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), alpha=False)
    picture = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples)
    return Page(
        page_no=page.number + 1, size_pt=size_pt, picture=picture, scale=scale,
        timings={"render_s": time.perf_counter() - started},
    )


def _displayed_size_pt(page: pymupdf.Page) -> tuple[float, float]:
    """The page's size as it is shown, from its MediaBox as the file writes it (in doubles, as
    poppler reads it: recipes.sizes.pdf_box_size), turned by its /Rotate; an image's own size."""
    try:
        width, height = pdf_box_size(page.parent.xref_get_key(page.xref, "MediaBox")[1])
    except (ValueError, RuntimeError, AttributeError):
        return page.rect.width, page.rect.height
    return (height, width) if page.rotation % 180 else (width, height)


def model_picture_size(page: pymupdf.Page, render: Render) -> tuple[int, int]:
    """(width, height) in pixels of the page as its model's makers render it: the size their rule
    gives (recipes.sizes.render_size) for the page as it is shown."""
    return render_size(render, _displayed_size_pt(page))


def render_for_model(page: pymupdf.Page, render: Render) -> Image.Image:
    """The page as its model's makers render it, at `model_picture_size`, drawn by PyMuPDF: their
    renderer's own pixels would differ a little, at the same size (docs/recipes.md)."""
    width, height = model_picture_size(page, render)
    matrix = pymupdf.Matrix(width / page.rect.width, height / page.rect.height)
    pixmap = page.get_pixmap(matrix=matrix, alpha=False)
    picture = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples)
    # PyMuPDF rounds the scaled page outward: at most a pixel off, which the makers' rule fixes.
    return picture if picture.size == (width, height) else picture.resize((width, height), Image.Resampling.LANCZOS)


def crop_box(page: Page, bbox: tuple[float, float, float, float], pad: int) -> tuple[int, int, int, int] | None:
    """The pixel box of a block (bbox in points) with `pad` pixels around it; None when too small."""
    x0, y0, x1, y1 = (v * page.scale for v in bbox)
    box = (max(0, round(x0) - pad), max(0, round(y0) - pad),
           min(page.picture.width, round(x1) + pad), min(page.picture.height, round(y1) + pad))
    if box[2] - box[0] < 8 or box[3] - box[1] < 8:
        return None
    return box


def crop_block(page: Page, bbox: tuple[float, float, float, float], pad: int) -> Image.Image | None:
    """The pixels of a block's `crop_box`. The region stage and the replay-model builder both crop
    here, so their crops are identical."""
    box = crop_box(page, bbox, pad)
    return page.picture.crop(box) if box is not None else None
