"""Character alignment: which part of a page's published output belongs to a layout block, and
character accuracy (1 - normalised edit distance) of a decoded text against its target.

Edit-distance rows are computed with numpy, one row per query character, so a 6k x 6k
comparison takes a fraction of a second without an extra dependency.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

_TAG = re.compile(r"<[^>]*>")
MIN_BLOCK_CHARS = 3  # shorter blocks ("3", "a)") match anywhere: no reliable alignment
MIN_ALIGN_SCORE = 0.7


@dataclass(frozen=True)
class Span:
    start: int  # character offsets into the output text
    end: int
    score: float  # 1 - edit distance / block length, in the normalised character space


def _codes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def _last_row(query: np.ndarray, text: np.ndarray, free_start: bool) -> np.ndarray:
    """Last row of the edit-distance table of `query` against `text`: entry j is the cost of
    aligning all of `query` with text[s:j], s = 0 (global) or any s <= j (free_start)."""
    columns = np.arange(len(text) + 1, dtype=np.int64)
    row = np.zeros(len(text) + 1, dtype=np.int64) if free_start else columns.copy()
    for char in query:
        best = row + 1  # the query character is deleted
        np.minimum(best[1:], row[:-1] + (text != char), out=best[1:])  # (mis)match
        # Insertions of text characters: row[j] = min over k <= j of best[k] + (j - k).
        row = np.minimum.accumulate(best - columns) + columns
    return row


def edit_distance(a: str, b: str) -> int:
    return int(_last_row(_codes(a), _codes(b), free_start=False)[-1])


def char_accuracy(output: str, target: str) -> float:
    """1 - Levenshtein distance / the longer length; two empty texts agree fully."""
    longest = max(len(output), len(target))
    return 1.0 if longest == 0 else 1.0 - edit_distance(output, target) / longest


def normalised(text: str, skip_tags: bool = False) -> tuple[str, list[int]]:
    """Lowercased letters and digits only (any script), with each one's offset in `text`.
    Markup differs between a draft and a model's output; the characters that are read do not."""
    hidden = {i for m in _TAG.finditer(text) for i in range(m.start(), m.end())} if skip_tags else set()
    kept = [(c.lower(), i) for i, c in enumerate(text) if c.isalnum() and i not in hidden]
    return "".join(c for c, _ in kept), [i for _, i in kept]


def _bare(text: str) -> bool:
    """Only markup or punctuation (no readable character outside tags)."""
    return not normalised(text, skip_tags=True)[0]


def locate(block_text: str, output: str) -> Span | None:
    """The span of `output` that best matches `block_text` (a fitting alignment in the normalised
    character space), widened to whole lines when only markup lies beyond it; None when the block
    is too short or matches too poorly to belong to any part of the output."""
    query, _ = normalised(block_text, skip_tags=True)
    text, offsets = normalised(output, skip_tags=True)
    if len(query) < MIN_BLOCK_CHARS or not text:
        return None
    query_codes, text_codes = _codes(query), _codes(text)
    forward = _last_row(query_codes, text_codes, free_start=True)
    end = int(np.argmin(forward))
    cost = int(forward[end])
    score = 1.0 - cost / len(query)
    if score < MIN_ALIGN_SCORE:
        return None
    # The start: align the reversed query with the reversed text before `end`, anchored there.
    backward = _last_row(query_codes[::-1], text_codes[:end][::-1], free_start=False)
    start = end - int(np.argmin(backward))
    if start >= end:
        return None
    first, last = offsets[start], offsets[end - 1] + 1
    line_start = output.rfind("\n", 0, first) + 1
    line_end = output.find("\n", last)
    line_end = len(output) if line_end < 0 else line_end
    if _bare(output[line_start:first]):
        first = line_start
    if _bare(output[last:line_end]):
        last = line_end
    return Span(first, last, round(score, 4))
