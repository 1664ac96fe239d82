"""The region stage: the model reads each planned block's crop, verifying the block's pipeline
drafts; crops are decoded in batches. Its outputs draft the page stage; the user never sees them.

Knows nothing about trees: it hands crops, prompts and draft texts to the decoding core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PIL import Image

from hsd_cli.config import Stages
from hsd_cli.decoding import DecodeResult, decode_many
from hsd_cli.models.settings import ModelSettings
from hsd_cli.records import Block, BlockKind, PageImage
from hsd_cli.stages.dialect import block_drafts, draft_plan
from hsd_cli.stages.draft.pdf_text import PdfTextDraft
from hsd_cli.stages.rasterize import crop_block
from hsd_cli.stats import RegionResult

if TYPE_CHECKING:
    from hsd_cli.stages.vlm import VlmModel

REGION_BATCH = 8


def region_planner(stages: Stages) -> Callable[[Block], bool]:
    """Which blocks get a region pass. auto: only where the pipeline draft is uncertain, since a
    born-digital text layer is already what the page stage would accept (docs/method.md, section 7)."""
    if stages in (Stages.REGION_PAGE, Stages.PACKED):
        return lambda block: True
    if stages is Stages.PAGE:
        return lambda block: False
    return lambda block: block.kind in (BlockKind.TABLE, BlockKind.FORMULA) or block.source != PdfTextDraft.name


def planned_crops(
    model: VlmModel, image: PageImage, blocks: tuple[Block, ...], wants_region: Callable[[Block], bool],
    settings: ModelSettings,
) -> list[tuple[Block, tuple[Image.Image, str, list[str]]]]:
    """Each planned block that has a crop, in reading order, with its (crop, region prompt, drafts
    in the family's dialect)."""
    planned = []
    for block, region in draft_plan(blocks, wants_region):
        crop = crop_block(image, block.bbox, model.settings.region_padding_px) if region else None
        if crop is not None:
            planned.append((block, (crop, model.settings.region_prompt, block_drafts(block, settings))))
    return planned


def region_result(block: Block, result: DecodeResult) -> RegionResult:
    # A looping or empty region output is no draft: the block's pipeline drafts stand in.
    usable = result.stop_reason != "repetition" and result.text.strip()
    return RegionResult(block.id, result.text if usable else None, result.stop_reason, result.stats)


def region_stage(
    model: VlmModel, image: PageImage, blocks: tuple[Block, ...], wants_region: Callable[[Block], bool],
    settings: ModelSettings,
) -> tuple[RegionResult, ...]:
    """One result per planned block that has a crop, in reading order; crops decoded in batches."""
    planned = planned_crops(model, image, blocks, wants_region, settings)
    results = decode_many(
        model.target, [item for _, item in planned], model.decode_config,
        match=model.settings.draft_match, batch_size=REGION_BATCH,
    )
    return tuple(region_result(block, result) for (block, _), result in zip(planned, results, strict=True))
