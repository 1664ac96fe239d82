"""What each maker does with a block's answer and how it joins a page's blocks into Markdown
(recipes.blocks has the data): tables from OTSL to HTML, formulas wrapped, titles marked, the
dropped labels left out. Plain functions of the model's text; the raw text stays in the page JSON.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hsd_cli.recipes.blocks import TwoStep
from hsd_cli.recipes.otsl import mineru_otsl_to_html, paddle_otsl_to_html


def mineru_equation_brackets(latex: str) -> str:
    """mineru_vl_utils.post_process._add_equation_brackets: a formula's answer inside `\\[ \\]`."""
    latex = latex.strip()
    if not latex.startswith("\\["):
        latex = f"\\[\n{latex}"
    if not latex.endswith("\\]"):
        latex = f"{latex}\n\\]"
    return latex


def mineru_display_math(bracketed: str) -> str:
    """mineru's Markdown of an equation block (vlm_magic_model strips the brackets again, and
    vlm_middle_json_mkcontent writes display math between `$$` lines)."""
    latex = bracketed[2:] if bracketed.startswith("\\[") else bracketed
    latex = latex[:-2] if latex.endswith("\\]") else latex
    return f"$$\n{latex.strip()}\n$$"


def mineru_block(label: str, raw: str) -> str:
    if label == "table":
        return mineru_otsl_to_html(raw) if raw else raw
    if label == "equation":
        return mineru_display_math(mineru_equation_brackets(raw)) if raw else raw
    if label == "title":
        return f"# {raw}"
    return raw


def paddle_math_delimiters(raw: str, label: str) -> str:
    """PaddleOCR-VL's answer with `\\( \\)` and `\\[ \\]` as `$` and `$$`
    (_paddleocr_vl_assemble_parsing_results), and no dollar at all in a formula number."""
    if not (("\\(" in raw and "\\)" in raw) or ("\\[" in raw and "\\]" in raw)):
        return raw
    raw = raw.replace("$", "")
    raw = (raw.replace("\\(", " $ ").replace("\\)", " $").replace("\\[\\[", "\\[").replace("\\]\\]", "\\]")
           .replace("\\[", " $$ ").replace("\\]", " $$ "))
    return raw.replace("$", "") if label == "formula_number" else raw


def paddle_block(label: str, raw: str) -> str:
    text = paddle_math_delimiters(raw, label)
    if label == "table":
        return paddle_otsl_to_html(text) or text
    if label == "doc_title":
        return f"# {text}"
    if label == "paragraph_title":
        return f"## {text}"
    return text


_TEXT_LABELS = ("abstract", "algorithm", "content", "doc_title", "figure_title", "paragraph_title", "reference_content",
                "text", "vertical_text", "vision_footnote", "seal", "formula_number")
_FORMULA_LABELS = ("display_formula", "inline_formula")
_INLINE_FORMULA = re.compile(r"(?<!\$)\$\s*((?:[^$\\]|\\.)+?)\s*\$(?!\$)")


def glm_inline_formulas(content: str) -> str:
    """glmocr's normalize_inline_formula: `$ x $` as `$x$`, a space between it and a letter beside it."""
    if "$" not in content:
        return content
    parts, last = [], 0
    for match in _INLINE_FORMULA.finditer(content):
        formula = match.group(1).strip()
        if not formula:
            continue
        before = content[last : match.start()]
        parts += [before + (" " if before and before[-1].isalnum() else ""), f"${formula}$"]
        if match.end() < len(content) and content[match.end()].isalnum():
            parts.append(" ")
        last = match.end()
    return "".join(parts) + content[last:]


def glm_clean(content: str) -> str:
    """glmocr's ResultFormatter._clean_content, less its repeated-content cut of answers of 2,048
    characters or more (clean_repeated_content)."""
    content = re.sub(r"^(\\t)+", "", content).lstrip()
    content = re.sub(r"(\\t)+$", "", content).rstrip()
    for unit in (r"(\.)", r"(·)", r"(_)", r"(\\_)"):
        content = re.sub(unit + r"\1{2,}", r"\1\1\1", content)
    return glm_inline_formulas(content).strip()


def glm_block(label: str, raw: str) -> str:
    """glmocr's ResultFormatter._format_content for a block of the layout model's `label`."""
    kind = "text" if label in _TEXT_LABELS else "formula" if label in _FORMULA_LABELS else label
    if kind == "table" and raw.startswith("<table") and raw.endswith("</table>"):
        content = raw.strip()
    elif kind == "formula" and raw.startswith("$$") and raw.endswith("$$"):
        content = raw.strip()
    else:
        content = glm_clean(raw)
    if label == "doc_title":
        content = "# " + re.sub(r"^#+\s*", "", content)
    elif label == "paragraph_title":
        content = content[2:].lstrip() if content.startswith(("- ", "* ")) else content
        content = "## " + re.sub(r"^#+\s*", "", content).lstrip()
    if kind == "formula":
        content = content[2:].strip() if content.startswith(("$$", "\\[", "\\(")) else content
        content = content[:-2].strip() if content.endswith(("$$", "\\]", "\\)")) else content
        content = "$$\n" + content + "\n$$"
    if kind == "text":
        content = _glm_text(content)
    return content


def _glm_text(content: str) -> str:
    if content.startswith("```") and not content.endswith("```"):
        content += "\n```"
    if content.startswith(("·", "•", "* ")):
        content = "- " + content[1:].lstrip()
    if match := re.match(r"^(\(|\（)(\d+|[A-Za-z])(\)|\）)(.*)$", content):
        _, symbol, _, rest = match.groups()
        content = f"({symbol}) {rest.lstrip()}"
    if match := re.match(r"^(\d+|[A-Za-z])(\.|\)|\）)(.*)$", content):
        symbol, sep, rest = match.groups()
        content = f"{symbol}{')' if sep == '）' else sep} {rest.lstrip()}"
    return re.sub(r"(?<!\n)\n(?!\n)", "\n\n", content)


BLOCK_TEXT = {"mineru": mineru_block, "paddleocr_vl": paddle_block, "glm_ocr": glm_block}


def block_text(two_step: TwoStep, label: str, raw: str) -> str:
    """A block's answer as its maker writes it into the page's Markdown."""
    return BLOCK_TEXT[two_step.crop](label, raw)


def page_markdown(two_step: TwoStep, blocks: Sequence[tuple[str, str]]) -> str:
    """The page's Markdown from its blocks' (label, answer) in reading order: dropped labels and
    empty answers left out, each block by its maker's rule, joined as the maker joins them."""
    texts = (block_text(two_step, label, raw) for label, raw in blocks if label not in two_step.dropped and raw.strip())
    return two_step.join.join(text for text in texts if text.strip())
