"""The makers' size rules as functions of sizes: the pixels a page is rendered at, the resize
their client does, and the image the processor makes of it with its token count. No image is
touched here: the renderer and the processor do the work; these say what they will produce.
"""

from __future__ import annotations

import math

from hsd_cli.recipes.recipe import ClientResize, ProcessorLimits, Render

POINTS_PER_INCH = 72.0


def pdftoppm_side(side_pt: float, dpi: float) -> int:
    """One side of pdftoppm's page bitmap: ceil(points * dpi / 72), in that order of operations
    (checked against pdftoppm 22 on the olmOCR-Bench sample: a 720 pt side at 128.8 dpi is
    1288.0000000000002 and comes out 1289 pixels)."""
    return math.ceil(side_pt * dpi / POINTS_PER_INCH)


def pdf_box_size(box: str) -> tuple[float, float]:
    """(width, height) in points of a PDF rectangle as the file writes it ("[0 0 595.276
    841.89001]"), in doubles as poppler reads it. MuPDF keeps PDF numbers in single precision,
    which can tip pdftoppm's ceil: 841.89 and 841.89001 are the same float32 and render 1288 and
    1289 pixels high. PyMuPDF's Document.xref_get_key(page.xref, "MediaBox") prints the float32
    in short form (841.89001 -> "841.89"): exact for boxes written with up to ~7 digits."""
    x0, y0, x1, y1 = (float(value) for value in box.strip("[] ").split())
    return abs(x1 - x0), abs(y1 - y0)


def pdftoppm_longest_side_dpi(size_pt: tuple[float, float], longest_side_px: int) -> float:
    """The `-r` olmOCR passes pdftoppm (olmocr.data.renderpdf.render_pdf_to_base64png): the
    resolution at which the MediaBox's longest side is `longest_side_px`, the MediaBox as
    `pdfinfo -box` prints it (two decimals). pdftoppm then renders the exact box, so a side can
    come out one pixel over (595.276 x 841.89001 pt: 911 x 1289)."""
    printed = [round(side, 2) for side in size_pt]
    return longest_side_px * POINTS_PER_INCH / max(printed)


def hsd_render_scale(size_pt: tuple[float, float], dpi: float, max_pixels: int | None) -> float:
    """hsd's points-to-pixels scale (stages.rasterize.render_scale): `dpi`, lowered so that
    width * height <= max_pixels."""
    scale = dpi / POINTS_PER_INCH
    pixels = size_pt[0] * scale * size_pt[1] * scale
    if max_pixels is not None and pixels > max_pixels:
        scale *= math.sqrt(max_pixels / pixels)
    return scale


def pymupdf_side(side_pt: float, scale: float) -> int:
    """One side of a PyMuPDF pixmap at `scale`: MuPDF rounds the transformed page box outward
    (fz_round_rect), so a side is ceil(points * scale) up to its float tolerance."""
    return math.ceil(side_pt * scale - 1e-3)


def chandra_render_dpi(size_pt: tuple[float, float], dpi: float, min_side_px: int) -> float:
    """Chandra's render resolution (chandra.input.load_pdf_images): IMAGE_DPI, raised so the
    shortest side is MIN_PDF_IMAGE_DIM pixels."""
    return max(min_side_px / min(size_pt) * POINTS_PER_INCH, dpi)


def render_size(render: Render, size_pt: tuple[float, float]) -> tuple[int, int]:
    """(width, height) in pixels of a page of `size_pt` points rendered by `render`'s rule, as
    its renderer rounds."""
    if render.rule == "longest_side":
        dpi = pdftoppm_longest_side_dpi(size_pt, render.longest_side_px)
        return pdftoppm_side(size_pt[0], dpi), pdftoppm_side(size_pt[1], dpi)
    if render.rule == "dpi_min_side":
        scale = chandra_render_dpi(size_pt, render.dpi, render.min_side_px) / POINTS_PER_INCH
    elif render.rule == "dpi_max_side":
        # glmocr.utils.image_utils._render_page_to_pil: the cap is on the longest side.
        scale = min(render.dpi / POINTS_PER_INCH, render.longest_side_px / max(size_pt))
    elif render.rule == "dpi":
        scale = hsd_render_scale(size_pt, render.dpi, render.max_pixels)
    else:
        raise ValueError(f"unknown size rule {render.rule!r}")
    if render.renderer == "pypdfium2":
        # pypdfium2's PdfPage.render: math.ceil(points * scale) per side.
        return math.ceil(size_pt[0] * scale), math.ceil(size_pt[1] * scale)
    return pymupdf_side(size_pt[0], scale), pymupdf_side(size_pt[1], scale)


def chandra_scale_to_fit(size: tuple[int, int], resize: ClientResize) -> tuple[int, int]:
    """The (width, height) chandra.model.util.scale_to_fit resizes an image of `size` to: the
    area brought within [min, max] by one scale, then with a grid (Chandra 2) the sides rounded
    to grid blocks and blocks taken off the side whose loss keeps the aspect ratio best while the
    area is over the maximum; without a grid (Chandra 1) the sides floored (down) or ceiled (up)."""
    width, height = size
    if width <= 0 or height <= 0:
        return size
    max_pixels = resize.max_size[0] * resize.max_size[1]
    min_pixels = resize.min_size[0] * resize.min_size[1]
    pixels = width * height
    if resize.grid_px is None:
        if pixels > max_pixels:
            scale = (max_pixels / pixels) ** 0.5
            return math.floor(width * scale), math.floor(height * scale)
        if pixels < min_pixels:
            scale = (min_pixels / pixels) ** 0.5
            return math.ceil(width * scale), math.ceil(height * scale)
        return size
    scale = 1.0
    if pixels > max_pixels:
        scale = (max_pixels / pixels) ** 0.5
    elif pixels < min_pixels:
        scale = (min_pixels / pixels) ** 0.5
    grid = resize.grid_px
    aspect = width / height
    w_blocks = max(1, round(width * scale / grid))
    h_blocks = max(1, round(height * scale / grid))
    while w_blocks * h_blocks * grid * grid > max_pixels and (w_blocks, h_blocks) != (1, 1):
        if w_blocks == 1:
            h_blocks -= 1
        elif h_blocks == 1:
            w_blocks -= 1
        elif abs((w_blocks - 1) / h_blocks - aspect) < abs(w_blocks / (h_blocks - 1) - aspect):
            w_blocks -= 1
        else:
            h_blocks -= 1
    return w_blocks * grid, h_blocks * grid


def smart_resize(height: int, width: int, limits: ProcessorLimits) -> tuple[int, int]:
    """(height, width) of the image Qwen2-VL's processor makes (transformers'
    qwen2_vl.image_processing_qwen2_vl.smart_resize): sides rounded to the grid, then scaled
    down (floor) or up (ceil) to keep the area within [min_pixels, max_pixels]."""
    factor = limits.grid_px
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio over 200: {width}x{height}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > limits.max_pixels:
        beta = math.sqrt(height * width / limits.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < limits.min_pixels:
        beta = math.sqrt(limits.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_tokens(height: int, width: int, limits: ProcessorLimits) -> int:
    """The placeholder tokens the processor puts in the prompt for an image of (height, width):
    one per merged grid cell of the resized image."""
    h_bar, w_bar = smart_resize(height, width, limits)
    return (h_bar // limits.grid_px) * (w_bar // limits.grid_px)


def processor_input(render: Render, resize: ClientResize | None, limits: ProcessorLimits,
                    size_pt: tuple[float, float]) -> tuple[tuple[int, int], tuple[int, int], int]:
    """For a page of `size_pt` points: the rendered (width, height), the (width, height) the
    processor sees after its resize, and the image's prompt tokens."""
    rendered = render_size(render, size_pt)
    client = chandra_scale_to_fit(rendered, resize) if resize is not None else rendered
    height, width = smart_resize(client[1], client[0], limits)
    return rendered, (width, height), (height // limits.grid_px) * (width // limits.grid_px)
