"""Packed region+page decoding (`--stages packed`): the page row and a region row per block
advance in the same forwards; each region output joins the page row's drafts as soon as its row
ends. On a GPU a forward over a page's crops costs about one plain step, so the region stage
comes almost free; only the page output reaches the user, as in every path.

Knows nothing about trees: it hands rows, prompts and draft texts to the decoding core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PIL import Image

from hsd_cli.decoding import DecodeRequest, DecodeResult, decode, decode_batch, make_proposer
from hsd_cli.models.settings import ModelSettings
from hsd_cli.records import Block, PageImage
from hsd_cli.stages.dialect import page_drafts
from hsd_cli.stages.page import PageRead, upright_read
from hsd_cli.stages.region import planned_crops, region_result
from hsd_cli.stats import RegionResult

if TYPE_CHECKING:
    from hsd_cli.stages.vlm import VlmModel

# Region rows beside the page row; the blocks after them keep their pipeline drafts.
PACKED_REGIONS = 15


def packed_stage(
    model: VlmModel, image: PageImage, blocks: tuple[Block, ...], wants_region: Callable[[Block], bool],
    settings: ModelSettings,
) -> tuple[tuple[RegionResult, ...], PageRead]:
    """The region results and the page's reading, decoded together. The page row starts from the
    pipeline's drafts (every block's); rows are prefilled apart, so the crops cost no padding to
    the page's length."""
    target, match = model.target, model.settings.draft_match
    planned = planned_crops(model, image, blocks, wants_region, settings)[:PACKED_REGIONS]
    page_row = DecodeRequest(
        image.image, model.settings.page_prompt, make_proposer(target, page_drafts(blocks, settings), match, growing=True)
    )
    region_rows = [
        DecodeRequest(crop, prompt, make_proposer(target, texts, match), feeds=0) for _, (crop, prompt, texts) in planned
    ]
    packed, *region_results = decode_batch(target, [page_row, *region_rows], model.decode_config, separate_prefill=True)
    regions = tuple(region_result(block, result) for (block, _), result in zip(planned, region_results, strict=True))
    # A page read again because its front matter says it is rotated (rare) is read as the page
    # stage reads it, with the region outputs in place of their blocks' drafts.
    drafts = page_drafts(blocks, settings, {region.block_id: region.text for region in regions if region.text is not None})
    first_read = [packed]

    def read(picture: Image.Image) -> DecodeResult:
        if first_read:
            return first_read.pop()
        return decode(target, picture, model.settings.page_prompt, drafts, model.decode_config, match=match)

    return regions, upright_read(image.image, settings, read)
