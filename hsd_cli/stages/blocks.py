"""The two-step way (`Way.BLOCKS`), as the makers of MinerU2.5, PaddleOCR-VL and GLM-OCR read a
page: the layout first, then every block's crop read with the prompt for its kind, in one batch;
the blocks' readings, by their makers' rules and in reading order, are the page's text. No page
pass follows.

The layout: MinerU2.5 writes it itself ("\\nLayout Detection:" on the page squashed to 1,036 px a
side), its answer drafted by hsd's draft layout written as MinerU's box tokens; the others'
layout models (PP-DocLayoutV2 / V3) are stood in for by hsd's draft layout. Each block's draft is
the text of the draft's blocks inside its box, in the model's dialect (OTSL for tables where the
model answers in it, LaTeX without delimiters for formulas). Every read is verified as the region
stage verifies a crop: the same lossless decoding, knowing nothing about trees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PIL import Image

from hsd_cli.decoding import DecodeRequest, DecodeResult, DecodeStats
from hsd_cli.models.family_settings import ModelSettings
from hsd_cli.models.layout import FoundBlock
from hsd_cli.recipes.block_text import block_text, page_markdown
from hsd_cli.recipes.blocks import block_picture, grid_box
from hsd_cli.recipes.mineru_layout import LayoutBlock, draft_layout, layout_text, parse_layout
from hsd_cli.recipes.otsl import html_to_otsl
from hsd_cli.recipes.recipe import Decoding, TwoStep
from hsd_cli.records.blocks import BlockReading
from hsd_cli.records.kinds import Block, BlockKind
from hsd_cli.records.page import Page, Reading
from hsd_cli.stages.dialect import block_drafts, plain_text
from hsd_cli.stages.math_policy import near_lossless_rule

if TYPE_CHECKING:
    from hsd_cli.serving.reader import Reader

LAYOUT_LABEL = "layout"  # the label of the layout step's reading


@dataclass(frozen=True)
class BlockToRead:
    """A block of the page's layout, with what it is read with."""

    label: str
    grid: tuple[int, int, int, int]
    angle: int
    picture: Image.Image
    prompt: str
    drafts: tuple[str, ...]
    drafted_by: tuple[str, ...]
    decoding: Decoding | None = None  # its makers' decoding for its label (None: the recipe's)


def answer_drafts(block: Block, two_step: TwoStep, settings: ModelSettings) -> list[str]:
    """A draft block's text as the model answers its crop: tables in OTSL where it answers in
    OTSL, formulas as bare LaTeX, headings without their marks, the rest in the family's dialect."""
    if block.kind is BlockKind.TABLE and two_step.table_format == "otsl" and block.html:
        return [otsl] if (otsl := html_to_otsl(block.html)) else []
    if block.kind is BlockKind.FORMULA:
        return [bare_latex(block.text)]
    if block.kind in (BlockKind.TITLE, BlockKind.SECTION_HEADER):
        return [plain_text(block.text, settings.emphasis)]
    return block_drafts(block, settings)


def bare_latex(text: str) -> str:
    """A formula without its display or inline delimiters, as the model answers a formula's crop."""
    text = text.strip()
    for left, right in (("$$", "$$"), ("\\[", "\\]"), ("$", "$")):
        if text.startswith(left) and text.endswith(right) and len(text) >= len(left) + len(right):
            return text[len(left) : len(text) - len(right)].strip()
    return text


def inside(block: Block, grid: tuple[int, int, int, int], page_size_pt: tuple[float, float]) -> bool:
    """Whether the draft block's centre falls in the box (0-1000 grid)."""
    x0, y0, x1, y1 = block.bbox
    cx, cy = (x0 + x1) / 2 / page_size_pt[0] * 1000, (y0 + y1) / 2 / page_size_pt[1] * 1000
    return grid[0] <= cx <= grid[2] and grid[1] <= cy <= grid[3]


def found_layout(found: Sequence[FoundBlock], size: tuple[int, int]) -> list[LayoutBlock]:
    """A layout model's blocks (boxes in the pixels of a picture of `size`) on the 0-1000 grid,
    as glmocr's layout detector writes them; boxes empty on the grid left out."""
    grids = ((block.label, tuple(min(1000, max(0, v)) for v in grid_box(block.box, size))) for block in found)
    return [LayoutBlock(label, grid, 0) for label, grid in grids if grid[0] < grid[2] and grid[1] < grid[3]]


def blocks_to_read(page: Page, layout: Sequence[LayoutBlock], two_step: TwoStep, settings: ModelSettings) -> list[BlockToRead]:
    """The layout's blocks the maker reads, each with its picture, prompt and drafts."""
    picture = page.model_view
    chosen = []
    for found in layout:
        if not two_step.reads(found.label):
            continue
        crop = block_picture(two_step, picture, found.grid, found.angle or 0)
        if crop is None:
            continue
        drafting = [block for block in page.blocks if block.text and inside(block, found.grid, page.size_pt)]
        drafts = tuple(draft for block in drafting for draft in answer_drafts(block, two_step, settings) if draft)
        chosen.append(BlockToRead(found.label, found.grid, found.angle or 0, crop, two_step.prompt(found.label), drafts,
                                  tuple(block.id for block in drafting), two_step.decoding(found.label)))
    return chosen


def _request(model: Reader, picture: Image.Image, prompt: str, drafts: Sequence[str], decoding: Decoding | None) -> DecodeRequest:
    """A read of a crop (or the squashed page) by its `decoding`'s rules (None: the recipe's)."""
    return DecodeRequest(picture, prompt, model.proposer(drafts), allowance=model.allowance(drafts),
                         near_lossless=near_lossless_rule(model), rules=model.logits_rules(decoding) if decoding else None)


def layout_step(model: Reader, page: Page, two_step: TwoStep) -> DecodeResult:
    """MinerU's first step: the model writes the page's layout, drafted by hsd's draft layout."""
    squashed = page.model_view.convert("RGB").resize(two_step.layout.image_px, Image.Resampling.BICUBIC)
    draft = layout_text(page.blocks, page.size_pt, two_step)
    drafts = [draft] if draft else []
    [result] = model.decode_batch([_request(model, squashed, two_step.layout.prompt, drafts, two_step.layout.decoding)])
    return result


def summed(results: Sequence[DecodeResult]) -> DecodeStats:
    """The counts of a page's reads together: each row's forwards, tokens and drafts added (rows
    decoded together share their forwards, so this is the rows' work, not the batch's)."""
    total = DecodeStats()
    for stats in (result.stats for result in results):
        total.forwards += stats.forwards
        total.new_tokens += stats.new_tokens
        total.proposed += stats.proposed
        total.accepted += stats.accepted
        total.relaxed += stats.relaxed
        for accepted, steps in stats.accepted_hist.items():
            total.accepted_hist[accepted] = total.accepted_hist.get(accepted, 0) + steps
        total.prefill_s += stats.prefill_s
    return total


def read_blocks(model: Reader, to_read: Sequence[BlockToRead]) -> list[DecodeResult]:
    """Every block's crop in one batch of rows."""
    if not to_read:
        return []
    largest = max((block.picture for block in to_read), key=lambda picture: max(picture.size))
    requests = [_request(model, block.picture, block.prompt, block.drafts, block.decoding) for block in to_read]
    return model.decode_batch(requests, sizer=model.sizer(largest))


def blocks_stage(
    model: Reader, page: Page, settings: ModelSettings, layout_model: Callable[[Image.Image], list[FoundBlock]] | None = None,
) -> Reading:
    """The page read in two steps by its recipe (`model.recipe.two_step`): the layout (the model's
    own step, else `layout_model`'s blocks of the page's picture, else the draft's), then every
    block in one batch; the page's text is the blocks' by their makers' rules. The page's result
    holds every read's tokens (the layout step's first) and their counts together."""
    two_step = model.recipe.two_step
    layout_result = layout_step(model, page, two_step) if two_step.layout.finder == "vlm" else None
    if layout_result is not None:
        layout = parse_layout(layout_result.text)
    elif layout_model is not None:
        layout = found_layout(layout_model(page.model_view), page.model_view.size)
    else:
        layout = draft_layout(page.blocks, page.size_pt, two_step)  # standing in for the layout model
    to_read = blocks_to_read(page, layout, two_step, settings)
    results = read_blocks(model, to_read)
    readings = tuple(
        BlockReading(block.label, block.grid, result.text, block_text(two_step, block.label, result.text) if result.text.strip() else "",
                     result.stop_reason, result.stats, block.drafted_by, block.angle)
        for block, result in zip(to_read, results, strict=True)
    )
    layout_read = None if layout_result is None else BlockReading(
        LAYOUT_LABEL, (0, 0, 1000, 1000), layout_result.text, "", layout_result.stop_reason, layout_result.stats,
        tuple(block.id for block in page.blocks),
    )
    every = ([layout_result] if layout_result is not None else []) + results
    stop_reason = "budget" if any(result.stop_reason == "budget" for result in every) else "eos"
    text = page_markdown(two_step, [(reading.label, reading.raw) for reading in readings])
    page_result = DecodeResult([token for result in every for token in result.tokens], summed(every), stop_reason, text)
    return Reading(result=page_result, front_matter=None, text=text, dialect={}, layout=layout_read, blocks=readings)


def plain_reads(model: Reader, picture: Image.Image, read: Reading) -> list[int]:
    """The tokens plain decoding gives for the same reads as a two-step reading (`--baseline`):
    the layout step on the page squashed as it was, then each block's picture cut again from
    `picture` by its box and prompted for its label, in the reading's order."""
    two_step = model.recipe.two_step
    budget = model.decode_config.max_new_tokens
    tokens: list[int] = []
    if read.layout is not None:
        squashed = picture.convert("RGB").resize(two_step.layout.image_px, Image.Resampling.BICUBIC)
        tokens += model.generate_plainly(squashed, two_step.layout.prompt, budget)
    for block in read.blocks:
        crop = block_picture(two_step, picture, block.grid, block.angle)
        tokens += model.generate_plainly(crop, two_step.prompt(block.label), budget)
    return tokens
