"""Grounding tags: the layout some models write into their text, a tag before each block naming
its kind and its boxes (DeepSeek-OCR's `<|ref|>title<|/ref|><|det|>[[330, 198, 559, 230]]<|/det|>`).
The page's Markdown is the text without them; its JSON keeps what they say (`Grounding`). A
dialect of tags is a pattern, the way a tag cut off at the end of an output starts, the scale of
its coordinates, and how a draft writes a block's tag (so that drafts match the output's tags
too); a family's settings name its dialect (`grounding`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hsd_cli.records.kinds import Block, BlockKind, GroundedBlock, Grounding


@dataclass(frozen=True)
class GroundingDialect:
    tag: re.Pattern[str]  # one whole tag, with the line break after it; groups `label` and `boxes`
    cut_off: re.Pattern[str]  # a tag that an output ends inside (decoding stopped there)
    scale: int  # coordinates run from 0 to this across the page, from its top-left corner
    draft_tag: str  # a block's tag in a draft, formatted with `label` and the box `x0`..`y1`
    labels: Mapping[BlockKind, str]  # the dialect's label of each kind of block (others: "text")


# DeepSeek-OCR (and -2): coordinates are normalised to 0-999 of the picture's width and height
# (its own code draws a box at x / 999 * width); a tag holds one box or several.
DEEPSEEK = GroundingDialect(
    tag=re.compile(r"<\|ref\|>(?P<label>.*?)<\|/ref\|><\|det\|>(?P<boxes>.*?)<\|/det\|>\n?", re.DOTALL),
    cut_off=re.compile(r"<\|ref\|>(?:(?!<\|/det\|>).)*\Z", re.DOTALL),
    scale=999,
    draft_tag="<|ref|>{label}<|/ref|><|det|>[[{x0}, {y0}, {x1}, {y1}]]<|/det|>\n",
    # The labels DeepSeek-OCR's published outputs use.
    labels={
        BlockKind.TITLE: "title", BlockKind.SECTION_HEADER: "sub_title", BlockKind.TABLE: "table",
        BlockKind.FORMULA: "equation", BlockKind.FIGURE: "image", BlockKind.CAPTION: "image_caption",
    },
)
GROUNDING_DIALECTS = {"deepseek": DEEPSEEK}

_BOX = re.compile(r"\[\s*([-\d.]+)\s*,\s*([-\d.]+)\s*,\s*([-\d.]+)\s*,\s*([-\d.]+)\s*\]")
# Where tags came out, the blocks' own blank lines run together (an image's tag has no text).
_BLANK_LINES = re.compile(r"\n(?:[ \t]*\n){2,}")


def _number(text: str) -> float:
    value = float(text)
    return int(value) if value.is_integer() else value


def split_grounding(text: str, dialect: str) -> tuple[Grounding | None, str]:
    """The layout the output's tags give (each tag's label and boxes, and the text after it up to
    the next tag) and the output without its tags; (None, text) for a family that writes none
    (`dialect` "none") or an output without tags."""
    if dialect == "none":
        return None, text
    grammar = GROUNDING_DIALECTS[dialect]
    text = grammar.cut_off.sub("", text)
    tags = list(grammar.tag.finditer(text))
    if not tags:
        return None, text
    ends = [tag.start() for tag in tags[1:]] + [len(text)]
    blocks = tuple(
        GroundedBlock(
            label=tag.group("label").strip(),
            boxes=tuple(tuple(_number(n) for n in box) for box in _BOX.findall(tag.group("boxes"))),
            text=text[tag.end() : end].strip(),
        )
        for tag, end in zip(tags, ends)
    )
    body = _BLANK_LINES.sub("\n\n", grammar.tag.sub("", text)).strip()
    return Grounding(grammar.scale, blocks), body


def draft_tag(block: Block, page_size: tuple[float, float] | None, dialect: str) -> str:
    """The tag a model of `dialect` writes before `block`, as a draft guesses it: the label of its
    kind and its box on the page (`page_size`: width and height in pt); "" where the family writes
    no tags or the page's size is not given."""
    if dialect == "none" or page_size is None:
        return ""
    grammar = GROUNDING_DIALECTS[dialect]
    width, height = page_size
    x0, y0, x1, y1 = (round(value / side * grammar.scale) for value, side in zip(block.bbox, (width, height, width, height)))
    return grammar.draft_tag.format(label=grammar.labels.get(block.kind, "text"), x0=x0, y0=y0, x1=x1, y1=y1)
