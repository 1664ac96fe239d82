"""Draft texts in the model's dialect: how a family's models write tables, emphasis, paragraphs,
inline math and headings (its settings say), so that drafts match the output token for token.

Where a family's dialect is uncertain, a block gets every alternative (a table as a pipe table
and as HTML, math in both delimiters, a heading with and without its # marks); the proposer's
trie verifies them all and follows whichever the model writes. Within a document, the forms the
model wrote on earlier pages settle the later pages' drafts (`settled`). A family whose outputs
open with front matter (olmOCR's YAML block) gets that drafted too, and split off its outputs.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import yaml

from hsd_cli.models.family_settings import ModelSettings
from hsd_cli.records.kinds import Block, BlockKind
from hsd_cli.stages.draft.rtl import PERSIAN_LETTERS
from hsd_cli.stages.draft.table_text import html_table_cells, pipe_table, pipe_table_cells
from hsd_cli.stages.grounding import draft_tag

# Running headers and footers are left out of page outputs, so they are no drafts at all.
NOT_DRAFT_KINDS = {BlockKind.PAGE_HEADER, BlockKind.PAGE_FOOTER}
# A figure's text (chart labels from the text layer, a page of notes the layout model took for a
# picture) can be in the page output, so it is a page draft; its crop is not worth a region pass.
NO_REGION_KINDS = NOT_DRAFT_KINDS | {BlockKind.FIGURE}
# Blocks whose lines are one paragraph's (or one heading's) wrapped lines.
PARAGRAPH_KINDS = {
    BlockKind.TITLE, BlockKind.SECTION_HEADER, BlockKind.TEXT, BlockKind.CAPTION, BlockKind.FOOTNOTE,
}
# Italic and bold as pymupdf4llm writes them: _x_, *x*, **x**, __x__ around non-space text.
_EMPHASIS = re.compile(r"(?<![\w*_])(\*\*|__|\*|_)(?=\S)(.+?)(?<=\S)\1(?![\w*_])")
_INLINE_TAGS = re.compile(r"</?(?:sup|sub|u|b|i|em|strong)>")
# A word broken at a line end ("improv-\ning") is one word in a model's output; a compound whose
# hyphen falls there ("Anglo-\nSaxon", "COVID-\n19") keeps its hyphen.
_LINE_END_HYPHEN = re.compile(r"(\w)-\n(?=[a-z])")
_LINE_END_COMPOUND = re.compile(r"(\w-)\n(?=[A-Z0-9])")
_LINE_BREAK = re.compile(r"[ \t]*\n[ \t]*(?=\S)")
# Inline math as the text-layer draft writes it (stages/draft/math.py).
_INLINE_MATH = re.compile(r"\\\((.+?)\\\)")
# The settings a page's drafts follow, as its JSON reports them; those a document's pages settle.
DIALECT_KEYS = ("table_format", "table_layout", "math_delimiters", "headings", "emphasis", "line_breaks", "front_matter")
SETTLED_KEYS = ("table_format", "table_layout", "math_delimiters", "headings")
# What a model's output shows of its dialect: (setting, value, evidence).
_EVIDENCE = (
    ("table_format", "html", re.compile(r"<table[\s>]")),
    ("table_format", "pipe", re.compile(r"^\|?\s*:?-{3,}:?\s*\|", re.MULTILINE)),
    ("table_layout", "compact", re.compile(r"<tr\b[^>]*><t[dh]\b")),
    ("table_layout", "indented", re.compile(r"<tr\b[^>]*>\n[ \t]*<t[dh]\b")),
    ("math_delimiters", "paren", re.compile(r"\\\(.+?\\\)")),
    # Math in dollars, not prices: a LaTeX command, sub- or superscript between the dollars.
    ("math_delimiters", "dollar", re.compile(r"(?<![\\$])\$(?!\s)[^$\n]*[\\_^][^$\n]*(?<!\s)\$")),
    ("headings", "markdown", re.compile(r"^#{1,6} \S", re.MULTILINE)),
)

# olmOCR's front matter, in the order and spelling olmocr/pipeline.py's guided decoding allows.
_OLMOCR_FRONT_MATTER = (
    "---\nprimary_language: {language}\nis_rotation_valid: True\nrotation_correction: 0\n"
    "is_table: {table}\nis_diagram: False\n---\n"
)
_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---(?:\n|\Z)", re.DOTALL)
# The keys olmOCR's front matter has: a leading block with any other key is the page's text
# (a form's `---\nName: John Smith\n---`), which other models of the family write as it is.
OLMOCR_FRONT_MATTER_KEYS = frozenset(
    ("primary_language", "is_rotation_valid", "rotation_correction", "is_table", "is_diagram")
)
# The language olmOCR names for a page in a script (ISO 639-1); Latin script is taken as English.
_SCRIPT_LANGUAGES = {
    "LATIN": "en", "CJK": "zh", "HANGUL": "ko", "ARABIC": "ar", "CYRILLIC": "ru", "GREEK": "el",
    "HEBREW": "he", "DEVANAGARI": "hi", "THAI": "th",
}


def html_table(rows: list[list[str]]) -> str:
    """A plain HTML table (first row as header cells), as OCR models write one."""
    def row_html(cells: list[str], tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}>{html.escape(cell, quote=False)}</{tag}>" for cell in cells) + "</tr>"

    return "<table>" + row_html(rows[0], "th") + "".join(row_html(row, "td") for row in rows[1:]) + "</table>"


# An `indented` HTML table: one row tag or cell a line, indented by so many spaces (rows, cells), as
# pretty-printers and the models trained on their output lay tables out (OmniDocBench's example
# predictions use all three).
HTML_TABLE_INDENTS = ((0, 2), (2, 4), (4, 8))
_ROW_TAG = re.compile(r"\s*(</?tr\b[^>]*>)")
_CELL_TAG = re.compile(r"\s*(<t[dh]\b)")
_TABLE_END = re.compile(r"\s*(</table>)")


def indented_html_table(table: str, rows: int, cells: int) -> str:
    """An HTML table with each row tag and cell on its own line, indented by `rows` and `cells` spaces."""
    table = _ROW_TAG.sub(lambda m: "\n" + " " * rows + m.group(1), table)
    table = _CELL_TAG.sub(lambda m: "\n" + " " * cells + m.group(1), table)
    return _TABLE_END.sub(lambda m: "\n" + m.group(1), table)


def table_forms(block: Block, table_format: str, table_layout: str) -> list[str]:
    """The table's text in the family's table dialect(s): `html`, `pipe` or `either` (both), HTML
    laid out `compact`, `indented` or `either` (every layout). Cells that span rows or columns
    keep their spans in HTML; a pipe table lists each row's cells."""
    rows = html_table_cells(block.html)[0] if block.html else pipe_table_cells(block.text)
    if not rows:
        return [block.text]
    forms = []
    if table_format in ("html", "either"):
        compact = block.html or html_table(rows)
        if table_layout in ("compact", "either"):
            forms.append(compact)
        if table_layout in ("indented", "either"):
            forms += [indented_html_table(compact, *indent) for indent in HTML_TABLE_INDENTS]
    if table_format in ("pipe", "either"):
        forms.append(pipe_table(rows))
    return forms


def paragraph_text(text: str, line_breaks: str) -> str:
    """`joined`: a paragraph on one line, words broken at line ends made whole again (models
    write paragraphs unwrapped); `kept`: the lines as the page wraps them."""
    if line_breaks == "kept":
        return text
    text = _LINE_END_COMPOUND.sub(r"\1", _LINE_END_HYPHEN.sub(r"\1", text))
    return _LINE_BREAK.sub(" ", text)


def plain_text(text: str, emphasis: str) -> str:
    """Inline HTML tags from the text layer dropped (their text kept); emphasis marks dropped too
    when the family's models do not write them (`emphasis = "strip"`). Math is left as it is:
    its underscores are subscripts."""
    parts = _INLINE_MATH.split(text)  # odd parts: the math between delimiters
    for index in range(0, len(parts), 2):
        part = _INLINE_TAGS.sub("", parts[index])
        if emphasis == "strip":
            previous = None
            while previous != part:  # nested marks (***x***) come off one pair at a time
                previous, part = part, _EMPHASIS.sub(r"\2", part)
        parts[index] = part
    return "".join(part if index % 2 == 0 else f"\\({part}\\)" for index, part in enumerate(parts))


def math_forms(text: str, delimiters: str) -> list[str]:
    """The text with its inline math in the family's delimiters: `paren` \\(x\\), `dollar` $x$,
    or `either` (both)."""
    if not _INLINE_MATH.search(text) or delimiters == "paren":
        return [text]
    dollar = _INLINE_MATH.sub(lambda match: f"${match.group(1)}$", text)
    return [dollar] if delimiters == "dollar" else [text, dollar]


def heading_forms(block: Block, text: str, headings: str) -> list[str]:
    """A title or section header as the family writes it: `markdown` with # marks by its level,
    `plain`, or `either` (both)."""
    marked = "#" * max(1, min(6, block.level)) + " " + text
    return {"markdown": [marked], "plain": [text], "either": [marked, text]}[headings]


def block_drafts(block: Block, settings: ModelSettings) -> list[str]:
    """One block's draft text(s) in the family's dialect."""
    if block.kind is BlockKind.TABLE:
        return table_forms(block, settings.table_format, settings.table_layout)
    text = plain_text(block.text, settings.emphasis)
    if block.kind in PARAGRAPH_KINDS:
        text = paragraph_text(text, settings.line_breaks)
    if block.kind in (BlockKind.TITLE, BlockKind.SECTION_HEADER):
        return heading_forms(block, text, settings.headings)
    return math_forms(text, settings.math_delimiters)


def draft_plan(blocks: tuple[Block, ...], wants_region: Callable[[Block], bool]) -> list[tuple[Block, bool]]:
    """The blocks whose text drafts the page, in reading order, each with whether it gets a region
    pass first."""
    return [
        (block, block.kind not in NO_REGION_KINDS and wants_region(block))
        for block in blocks
        if block.text and block.kind not in NOT_DRAFT_KINDS
    ]


def page_drafts(
    blocks: tuple[Block, ...], settings: ModelSettings, region_texts: Mapping[str, str] = MappingProxyType({}),
    page_size: tuple[float, float] | None = None,
) -> list[str]:
    """The page stage's drafts: the family's front matter, then per block in reading order its
    region output (`region_texts`, by block id) where a region pass gave one, else its pipeline
    text in the family's dialect (alternatives included); each after the block's grounding tag
    where the family tags its blocks (and `page_size`, the page's width and height in pt, places them)."""
    block_texts = [
        draft_tag(block, page_size, settings.grounding) + text
        for block, _ in draft_plan(blocks, lambda block: False)
        for text in ([region_texts[block.id]] if block.id in region_texts else block_drafts(block, settings))
    ]
    return front_matter_drafts(blocks, settings) + block_texts


def primary_language(text: str) -> str:
    """The ISO 639-1 code of the script most of the text's letters are in, "null" without letters
    (as olmOCR writes a blank page's): kana makes it Japanese, Persian letters Persian."""
    scripts = Counter(unicodedata.name(char, "").split(" ")[0] for char in text if char.isalpha())
    if not scripts:
        return "null"
    if scripts["HIRAGANA"] or scripts["KATAKANA"]:
        return "ja"
    script = scripts.most_common(1)[0][0]
    if script == "ARABIC" and PERSIAN_LETTERS & set(text):
        return "fa"
    return _SCRIPT_LANGUAGES.get(script, "en")


def front_matter_drafts(blocks: tuple[Block, ...], settings: ModelSettings) -> list[str]:
    """The front matter the family's outputs open with: olmOCR's YAML block with the page's
    language guessed from its text and `is_table` both ways (the likelier first: tables hold most
    of the page's text)."""
    if settings.front_matter == "none":
        return []
    text = "".join(block.text for block in blocks)
    tabular = 2 * sum(len(block.text) for block in blocks if block.kind is BlockKind.TABLE) > len(text)
    language = primary_language(text)
    return [_OLMOCR_FRONT_MATTER.format(language=language, table=table) for table in (tabular, not tabular)]


def split_front_matter(text: str) -> tuple[dict[str, Any] | None, str]:
    """An output's leading olmOCR front matter as plain JSON values and the text after it; (None,
    text) where it has none: no YAML mapping (as when decoding stopped inside it), or a key that
    is not one of olmOCR's."""
    match = _FRONT_MATTER.match(text)
    if not match:
        return None, text
    try:
        fields = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return None, text
    if not isinstance(fields, dict) or not fields or not set(map(str, fields)) <= OLMOCR_FRONT_MATTER_KEYS:
        return None, text
    plain = (str, int, float, bool, type(None))
    return {str(key): value if isinstance(value, plain) else str(value) for key, value in fields.items()}, text[match.end():].strip()


def settled(settings: ModelSettings, earlier_outputs: Sequence[str]) -> ModelSettings:
    """`settings` with each `either` the document's earlier page outputs decide: a model that
    wrote its tables as HTML (and never as pipes) on earlier pages gets HTML drafts only, and so
    on for math delimiters and heading marks. One form drafted instead of two is a smaller tree
    and no wrong branch to follow."""
    text = "\n\n".join(earlier_outputs)
    changes = {}
    for name in SETTLED_KEYS:
        if getattr(settings, name) != "either":
            continue
        seen = {value for key, value, evidence in _EVIDENCE if key == name and evidence.search(text)}
        if len(seen) == 1:
            changes[name] = seen.pop()
    return replace(settings, **changes) if changes else settings
