"""The region stage: the model reads each planned block's crop, verifying the block's pipeline
drafts; crops are decoded in batches. Its outputs draft the page stage; the user never sees them.

Knows nothing about trees: it hands crops, prompts and draft texts to the decoding core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hsd_cli.config import Stages
from hsd_cli.decoding import decode_many
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
    if stages is Stages.REGION_PAGE:
        return lambda block: True
    if stages is Stages.PAGE:
        return lambda block: False
    return lambda block: block.kind in (BlockKind.TABLE, BlockKind.FORMULA) or block.source != PdfTextDraft.name


def region_stage(
    model: VlmModel, image: PageImage, blocks: tuple[Block, ...], wants_region: Callable[[Block], bool],
    settings: ModelSettings,
) -> tuple[RegionResult, ...]:
    """One result per planned block that has a crop, in reading order; each crop verifies its
    block's drafts in the family's dialect (`settings`)."""
    planned = []
    for block, region in draft_plan(blocks, wants_region):
        crop = crop_block(image, block.bbox, model.settings.region_padding_px) if region else None
        if crop is not None:
            planned.append((block, (crop, model.settings.region_prompt, block_drafts(block, settings))))
    results = decode_many(
        model.target, [item for _, item in planned], model.decode_config,
        match=model.settings.draft_match, batch_size=REGION_BATCH,
    )
    return tuple(
        # A looping or empty region output is no draft: the block's pipeline drafts stand in.
        RegionResult(
            block_id=block.id,
            text=result.text if result.stop_reason != "repetition" and result.text.strip() else None,
            stop_reason=result.stop_reason,
            counts=result.stats,
        )
        for (block, _), result in zip(planned, results, strict=True)
    )
