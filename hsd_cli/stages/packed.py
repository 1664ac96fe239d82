"""Packed region+page decoding (`--stages packed`): the page row and a region row per block
advance in the same forwards; each region output joins the page row's drafts as soon as its row
ends. On a GPU a forward over a page's crops costs about one plain step, so the region stage
comes almost free; only the page output reaches the user, as in every path.

Knows nothing about trees: it hands rows, prompts and draft texts to the decoding core.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING

from hsd_cli.decoding import DecodeRequest
from hsd_cli.models.family_settings import ModelSettings
from hsd_cli.records.page import Page, Reading
from hsd_cli.stages.dialect import page_drafts
from hsd_cli.stages.math_policy import near_lossless_rule
from hsd_cli.stages.page_stage import page_stage
from hsd_cli.stages.region import planned_crops, region_result

if TYPE_CHECKING:
    from hsd_cli.serving.reader import Reader

# Region rows beside the page row; the blocks after them keep their pipeline drafts.
PACKED_REGIONS = 15


def packed_stage(model: Reader, page: Page, regions: Collection[str], settings: ModelSettings) -> Reading:
    """The page's reading with the region results of the blocks of `regions` (the first
    PACKED_REGIONS that have a crop), decoded together. The page row starts from the pipeline's
    drafts (every block's); rows are prefilled apart, so the crops cost no padding to the page's
    length."""
    planned = planned_crops(model, page, regions, settings)[:PACKED_REGIONS]
    drafts = page_drafts(page.blocks, settings, page_size=page.size_pt)
    # The region outputs that join the page row's drafts come too late for its guard's allowance.
    rule = near_lossless_rule(model)
    page_row = DecodeRequest(
        page.model_view, model.settings.page_prompt, model.proposer(drafts, growing=True), allowance=model.allowance(drafts),
        near_lossless=rule,
    )
    region_rows = [
        DecodeRequest(crop, prompt, model.proposer(texts), feeds=0, allowance=model.allowance(texts), near_lossless=rule)
        for _, (crop, prompt, texts) in planned
    ]
    packed, *region_results = model.decode_batch([page_row, *region_rows], separate_prefill=True, sizer=model.sizer(page.model_view))
    results = tuple(region_result(block, result, settings) for (block, _), result in zip(planned, region_results, strict=True))
    # A page read again because its front matter says it is rotated (rare) is read as the page
    # stage reads it, with the region outputs in place of their blocks' drafts.
    texts = {region.block_id: region.text for region in results if region.text is not None}
    drafts = page_drafts(page.blocks, settings, texts, page.size_pt)
    return replace(page_stage(model, page.model_view, drafts, settings, upright=packed), regions=results)
