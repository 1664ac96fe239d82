"""OmniDocBench end-to-end metrics at page level: text edit distance, table TEDS, reading order.

A compact form of the official evaluation, which matches predicted and ground-truth blocks
first. Here the page's Markdown is compared with the page's ground truth as a whole:
* text: ground-truth text blocks in reading order against our Markdown without tables, images
  and display formulas; both lose Markdown markup, whitespace and punctuation (NFKC, lower
  case). Text of blocks the benchmark does not score (headers, footers, page numbers,
  captions, footnotes) is cut out of our text where it is found, as the official matching
  discards it. Normalised edit distance = Levenshtein / max(length), 0 is best.
* tables: each ground-truth table against the predicted table with the highest TEDS (one to
  one, greedy); a missing table scores 0. TEDS-S ignores cell text.
* reading order: each scored ground-truth block is located in our text (fuzzy); the order
  of the located blocks is compared with the ground-truth order by normalised edit distance.
Display formulas (CDM) are not scored.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import Any

from rapidfuzz import fuzz
from rapidfuzz.distance import Levenshtein

from hsd_cli.eval.errors import EvalInputError
from hsd_cli.eval.outputs import read_hsd_pages
from hsd_cli.eval.table_grids import Table, find_tables, html_table, remove_tables
from hsd_cli.eval.teds import teds

NOT_SCORED_AS_TEXT = frozenset(
    {
        "header",
        "footer",
        "page_number",
        "page_footnote",
        "figure_caption",
        "figure_footnote",
        "table_caption",
        "table_footnote",
        "equation_caption",
        "code_algorithm",
        "code_algorithm_caption",
    }
)
NO_TEXT = frozenset({"table", "figure", "equation_isolated", "abandon"})
BLOCK_FOUND = 80.0  # rapidfuzz partial_ratio a block needs to count as located in our text

_MARKUP = [
    re.compile(r"!\[[^\]]*\]\([^)]*\)"),  # images
    re.compile(r"\$\$.*?\$\$|\\\[.*?\\\]", re.DOTALL),  # display formulas
    re.compile(r"<[^>]+>"),  # HTML tags
    re.compile(r"^\s{0,3}(#{1,6}\s|>\s?|[-*+]\s|\d+[.)]\s)", re.MULTILINE),  # headings, quotes, lists
]


def normalise_text(text: str) -> str:
    """Letters and digits only (any script), NFKC, lower case."""
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).lower() if ch.isalnum())


def markdown_text(markdown: str) -> str:
    text = remove_tables(markdown)
    for pattern in _MARKUP:
        text = pattern.sub(" ", text)
    return normalise_text(text)


def _cut_found(text: str, needle: str) -> str:
    """`text` without the best fuzzy occurrence of `needle`, when it is there."""
    if not needle or not text:
        return text
    found = fuzz.partial_ratio_alignment(needle, text)
    if found is None or found.score < BLOCK_FOUND:
        return text
    return text[: found.dest_start] + text[found.dest_end :]


def _ordered(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(blocks, key=lambda block: (block.get("order") is None, block.get("order") or 0))


def score_text(page: dict[str, Any], markdown: str) -> dict[str, Any]:
    blocks = [b for b in page.get("layout_dets", []) if not b.get("ignore") and b.get("category_type") not in NO_TEXT]
    scored = [b for b in _ordered(blocks) if b.get("category_type") not in NOT_SCORED_AS_TEXT and b.get("text")]
    ours = markdown_text(markdown)
    for block in blocks:
        if block.get("category_type") in NOT_SCORED_AS_TEXT:
            ours = _cut_found(ours, normalise_text(block.get("text") or ""))
    truth_parts = [normalise_text(block["text"]) for block in scored]
    truth = "".join(truth_parts)
    longest = max(len(truth), len(ours))
    text_edit = Levenshtein.distance(truth, ours) / longest if longest else 0.0

    located = []
    for rank, part in enumerate(truth_parts):
        found = fuzz.partial_ratio_alignment(part, ours) if part and ours else None
        if found is not None and found.score >= BLOCK_FOUND:
            located.append((found.dest_start, rank))
    order_edit = None
    if len(located) >= 2:
        truth_order = [rank for _, rank in sorted(located, key=lambda item: item[1])]
        our_order = [rank for _, rank in sorted(located)]
        order_edit = Levenshtein.normalized_distance(truth_order, our_order)
    return {
        "text_edit": text_edit,
        "text_edit_distance": Levenshtein.distance(truth, ours),
        "text_length": longest,
        "reading_order_edit": order_edit,
        "blocks_scored": len(scored),
        "blocks_located": len(located),
    }


def match_tables(predicted: list[Table], truth: list[Table]) -> list[tuple[float, float]]:
    """(TEDS, TEDS-S) per ground-truth table, greedy one-to-one on the highest TEDS."""
    pairs = sorted(
        ((teds(p, t), i, j) for i, t in enumerate(truth) for j, p in enumerate(predicted)), reverse=True
    )
    chosen: dict[int, int] = {}
    for _, i, j in pairs:
        if i not in chosen and j not in chosen.values():
            chosen[i] = j
    scores = []
    for i, table in enumerate(truth):
        match = predicted[chosen[i]] if i in chosen else None
        scores.append((teds(match, table), teds(match, table, structure_only=True)))
    return scores


def load_ground_truth(path: Path) -> list[dict[str, Any]]:
    try:
        pages = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EvalInputError(f"cannot read --gt {path}: {exc}") from None
    if not isinstance(pages, list) or not all(isinstance(p, dict) and "page_info" in p for p in pages):
        raise EvalInputError(f"--gt {path}: expected a list of OmniDocBench page records")
    return pages


def output_files(outputs: Path) -> dict[str, Path]:
    """Output file per stem: hsd's `<stem>.json`, else a plain `<stem>.md` (another system's output)."""
    found: dict[str, Path] = {}
    for suffix in (".json", ".md"):
        for path in sorted(outputs.rglob(f"*{suffix}")):
            found.setdefault(path.stem, path)
    return found


def page_markdown(path: Path | None) -> dict[int, str] | None:
    if path is None:
        return None
    if path.suffix == ".json":
        return read_hsd_pages(path)
    return {1: path.read_text(encoding="utf-8", errors="replace")}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def score_pages(outputs: Path, gt_path: Path) -> dict[str, Any]:
    if not outputs.is_dir():
        raise EvalInputError(f"output directory not found: {outputs}")
    truth_pages = load_ground_truth(gt_path)
    files = output_files(outputs)
    pages, missing, all_tables = [], [], []
    for record in truth_pages:
        image = str(record["page_info"].get("image_path", ""))
        markdown_pages = page_markdown(files.get(Path(image).stem))
        if not markdown_pages:
            missing.append(image)
        markdown = "\n\n".join(text for _, text in sorted((markdown_pages or {}).items()))
        truth_tables = [
            html_table(block["html"])
            for block in _ordered(record.get("layout_dets", []))
            if block.get("category_type") == "table" and not block.get("ignore") and block.get("html")
        ]
        table_scores = match_tables(find_tables(markdown), truth_tables)
        all_tables.extend(table_scores)
        pages.append(
            {
                "image": image,
                **score_text(record, markdown),
                "tables": len(truth_tables),
                "table_teds": _mean([s for s, _ in table_scores]),
                "table_teds_struct": _mean([s for _, s in table_scores]),
                "missing_output": markdown_pages is None or not markdown_pages,
            }
        )
    total_distance = sum(page["text_edit_distance"] for page in pages)
    total_length = sum(page["text_length"] for page in pages)
    orders = [page["reading_order_edit"] for page in pages if page["reading_order_edit"] is not None]
    return {
        "benchmark": "omnidocbench",
        "outputs": str(outputs),
        "gt": str(gt_path),
        "overall": {
            "pages": len(pages),
            "text_edit": _mean([page["text_edit"] for page in pages]),
            "text_edit_total": total_distance / total_length if total_length else 0.0,
            "tables": len(all_tables),
            "table_teds": _mean([s for s, _ in all_tables]),
            "table_teds_struct": _mean([s for _, s in all_tables]),
            "reading_order_edit": _mean(orders),
        },
        "pages": pages,
        "missing_outputs": missing,
    }
