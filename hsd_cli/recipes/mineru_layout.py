"""MinerU2.5's layout step as text: the model answers "\\nLayout Detection:" on the page squashed to
1,036 x 1,036 with one line per block, in reading order,
`<|box_start|>x1 y1 x2 y2<|box_end|><|ref_start|>type<|ref_end|><|rotate_up|>`, the box on a
0-1000 grid of the page. hsd's draft layout written so (`layout_text`) drafts that answer; the
answer read back (`parse_layout`) gives the blocks the second step reads, as
mineru_vl_utils 0.1.22's MinerUClientHelper.parse_layout_output reads them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hsd_cli.recipes.blocks import MINERU_2_5, TwoStep, grid_box
from hsd_cli.records.kinds import Block

# mineru_vl_utils.structs.BLOCK_TYPES: the types the parser keeps.
MINERU_TYPES = frozenset((
    "text", "title", "table", "image", "code", "header", "footer", "page_number", "page_footnote", "aside_text",
    "equation", "equation_block", "ref_text", "table_caption", "image_caption", "table_footnote", "image_footnote",
    "algorithm", "code_caption", "list", "phonetic", "unknown",
))
ROTATIONS = {"<|rotate_up|>": 0, "<|rotate_right|>": 90, "<|rotate_down|>": 180, "<|rotate_left|>": 270}
_LINE = re.compile(r"^<\|box_start\|>(\d+)\s+(\d+)\s+(\d+)\s+(\d+)<\|box_end\|><\|ref_start\|>(\w+?)<\|ref_end\|>(.*)$")


@dataclass(frozen=True)
class LayoutBlock:
    """A block of MinerU's layout answer: its type, its box on the 0-1000 grid, its rotation."""

    label: str
    grid: tuple[int, int, int, int]
    angle: int | None  # degrees; None where the line has no rotation tag

    @property
    def fractions(self) -> tuple[float, float, float, float]:
        """The box as fractions of the page, as mineru_vl_utils keeps it."""
        return tuple(value / 1000.0 for value in self.grid)  # type: ignore[return-value]


def layout_line(label: str, grid: tuple[int, int, int, int], angle: int = 0) -> str:
    rotation = next(tag for tag, degrees in ROTATIONS.items() if degrees == angle)
    x0, y0, x1, y1 = grid
    return f"<|box_start|>{x0} {y0} {x1} {y1}<|box_end|><|ref_start|>{label}<|ref_end|>{rotation}"


def draft_layout(blocks: Sequence[Block], page_size_pt: tuple[float, float], two_step: TwoStep = MINERU_2_5) -> list[LayoutBlock]:
    """hsd's draft layout (boxes in points, in reading order) as a maker's layout: each block's
    maker label and its box on the 0-1000 grid of the page, upright. Boxes that come out empty on
    the grid are left out, as MinerU's parser would drop them."""
    found = []
    for block in sorted(blocks, key=lambda block: block.order):
        grid = _clamped(grid_box(block.bbox, page_size_pt))
        if grid[0] < grid[2] and grid[1] < grid[3]:
            found.append(LayoutBlock(two_step.label(block.kind), grid, 0))
    return found


def layout_text(blocks: Sequence[Block], page_size_pt: tuple[float, float], two_step: TwoStep = MINERU_2_5) -> str:
    """hsd's draft layout written as MinerU's layout answer: what drafts its layout step."""
    return "\n".join(layout_line(found.label, found.grid) for found in draft_layout(blocks, page_size_pt, two_step))


def _clamped(grid: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    return tuple(min(1000, max(0, value)) for value in grid)  # type: ignore[return-value]


def parse_layout(answer: str) -> list[LayoutBlock]:
    """The blocks of a layout answer, line by line as parse_layout_output reads them: lines that
    do not match, boxes off the grid or empty, and unknown types left out; the corners put in order."""
    blocks = []
    for line in answer.split("\n"):
        match = _LINE.match(line)
        if not match:
            continue
        *coords, label, tail = match.groups()
        x0, y0, x1, y1 = (int(value) for value in coords)
        if any(value > 1000 for value in (x0, y0, x1, y1)):
            continue
        x0, x1 = sorted((x0, x1))
        y0, y1 = sorted((y0, y1))
        label = label.lower()
        if x0 == x1 or y0 == y1 or label not in MINERU_TYPES:
            continue
        angle = next((degrees for tag, degrees in ROTATIONS.items() if tag in tail), None)
        blocks.append(LayoutBlock(label, (x0, y0, x1, y1), angle))
    return blocks
