"""Where `--near-lossless` may take a close draft token for the model's own: never in math.

The decoding core asks a policy (decoding.NearLossless.may_relax) and knows nothing of text; this
is the pipeline's policy, over the text the model's tokens decode to (TeX math in Markdown, as
the OCR models write it). A formula's every token is the model's: a close token there is a
different formula, where in prose it is most often a different spelling of the same words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hsd_cli.decoding import NearLossless
    from hsd_cli.serving.reader import Reader

# What opens, closes or escapes math in TeX-in-Markdown, scanned in C: the Python loop then runs
# over the delimiters alone, not over every character of a page (asked at many steps of a page).
# A TeX line break `\\` is taken first, so that `\\(` opens nothing.
_DELIMITER = re.compile(
    r"\\\\|\\\$|\$\$|\$|\\[()\[\]]"
    r"|\\(begin|end)\{(?:equation|align|alignat|gather|multline|eqnarray|displaymath|math)\*?\}"
)
# A token that writes either opens, closes or escapes something TeX reads: never taken on closeness.
_TEX_MARKS = ("$", "\\")


def inside_tex_math(text: str) -> bool:
    """Does `text` end inside $...$, $$...$$, \\(...\\), \\[...\\] or a math environment
    (equation, align, ...)? An escaped \\$ is a dollar sign."""
    inline = display = paren = bracket = False
    depth = 0
    for match in _DELIMITER.finditer(text):
        mark = match.group()
        if mark == "$$":
            display = not display
        elif mark == "$" and not display:
            inline = not inline
        elif mark in ("\\(", "\\)"):
            paren = mark == "\\("
        elif mark in ("\\[", "\\]"):
            bracket = mark == "\\["
        elif match.group(1) is not None:
            depth = depth + 1 if match.group(1) == "begin" else max(0, depth - 1)
    return inline or display or paren or bracket or depth > 0


@dataclass(frozen=True)
class OutsideMath:
    """A near-lossless policy over token ids: a draft token may stand for the model's pick only
    where the output so far is outside math, neither token writes a `$` or a backslash, and
    neither would put the output inside math (a `(` after a lone backslash opens \\( ... \\))."""

    decode: Callable[[Sequence[int]], str]  # the model's tokenizer, token ids to text

    def __call__(self, output: Sequence[int], draft: int, pick: int) -> bool:
        pieces = (self.decode([draft]), self.decode([pick]))
        if any(mark in piece for piece in pieces for mark in _TEX_MARKS):
            return False
        text = self.decode(output)
        return not inside_tex_math(text) and not any(inside_tex_math(text + piece) for piece in pieces)


def near_lossless_rule(model: Reader) -> NearLossless | None:
    """The rule the model's stages decode with under `--near-lossless TAU`; None without it
    (lossless)."""
    if model.near_lossless is None:
        return None
    from hsd_cli.decoding import NearLossless  # imports torch: only where a model runs

    return NearLossless(model.near_lossless, OutsideMath(model.decode_text))
