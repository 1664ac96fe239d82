"""Right-to-left text layers (Arabic, Persian, Hebrew) in logical order.

PDFs place right-to-left glyphs in visual order, often word by word or letter by letter, and
PyMuPDF's layout text keeps that order: words come out reversed and a word split into pieces
comes out with its pieces swapped. A right-to-left block is rebuilt from its characters'
positions instead: lines by baseline, characters right to left, words split where the gap is a
space's width, left-to-right runs (Latin, digits) turned back.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import replace

import pymupdf

from hsd_cli.records.kinds import Block, BlockKind

# A block is right-to-left when most of its letters are.
RTL_SHARE = 0.5
# A gap between glyphs wider than this share of the font size separates words.
WORD_GAP = 0.25
# Tatweel stretches justified Arabic-script lines; it is no letter.
TATWEEL = "\u0640"
MIRRORED = str.maketrans("()[]{}<>", ")(][}{><")
_LTR_RUN = re.compile(r"[A-Za-z0-9@/.:_\-]+(?: [A-Za-z0-9@/.:_\-]+)*")
# Persian: letters Arabic lacks. A Persian text layer often writes Arabic yeh and kaf for the
# Persian ones (the same glyphs), and leaves out the zero-width non-joiner, which is no glyph.
PERSIAN_LETTERS = set("پچژگکی")
ZWNJ = "\u200c"
_PERSIAN_SUFFIX = re.compile(r"(\S) (ها|های|ای)(?=[\s.,،؛:!?)]|$)")
_PERSIAN_PREFIX = re.compile(r"(?<!\S)(نمی|می) (?=\S)")


def is_rtl(text: str) -> bool:
    letters = [ch for ch in text if ch.isalpha()]
    rtl = sum(unicodedata.bidirectional(ch) in ("R", "AL") for ch in letters)
    return bool(letters) and rtl > RTL_SHARE * len(letters)


def _line_text(chars: list[tuple[float, float, float, str]]) -> str:
    """One line's characters (x0, x1, size, char) in logical order."""
    text, previous = "", None
    for x0, x1, size, char in sorted(chars, key=lambda c: -(c[0] + c[1])):
        if char.isspace():
            text += " "
            continue
        if previous is not None and previous - x1 > WORD_GAP * size:
            text += " "
        text += char.translate(MIRRORED)
        previous = x0
    # Runs of left-to-right words read left to right.
    text = _LTR_RUN.sub(lambda run: " ".join(word[::-1] for word in reversed(run.group().split(" "))), text)
    return " ".join(text.split())


def rtl_block_text(page: pymupdf.Page, bbox: tuple[float, float, float, float]) -> str:
    """The text inside `bbox`, one line per baseline, in logical order."""
    chars = []  # (baseline middle, x0, x1, size, char)
    for block in page.get_text("rawdict", clip=pymupdf.Rect(bbox))["blocks"]:
        for line in block.get("lines", ()):
            if abs(line["dir"][1]) > 0.01:  # vertical margin text is no part of the block's lines
                continue
            for span in line["spans"]:
                for char in span["chars"]:
                    # NFKC: presentation forms (the shaped glyphs) to letters.
                    text = unicodedata.normalize("NFKC", char["c"]).replace(TATWEEL, "")
                    if text:
                        x0, y0, x1, y1 = char["bbox"]
                        chars.append(((y0 + y1) / 2, x0, x1, span["size"], text))
    lines: list[list[tuple[float, float, float, float, str]]] = []
    for char in sorted(chars):
        if lines and abs(char[0] - lines[-1][-1][0]) < 0.4 * char[3]:
            lines[-1].append(char)
        else:
            lines.append([char])
    texts = (_line_text([(x0, x1, size, ch) for _, x0, x1, size, ch in line]) for line in lines)
    return "\n".join(text for text in texts if text)


def persian_orthography(text: str) -> str:
    """Persian letters for their Arabic look-alikes, and the non-joiner before plural and
    relative suffixes (ها، های، ای) and after the verbal prefix می, where the text layer has a
    space or nothing; Arabic text (no Persian letters) is left alone."""
    if not PERSIAN_LETTERS & set(text):
        return text
    text = text.replace("ي", "ی").replace("ك", "ک")
    return _PERSIAN_PREFIX.sub(rf"\1{ZWNJ}", _PERSIAN_SUFFIX.sub(rf"\1{ZWNJ}\2", text))


def logical_order(page: pymupdf.Page, block: Block) -> Block:
    """`block` with its text in logical order when it is right-to-left, else unchanged (tables
    keep their cells: their HTML is what drafts them)."""
    if block.kind is BlockKind.TABLE or not is_rtl(block.text):
        return block
    text = persian_orthography(rtl_block_text(page, block.bbox))
    return replace(block, text=text) if text else block
