"""DocumentResult -> JSON with a named, versioned schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hsd_cli.records.page import DocumentResult, Page
from hsd_cli.records.blocks import blocks_json
from hsd_cli.records.kinds import Block, Grounding, PageFlag
from hsd_cli.records.totals import counts_json, regions_json

SCHEMA_NAME = "hsd.document"
SCHEMA_VERSION = 2  # 2: page `notice`, text_source `model+draft`, no `model_output`


def block_json(block: Block, image_ref: str | None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": block.id,
        "kind": block.kind.value,
        "bbox": list(block.bbox),
        "order": block.order,
        "text": block.text,
        "confidence": block.confidence,
        "source": block.source,
    }
    if block.level:
        record["level"] = block.level
    if block.html is not None:
        record["html"] = block.html
    if image_ref:
        record["image"] = image_ref
    return record


def stats_json(page: Page) -> dict[str, Any] | None:
    """The page's `stats`: what the model's stages did, in counts (and the planner's predicted
    seconds, which a profile fixes); None where the model did not read the page."""
    reading = page.reading
    if reading is None:
        return None
    result = reading.result
    stats: dict[str, Any] = {"page": counts_json(result.stats), "stop_reason": result.stop_reason, "dialect": reading.dialect}
    if reading.front_matter is not None:
        stats["front_matter"] = reading.front_matter
    if reading.reads > 1:
        stats["rotation"] = {"degrees": reading.rotation, "reads": reading.reads, "earlier_forwards": reading.earlier_forwards}
    if reading.model_input is not None:
        stats["model_input"] = reading.model_input.as_json()
    if reading.model_text is not None:
        stats["model_text"] = reading.model_text
    if reading.retries or reading.not_accepted:
        stats["attempts"] = {
            "retried": [retry.as_json() for retry in reading.retries], "not_accepted": list(reading.not_accepted),
        }
    if reading.near_lossless is not None:
        stats["near_lossless"] = {"tau": reading.near_lossless, "relaxed": result.stats.relaxed}
    if reading.regions:
        stats["regions"] = regions_json(reading.regions)
    if reading.blocks or reading.layout is not None:
        stats["two_step"] = blocks_json(reading.layout, reading.blocks)
    if reading.baseline is not None:
        stats["baseline"] = reading.baseline.as_json()
    if page.plan is not None and page.plan.predicted:
        stats["plan"] = page.plan.as_json()
    if result.loop is not None:
        stats["repetition"] = vars(result.loop).copy()
    return stats


def grounding_json(grounding: Grounding, size_pt: tuple[float, float]) -> dict[str, Any]:
    """The layout the model's grounding tags gave: each block's label, its boxes as the model
    wrote them (0 to `scale` across the page's width and height, from its top-left corner) and
    in the page's points, and its text."""
    width, height = size_pt

    def in_points(box: tuple[float, float, float, float]) -> list[float]:
        x0, y0, x1, y1 = box
        return [round(x0 / grounding.scale * width, 2), round(y0 / grounding.scale * height, 2),
                round(x1 / grounding.scale * width, 2), round(y1 / grounding.scale * height, 2)]

    blocks = [
        {
            "label": block.label, "boxes": [list(box) for box in block.boxes],
            "boxes_pt": [in_points(box) for box in block.boxes], "text": block.text,
        }
        for block in grounding.blocks
    ]
    return {"scale": grounding.scale, "blocks": blocks}


def text_source(page: Page) -> str:
    """Where the page's Markdown comes from: the draft, the model, the model then the draft after
    a loop, or the makers' fallback for answers they accept none of (the text layer, or nothing)."""
    if page.text is None:
        return "draft"
    if PageFlag.NOT_ACCEPTED in page.flags:
        return "makers_fallback"
    return "model" if page.draft_from is None else "model+draft"


def page_json(page: Page, markdown: str, image_ref: Callable[[Block], str | None]) -> dict[str, Any]:
    width, height = page.size_pt
    record = {
        "page": page.page_no,
        "width": round(width, 2),
        "height": round(height, 2),
        "unit": "pt",
        "origin": "top-left",
        "draft_backend": page.backend,
        "flags": list(page.flags),
        "text_source": text_source(page),
        "markdown": markdown,
        "blocks": [block_json(b, image_ref(b)) for b in page.blocks],
        # Counts only: wall-clock timings live in the run manifest, so identical runs give identical bytes.
        "stats": stats_json(page),
    }
    if page.reading is not None and page.reading.grounding is not None:
        record["grounding"] = grounding_json(page.reading.grounding, page.size_pt)
    if page.notice is not None:
        record["notice"] = page.notice  # why the page is not the model's full reading (also on stderr)
    return record


def document_json(
    result: DocumentResult,
    source: dict[str, Any],
    config: dict[str, Any],
    page_markdown: Callable[[Page], str],
    image_ref: Callable[[Block], str | None],
) -> str:
    from hsd_cli import __version__

    document = {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "hsd_version": __version__,
        "source": source,
        "metadata": result.metadata,
        "config": config,
        "page_count": result.page_count,
        "warnings": list(result.warnings),
        "pages": [page_json(p, page_markdown(p), image_ref) for p in result.pages],
    }
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"
