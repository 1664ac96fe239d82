"""The makers' post-processing, as functions of the model's text: what their tools keep of an
answer, whether they accept it (or read the page again), and how they join pages. Each
function is `(raw, page_index) -> PageText`; `POSTPROCESSORS` names them for `Output.postprocess`.
The raw text is the decoded answer as the recipe decodes it (with special tokens where
`Decoding.skip_special_tokens` is False); the page JSON keeps it beside the result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from hsd_cli.recipes.recipe import Output


@dataclass(frozen=True)
class PageText:
    # The page's text as the makers keep it; None where they keep none (olmOCR's natural_text of
    # a page with no text, DeepSeek-OCR-2's page that ended without EOS).
    text: str | None
    # False: the makers do not accept the answer and read the page again ("unparsable").
    valid: bool = True
    # What the answer says besides its text (olmOCR's language, rotation, table and diagram).
    fields: dict[str, Any] = field(default_factory=dict)


# olmOCR's page record (olmocr.prompts.PageResponse, the same in 0.1.60 and 0.4.27) without its
# natural_text: each field's accepted types.
OLMOCR_PAGE_FIELDS: dict[str, tuple[type, ...]] = {
    "primary_language": (str, type(None)),
    "is_rotation_valid": (bool,),
    "rotation_correction": (int,),
    "is_table": (bool,),
    "is_diagram": (bool,),
}
OLMOCR_ROTATIONS = (0, 90, 180, 270)


def olmocr_front_matter_split(raw: str) -> tuple[dict[str, Any], str]:
    """olmOCR's split of an answer into its YAML front matter and text
    (olmocr.train.front_matter.FrontMatterParser._extract_front_matter_and_text): a block opened
    by "---\\n" at the very start and closed by the next "\\n---"; without one, no fields and the
    whole answer stripped."""
    if raw.startswith("---\n"):
        end = raw.find("\n---", 4)
        if end != -1:
            try:
                return yaml.safe_load(raw[4:end]) or {}, raw[end + 4:].strip()
            except yaml.YAMLError:
                pass
    return {}, raw.strip()


def olmocr_field(name: str, value: Any) -> Any:
    """One front-matter value as olmOCR's parser converts it (_parse_front_matter): a string
    where an int or a bool is due is converted; for the optional string a YAML bool (`no`) is
    None. Raises where olmOCR's page record refuses the value."""
    if name == "rotation_correction" and isinstance(value, str):
        value = int(value)
    elif name in ("is_rotation_valid", "is_table", "is_diagram") and isinstance(value, str):
        value = value.lower() == "true"
    elif name == "primary_language":
        value = None if isinstance(value, bool) or not value else value
    if not isinstance(value, OLMOCR_PAGE_FIELDS[name]):
        raise TypeError(f"{name} must be {OLMOCR_PAGE_FIELDS[name]}, got {value!r}")
    if name == "rotation_correction" and value not in OLMOCR_ROTATIONS:
        raise ValueError(f"rotation_correction must be one of {OLMOCR_ROTATIONS}")
    return value


def olmocr_page_fields(front_matter: Any) -> dict[str, Any]:
    """The page record's fields from a parsed front matter; raises where olmOCR would (a field
    missing or unknown, a value of the wrong kind)."""
    if not isinstance(front_matter, dict):
        raise ValueError("front matter is not a mapping")
    missing = [name for name in OLMOCR_PAGE_FIELDS if name not in front_matter]
    if missing:
        raise ValueError(f"missing front matter field(s) {missing}")
    extra = set(front_matter) - set(OLMOCR_PAGE_FIELDS)
    if extra:
        raise ValueError(f"unexpected front matter field(s) {sorted(map(str, extra))}")
    return {name: olmocr_field(name, front_matter[name]) for name in OLMOCR_PAGE_FIELDS}


def olmocr_yaml_page(raw: str, page_index: int = 0) -> PageText:
    """olmOCR-2's answer: YAML front matter, then the page's Markdown (olmocr.pipeline
    try_single_page). An answer whose front matter olmOCR refuses is not accepted: olmOCR reads
    the page again."""
    front_matter, text = olmocr_front_matter_split(raw)
    try:
        fields = olmocr_page_fields(front_matter)
    except (TypeError, ValueError):
        return PageText(text=None, valid=False)
    return PageText(text=text or None, fields=fields)


def olmocr_json_page(raw: str, page_index: int = 0) -> PageText:
    """olmOCR-0225's answer: a JSON object with the page record's fields and `natural_text`
    (olmocr 0.1.60 pipeline.process_page: json.loads, then PageResponse(**json)). An answer that
    does not load, or misses a field, is not accepted."""
    try:
        record = json.loads(raw)
        if not isinstance(record, dict) or set(record) != {*OLMOCR_PAGE_FIELDS, "natural_text"}:
            raise ValueError("not olmOCR's page record")
        fields = {name: record[name] for name in OLMOCR_PAGE_FIELDS}
        for name, value in fields.items():
            if not isinstance(value, OLMOCR_PAGE_FIELDS[name]):
                raise TypeError(name)
        if fields["rotation_correction"] not in OLMOCR_ROTATIONS:
            raise ValueError("rotation_correction")
        if not isinstance(record["natural_text"], (str, type(None))):
            raise TypeError("natural_text")
    except (TypeError, ValueError):
        return PageText(text=None, valid=False)
    return PageText(text=record["natural_text"], fields=fields)


def chandra_page(raw: str, page_index: int = 0) -> PageText:
    """Chandra 2's answer: HTML layout blocks, turned to Markdown as chandra.output.parse_markdown
    does (headers and footers dropped, math as $ and $$). Imported here: the converter needs the
    `chandra` extra, which no other recipe does."""
    from hsd_cli.recipes.chandra_html import chandra_markdown

    return PageText(text=chandra_markdown(raw, chandra_2=True))


def chandra1_page(raw: str, page_index: int = 0) -> PageText:
    """Chandra 1's answer, as chandra-ocr 0.1.8 converts it (no blank-page or stray-image rule)."""
    from hsd_cli.recipes.chandra_html import chandra_markdown

    return PageText(text=chandra_markdown(raw, chandra_2=False))


DEEPSEEK_EOS = "<｜end▁of▁sentence｜>"
DEEPSEEK_REF = re.compile(r"(<\|ref\|>(.*?)<\|/ref\|><\|det\|>(.*?)<\|/det\|>)", re.DOTALL)


def deepseek_page(raw: str, page_index: int = 0) -> PageText:
    """DeepSeek-OCR-2's answer as its PDF script keeps it (DeepSeek-OCR2-vllm/run_dpsk_ocr2_pdf.py):
    an answer without the EOS token ran into its budget or a repeat and the page is dropped
    (SKIP_REPEAT); otherwise each image block's ref/det tags become a link to the crop
    `images/{page_index}_{k}.jpg` (page_index counts the pages kept), the other blocks' tags go,
    with \\coloneqq and \\eqqcolon rewritten and runs of blank lines shortened. `fields` keeps
    the answer with its tags (the script's _det.mmd)."""
    if DEEPSEEK_EOS not in raw:
        return PageText(text=None)
    content = raw.replace(DEEPSEEK_EOS, "")
    tagged = content
    matches = [match[0] for match in DEEPSEEK_REF.findall(content)]
    images = [match for match in matches if "<|ref|>image<|/ref|>" in match]
    others = [match for match in matches if "<|ref|>image<|/ref|>" not in match]
    for k, match in enumerate(images):
        content = content.replace(match, f"![](images/{page_index}_{k}.jpg)\n")
    for match in others:
        content = (content.replace(match, "").replace("\\coloneqq", ":=").replace("\\eqqcolon", "=:")
                   .replace("\n\n\n\n", "\n\n").replace("\n\n\n", "\n\n"))
    return PageText(text=content, fields={"tagged": tagged})


def hunyuan_clean_repeats(text: str, min_length: int = 8000, min_repeats: int = 10) -> str:
    """HunyuanOCR's clean_repeated_substrings (Hunyuan-OCR-master/Hunyuan-OCR-hf/run_hy_ocr.py):
    in an answer of at least `min_length` characters, a tail unit (2 to n/10 characters, the
    shortest first) repeated `min_repeats` times or more back to back is kept once."""
    n = len(text)
    if n < min_length:
        return text
    for length in range(2, n // 10 + 1):
        candidate = text[-length:]
        count = 0
        i = n - length
        while i >= 0 and text[i:i + length] == candidate:
            count += 1
            i -= length
        if count >= min_repeats:
            return text[:n - length * (count - 1)]
    return text


def hunyuan_page(raw: str, page_index: int = 0) -> PageText:
    return PageText(text=hunyuan_clean_repeats(raw))


def plain_page(raw: str, page_index: int = 0) -> PageText:
    """The answer as it is: the makers keep the decoded text."""
    return PageText(text=raw)


POSTPROCESSORS: dict[str, Callable[[str, int], PageText]] = {
    "olmocr_yaml": olmocr_yaml_page,
    "olmocr_json": olmocr_json_page,
    "chandra_html": chandra_page,
    "chandra1_html": chandra1_page,
    "deepseek_refs": deepseek_page,
    "hunyuan_repeats": hunyuan_page,
    "plain": plain_page,
}


def join_pages(texts: Sequence[str | None], output: Output) -> str:
    """The document's text from its pages' texts as the makers join them (olmOCR's
    build_dolma_document): each page with text, then `page_join` unless it is the document's
    last page, then `page_end` (DeepSeek's page split mark); a page without text adds nothing."""
    last = len(texts) - 1
    return "".join(
        text + (output.page_join if index < last else "") + output.page_end
        for index, text in enumerate(texts) if text is not None
    )


def olmocr_yaml_answer(text: str) -> str:
    """A page's text as olmOCR-2 writes its answer: its front matter, then the text (for a replay
    model that stands for it, from published text without the front matter): an upright page,
    English where there is text, a table where the text holds an HTML or pipe table, no diagram."""
    table = "<table" in text or any(line.lstrip().startswith("|") for line in text.splitlines())
    language = "en" if text.strip() else "null"
    front_matter = (f"---\nprimary_language: {language}\nis_rotation_valid: True\nrotation_correction: 0\n"
                    f"is_table: {table}\nis_diagram: False\n---\n")
    return front_matter + text if text else front_matter.rstrip("\n")


# The model's answer for a page's kept text, by Output.postprocess, where the two differ.
MODEL_ANSWERS: dict[str, Callable[[str], str]] = {"olmocr_yaml": olmocr_yaml_answer}


def model_answer(output: Output, text: str) -> str:
    """The answer the recipe's model gives for a page whose kept text is `text`."""
    return MODEL_ANSWERS.get(output.postprocess, str)(text)
