"""Inline math from a text layer, written as LaTeX.

A TeX-made (or KaTeX-made) text layer has no markup for math, but its spans show it: math fonts
(Computer Modern math italic and symbols, `*Math*` fonts), italic single-letter variables, Greek
letters and operators, and sub- and superscripts set smaller off the baseline. A block with a
span in a math font is rebuilt from its spans line by line, each math run written as
`\\( ... \\)` with LaTeX commands, scripts and the spacing models write
(`\\lambda_g = \\sum_{s \\in S}`); prose stays as the text layer has it. The dialect
(`stages/dialect.py`) turns the delimiters into the family's. Display formulas (limits stacked
over operators, fractions) are left as the layout text has them.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace

import pymupdf

from hsd_cli.records.kinds import Block, BlockKind
from hsd_cli.stages.draft.layout import repair_text_layer

# Font names (after a subset prefix "ABCDEF+") whose glyphs are math.
_MATH_FONT = re.compile(
    r"^(CM(MI|SY|EX|BSY|MIB)\d|MSAM|MSBM|Symbol|STIX|rsfs|eufm|EUSM|KaTeX_(Math|AMS|Size|Caligraphic|Script)|.*Math)",
    re.IGNORECASE,
)
_GREEK = dict(zip(
    "αβγδεζηθικλμνξπρστυφχψωϕϑϵΓΔΘΛΞΠΣΥΦΨΩ",
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi pi rho sigma tau upsilon "
    "phi chi psi omega phi vartheta epsilon Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega".split(),
    strict=True,
))
_SYMBOLS = {
    "∈": "in", "∉": "notin", "∑": "sum", "∏": "prod", "∫": "int", "≤": "leq", "≥": "geq", "≠": "neq",
    "×": "times", "·": "cdot", "⋅": "cdot", "→": "to", "←": "leftarrow", "⇒": "Rightarrow", "↦": "mapsto",
    "∞": "infty", "⊂": "subset", "⊆": "subseteq", "∪": "cup", "∩": "cap", "±": "pm", "∂": "partial",
    "∇": "nabla", "∀": "forall", "∃": "exists", "≡": "equiv", "≈": "approx", "∼": "sim", "√": "sqrt",
    "∅": "emptyset", "∘": "circ", "⊕": "oplus", "⊗": "otimes", "∧": "wedge", "∨": "vee", "¬": "neg",
    "ℓ": "ell", "∗": "ast", "∣": "mid", "⟨": "langle", "⟩": "rangle",
}
_LITERAL = {"−": "-", "′": "'", "{": "\\{", "}": "\\}", "\u200b": ""}
# Symbols that are math in any font of a block that typesets math; Greek letters only in a math
# font or in italics.
_MATH_CHARS = set("∈∉∑∏∫≤≥≠∞⊂⊆∪∩∂∇∀∃≡≈√∅⊕⊗")
_END_OF_PROOF = {"□", "∎", "■"}  # set in a math font, written as text
_RELATIONS = {"=", "<", ">", "\\in", "\\notin", "\\leq", "\\geq", "\\neq", "\\to", "\\subset", "\\subseteq",
              "\\equiv", "\\approx", "\\sim", "\\mid", "\\mapsto", "\\Rightarrow", "\\leftarrow"}
_BINARY = {"+", "-", "\\times", "\\cdot", "\\pm", "\\cup", "\\cap", "\\oplus", "\\otimes", "\\circ"}
# Text between math pieces that stays inside the run: digits, brackets, operators, separators.
_NEUTRAL = re.compile(r"^[\s0-9()\[\]=+\-−,./:;!'<>|]*$")
_TRAILING = re.compile(r"[\s.,;:]+$")
ITALIC, BOLD = 2, 16  # PyMuPDF span flags
# A span this much smaller than the line's text, off its baseline, is a sub- or superscript.
SCRIPT_SIZE = 0.85
SCRIPT_SHIFT = 0.1
WORD_GAP = 0.2
MATH_KINDS = {BlockKind.TEXT, BlockKind.CAPTION, BlockKind.FOOTNOTE}


@dataclass(frozen=True)
class _Piece:
    text: str  # without surrounding spaces
    x0: float
    x1: float
    baseline: float
    size: float
    font: str
    flags: int
    space_before: bool
    script: str = ""  # "_" or "^" for sub- and superscripts
    math: bool = False
    upright: bool = False  # a word set in roman inside math (`\\text{Ann}`)


def is_math_font(font: str) -> bool:
    return _MATH_FONT.match(font.split("+")[-1]) is not None


def _is_math(text: str, font: str, flags: int) -> bool:
    if text in _END_OF_PROOF:
        return False
    if is_math_font(font) or _MATH_CHARS & set(text):
        return True
    # An italic letter (with digits or primes) is a variable; an italic word is emphasis.
    return bool(flags & ITALIC) and (re.fullmatch(r"[A-Za-z][0-9′']*", text) is not None or text in _GREEK)


def _pieces(page: pymupdf.Page, bbox) -> list[_Piece]:
    """The spans inside `bbox`, word by word: a theorem's italic text has its variables in the
    same font ("for some u" is two italic words and a variable), and a span ") is the" closes a
    formula and goes on in prose."""
    pieces = []
    for block in page.get_text("dict", clip=pymupdf.Rect(bbox))["blocks"]:
        for line in block.get("lines", ()):
            if abs(line["dir"][1]) > 0.01:
                continue
            for span in line["spans"]:
                text = span["text"].replace("\u200b", "")
                if not text.strip():
                    continue
                x0, _, x1, _ = span["bbox"]
                words = [(m.group(), m.start()) for m in re.finditer(r"\S+", text)]
                width = (x1 - x0) / len(text)  # for word positions: glyphs about equal
                for word, start in words:
                    space_before = start > 0
                    pieces.append(_Piece(
                        word, x0 + start * width, x0 + (start + len(word)) * width, span["origin"][1], span["size"],
                        span["font"], span["flags"], space_before, math=_is_math(word, span["font"], span["flags"]),
                    ))
    return pieces


def _lines(pieces: list[_Piece]) -> list[list[_Piece]]:
    """Pieces grouped into visual lines by baseline (scripts join the line they sit on), each in
    x order, with sub- and superscripts marked."""
    if not pieces:
        return []
    sizes = Counter()  # the running text's size: the one most characters have
    for piece in pieces:
        sizes[round(piece.size, 1)] += len(piece.text)
    body = sizes.most_common(1)[0][0]
    lines: list[list[_Piece]] = []
    for piece in sorted(pieces, key=lambda p: (p.size < SCRIPT_SIZE * body, p.baseline)):
        small = piece.size < SCRIPT_SIZE * body
        near = [line for line in lines if abs(line[0].baseline - piece.baseline) < (0.7 if small else 0.3) * line[0].size]
        if near:
            line = min(near, key=lambda line: abs(line[0].baseline - piece.baseline))
            shift = piece.baseline - line[0].baseline
            if small and abs(shift) > SCRIPT_SHIFT * line[0].size:
                piece = replace(piece, script="_" if shift > 0 else "^")
            line.append(piece)
        else:
            lines.append([piece])
    return [sorted(line, key=lambda p: p.x0) for line in sorted(lines, key=lambda line: line[0].baseline)]


def _symbols(text: str) -> list[str]:
    """LaTeX tokens of a math piece's text (spaces dropped)."""
    tokens = []
    for char in text:
        if char.isspace():
            continue
        if char in _GREEK:
            tokens.append("\\" + _GREEK[char])
        elif char in _SYMBOLS:
            tokens.append("\\" + _SYMBOLS[char])
        else:
            tokens.append(_LITERAL.get(char, char))
    return [token for token in tokens if token]


def _join(tokens: list[str]) -> str:
    """Tokens with the spacing models write: around relations and binary operators, after commas,
    and after a command that a letter follows."""
    out = ""
    previous = ""
    for token in tokens:
        if token in _RELATIONS or (token in _BINARY and previous and previous not in _RELATIONS | {"(", "[", ","}):
            out = out.rstrip() + f" {token} "
        elif token == ",":
            out = out.rstrip() + ", "
        else:
            after_word = re.fullmatch(r"\\[A-Za-z]+|[_^][A-Za-z0-9]", previous)  # `\in R`, `^k c`
            if after_word and token[0].isalnum() and not out.endswith(" "):
                out += " "
            out += token
        previous = token
    return out.strip()


def _script(content: str) -> str:
    return content if re.fullmatch(r"[A-Za-z0-9]|\\[A-Za-z]+|'+", content) else "{" + content + "}"


def latex(run: list[_Piece]) -> str:
    """One math run as LaTeX (without delimiters)."""
    tokens: list[str] = []
    index = 0
    while index < len(run):
        if not run[index].script:
            piece = run[index]
            if piece.upright:
                slash, word = piece.text[:1] == "/", piece.text.lstrip("/")
                tokens.extend(["/"] * slash + [f"\\text{{{word}}}"])
            else:
                tokens.extend(_symbols(piece.text))
            index += 1
            continue
        # The scripts after one base: subscript first, then superscript (limits stacked over
        # and under a sum come interleaved by x).
        end = index
        while end < len(run) and run[end].script:
            end += 1
        for mark in ("_", "^"):
            content = _join([token for p in run[index:end] if p.script == mark for token in _symbols(p.text)])
            if content:
                tokens.append(mark + _script(content))
        index = end
    # A script token closes onto what it follows.
    return _join(tokens).replace(" _", "_").replace(" ^", "^")


def _emphasis(piece: _Piece) -> str:
    if len(piece.text) < 2:
        return ""
    return "**" if piece.flags & BOLD else "_" if piece.flags & ITALIC else ""


def _line_text(line: list[_Piece]) -> str:
    """One visual line: prose as the text layer has it (italic and bold words marked as the
    layout text marks them), math runs as `\\(...\\)`."""
    kinds = []
    for i, piece in enumerate(line):
        # A script after prose is a footnote mark, not math.
        math = piece.math or (piece.script and i > 0 and kinds[i - 1] != "prose")
        kinds.append("math" if math else "neutral" if _NEUTRAL.match(piece.text) else "prose")
    # A roman word glued to math on both sides is an operator name (R/Ann_R(x)); an italic word
    # with a script glued to it is a product of variables (Rx_i).
    line = list(line)
    for i in range(len(line) - 1):
        if kinds[i] != "prose" or _gap(line, i + 1):
            continue
        if line[i].flags & ITALIC and line[i].text.isalpha() and line[i + 1].script:
            line[i], kinds[i] = replace(line[i], math=True), "math"
        elif (
            i > 0 and re.fullmatch(r"/?[A-Za-z]+", line[i].text) and not line[i].flags & ITALIC
            and not _gap(line, i) and kinds[i - 1] != "prose" and kinds[i + 1] == "math"
        ):
            line[i], kinds[i] = replace(line[i], upright=True), "math"
    parts: list[str] = []
    i = 0
    while i < len(line):
        run_end = _run_end(kinds, i)
        if kinds[i] == "prose" or "math" not in kinds[i:run_end]:
            # Words of one emphasis go together: `_for some_`, not `_for_ _some_`.
            mark, end = _emphasis(line[i]), i + 1
            while mark and end < len(line) and kinds[end] != "math" and _emphasis(line[end]) == mark:
                end += 1
            words = "".join(_spaced(line, j, line[j].text) for j in range(i, end)).strip()
            parts.append(_spaced(line, i, f"{mark}{words}{mark}"))
            i = end
            continue
        end = _closing(line, i, max(j for j in range(i, run_end) if kinds[j] == "math") + 1)
        body, trailing = latex(line[i:end]), ""
        if match := _TRAILING.search(body):
            body, trailing = body[: match.start()], match.group().strip()
        parts.append(_spaced(line, i, f"\\({body}\\){trailing}"))
        i = end
    return "".join(parts).strip()


def _closing(line: list[_Piece], start: int, end: int) -> int:
    """Past the run's last math piece, the neutral pieces that close its open brackets."""
    depth = sum(p.text.count("(") + p.text.count("[") - p.text.count(")") - p.text.count("]") for p in line[start:end])
    while depth > 0 and end < len(line) and not line[end].math and re.match(r"[)\]]", line[end].text):
        depth -= line[end].text.count(")") + line[end].text.count("]")
        end += 1
    return end


def _run_end(kinds: list[str], start: int) -> int:
    end = start
    while end < len(kinds) and kinds[end] != "prose":
        end += 1
    return end


def _spaced(line: list[_Piece], index: int, text: str) -> str:
    """`text` with a space before it where the text layer has one or the glyphs leave a gap."""
    if index == 0:
        return text
    return (" " if _gap(line, index) else "") + text


def _gap(line: list[_Piece], index: int) -> bool:
    """Whether a space comes before piece `index`: the text layer has one, or the glyphs leave one."""
    piece, previous = line[index], line[index - 1]
    return piece.space_before or piece.x0 - previous.x1 > WORD_GAP * piece.size


def math_block_text(page: pymupdf.Page, bbox) -> str | None:
    """The block's text with inline math as LaTeX, or None when no span is set in a math font
    (italic letters and symbols alone are no evidence: lists, "≥ 65" in a table)."""
    pieces = _pieces(page, bbox)
    if not any(is_math_font(p.font) for p in pieces):
        return None
    text = "\n".join(text for text in (_line_text(line) for line in _lines(pieces)) if text)
    return repair_text_layer(text)


def with_math(page: pymupdf.Page, block: Block) -> Block:
    """`block` with its inline math written as LaTeX, when it is running text that has some."""
    if block.kind not in MATH_KINDS:
        return block
    text = math_block_text(page, block.bbox)
    return replace(block, text=text) if text else block
