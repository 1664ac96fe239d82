"""PP-StructureV3 drafts: run through the optional `paddleocr` package, or read from its result JSON."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pymupdf

from hsd_cli.records.kinds import Block, BlockKind
from hsd_cli.stages.draft.table_text import table_block_text

_KINDS = {
    "doc_title": BlockKind.TITLE,
    "paragraph_title": BlockKind.SECTION_HEADER,
    "abstract": BlockKind.TEXT,
    "content": BlockKind.TEXT,
    "reference": BlockKind.TEXT,
    "reference_content": BlockKind.TEXT,
    "text": BlockKind.TEXT,
    "aside_text": BlockKind.TEXT,
    "list": BlockKind.LIST,
    "table": BlockKind.TABLE,
    "formula": BlockKind.FORMULA,
    "display_formula": BlockKind.FORMULA,
    "inline_formula": BlockKind.FORMULA,
    "image": BlockKind.FIGURE,
    "figure": BlockKind.FIGURE,
    "chart": BlockKind.FIGURE,
    "seal": BlockKind.FIGURE,
    "header_image": BlockKind.PAGE_HEADER,
    "footer_image": BlockKind.PAGE_FOOTER,
    "figure_title": BlockKind.CAPTION,
    "table_title": BlockKind.CAPTION,
    "chart_title": BlockKind.CAPTION,
    "figure_table_chart_title": BlockKind.CAPTION,
    "vision_footnote": BlockKind.FOOTNOTE,
    "footnote": BlockKind.FOOTNOTE,
    "algorithm": BlockKind.CODE,
    "header": BlockKind.PAGE_HEADER,
    "footer": BlockKind.PAGE_FOOTER,
    "number": BlockKind.PAGE_FOOTER,
}

# PaddleX renders PDF pages at zoom 2 (144 dpi) when result JSON does not state the image size.
PADDLE_PDF_DPI = 144


def blocks_from_parsing_results(
    result: dict[str, Any], page: pymupdf.Page, source: str, pixels_per_point: float
) -> list[Block]:
    """Blocks from one PP-StructureV3 page result (`parsing_res_list`), bboxes scaled to points."""
    if "res" in result and "parsing_res_list" not in result:
        result = result["res"]
    if "width" in result and result["width"]:
        pixels_per_point = float(result["width"]) / page.rect.width
    blocks: list[Block] = []
    for entry in result.get("parsing_res_list", []):
        kind = _KINDS.get(str(entry.get("block_label", "text")), BlockKind.TEXT)
        content = str(entry.get("block_content", "")).strip()
        html = None
        if kind is BlockKind.TABLE and "<table" in content:
            content, html = table_block_text(content, content)
        if kind is BlockKind.FORMULA:
            content = content.strip("$").strip()
        x0, y0, x1, y1 = (float(v) / pixels_per_point for v in entry.get("block_bbox", (0, 0, 0, 0)))
        blocks.append(
            Block(
                id=f"p{page.number + 1}-b{len(blocks) + 1}",
                kind=kind,
                bbox=(round(x0, 2), round(y0, 2), round(x1, 2), round(y1, 2)),
                order=len(blocks),
                text=content,
                confidence=None,
                source=source,
                level=1 if kind is BlockKind.TITLE else 2 if kind is BlockKind.SECTION_HEADER else 0,
                html=html,
            )
        )
    return blocks


def find_result_json(results_dir: Path, stem: str, page_index: int) -> Path | None:
    """PP-StructureV3's save_to_json names: `<stem>_<page>_res.json` (PDF) or `<stem>_res.json`."""
    for name in (f"{stem}_{page_index}_res.json", f"{stem}_res.json" if page_index == 0 else None):
        if name and (results_dir / name).is_file():
            return results_dir / name
    return None


class PaddleJsonDraft:
    """Reads drafts that PP-StructureV3 computed elsewhere (`--draft-json DIR`)."""

    name = "paddleocr-json"
    rendering_ocr = None  # reads result files only: no page content of its own to stand in for

    def __init__(self, results_dir: Path, stem: str) -> None:
        self.results_dir = results_dir
        self.stem = stem

    def blocks(self, page: pymupdf.Page) -> list[Block]:
        path = find_result_json(self.results_dir, self.stem, page.number)
        if path is None:
            raise FileNotFoundError(
                f"no PP-StructureV3 result for page {page.number + 1} of {self.stem} in {self.results_dir}"
            )
        result = json.loads(path.read_text(encoding="utf-8"))
        return blocks_from_parsing_results(result, page, self.name, PADDLE_PDF_DPI / 72)


@cache
def _pipeline():
    try:
        from paddleocr import PPStructureV3
    except ImportError:
        raise RuntimeError(
            "the paddleocr backend needs the optional extra: pip install 'hsd-cli[paddleocr]'"
        ) from None
    return PPStructureV3(
        use_doc_orientation_classify=False, use_doc_unwarping=False, use_textline_orientation=False
    )


class PaddleDraft:
    """PP-StructureV3 run in-process; its models must already be on disk (no downloads here)."""

    name = "paddleocr"
    rendering_ocr = None  # reads the page's rendering only

    def __init__(self, dpi: int) -> None:
        self.dpi = dpi

    def blocks(self, page: pymupdf.Page) -> list[Block]:
        pixmap = page.get_pixmap(dpi=self.dpi, alpha=False)
        image = np.frombuffer(pixmap.samples, dtype=np.uint8).reshape(pixmap.height, pixmap.width, 3)
        (result,) = _pipeline().predict(input=image[:, :, ::-1].copy())  # paddle expects BGR
        return blocks_from_parsing_results(result.json, page, self.name, self.dpi / 72)
