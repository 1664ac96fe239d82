"""The region stage: the model reads each planned block's crop, verifying the block's pipeline
drafts; crops are decoded in batches. Its outputs draft the page stage; the user never sees them.

Knows nothing about trees: it hands crops, prompts and draft texts to the decoding core.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from PIL import Image

from hsd_cli.decoding import DecodeRequest, DecodeResult
from hsd_cli.models.family_settings import ModelSettings
from hsd_cli.records.page import Page
from hsd_cli.records.kinds import Block
from hsd_cli.stages.dialect import block_drafts, draft_plan
from hsd_cli.stages.grounding import split_grounding
from hsd_cli.stages.math_policy import near_lossless_rule
from hsd_cli.stages.rasterize import crop_block
from hsd_cli.records.totals import RegionResult

if TYPE_CHECKING:
    from hsd_cli.serving.reader import Reader

REGION_BATCH = 8  # crops decoded together (the planner prices the same batches)


def planned_crops(
    model: Reader, page: Page, regions: Collection[str], settings: ModelSettings,
) -> list[tuple[Block, tuple[Image.Image, str, list[str]]]]:
    """Each block of `regions` (ids) that drafts the page and has a crop, in reading order, with
    its (crop, region prompt, drafts in the family's dialect)."""
    planned = []
    for block, region in draft_plan(page.blocks, lambda block: block.id in regions):
        crop = crop_block(page, block.bbox, model.settings.region_padding_px) if region else None
        if crop is not None:
            planned.append((block, (crop, model.settings.region_prompt, block_drafts(block, settings))))
    return planned


def region_result(block: Block, result: DecodeResult, settings: ModelSettings) -> RegionResult:
    # A looping or empty region output is no draft: the block's pipeline drafts stand in. Its
    # grounding tags place it in the crop, not the page: the page's drafts get its text alone.
    text = split_grounding(result.text, settings.grounding)[1]
    usable = result.stop_reason != "repetition" and text.strip()
    return RegionResult(block.id, text if usable else None, result.stop_reason, result.stats)


def region_stage(model: Reader, page: Page, regions: Collection[str], settings: ModelSettings) -> tuple[RegionResult, ...]:
    """One result per block of `regions` that has a crop, in reading order; crops decoded in batches."""
    planned = planned_crops(model, page, regions, settings)
    if not planned:
        return ()
    largest = max((crop for _, (crop, _, _) in planned), key=lambda crop: max(crop.size))
    sizer = model.sizer(largest)  # one per page: its crops' acceptance is learned across batches
    # Under the rule too: a region's reading only drafts the page, whose text under the rule
    # depends on its drafts anyway, and it reads faster so.
    rule = near_lossless_rule(model)
    results: list[DecodeResult] = []
    for start in range(0, len(planned), REGION_BATCH):
        requests = [
            DecodeRequest(crop, prompt, model.proposer(drafts), allowance=model.allowance(drafts), near_lossless=rule)
            for _, (crop, prompt, drafts) in planned[start : start + REGION_BATCH]
        ]
        results += model.decode_batch(requests, sizer=sizer)
    return tuple(region_result(block, result, settings) for (block, _), result in zip(planned, results, strict=True))
