"""`hsd bench two-step`: how much of MinerU2.5's two steps hsd's draft carries: the layout step's
tokens, and each block's.

No recorded answer of the model is at hand, so a page's ground truth (OmniDocBench's typed,
ordered blocks with their text, LaTeX and HTML) stands for it: its layout written in MinerU's
box and type tokens, each block it reads in its dialect (tables in OTSL, formulas bare). hsd's
draft of the page drafts them as `hsd convert` would (`recipes.mineru_layout.layout_text`; the
draft's blocks inside each box, `stages.blocks.answer_drafts`). The oracle target
(`bench.oracle`) counts the forwards lossless greedy decoding takes on those drafts, in a real
tokenizer's tokens (MinerU2.5's is Qwen2's, with its box, type and rotation tokens added).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

# OmniDocBench's block categories as MinerU's layout types (None: not a block MinerU writes).
OMNIDOCBENCH_TYPES = {
    "title": "title", "text_block": "text", "figure": "image", "figure_caption": "image_caption",
    "figure_footnote": "image_footnote", "table": "table", "table_caption": "table_caption",
    "table_footnote": "table_footnote", "equation_isolated": "equation", "header": "header", "footer": "footer",
    "page_number": "page_number", "page_footnote": "page_footnote", "code_txt": "code", "reference": "ref_text",
    "abandon": "aside_text",
}
# The special tokens of MinerU's layout answer that Qwen2's vocabulary lacks (it has the box ones).
MINERU_LAYOUT_TOKENS = ["<|ref_start|>", "<|ref_end|>", "<|rotate_up|>", "<|rotate_right|>", "<|rotate_down|>", "<|rotate_left|>"]


def laid_out(record: dict[str, Any]) -> list[tuple[dict[str, Any], str, tuple[int, int, int, int]]]:
    """An OmniDocBench page's blocks MinerU writes, in reading order, each with its MinerU label and
    its box on the 0-1000 grid (blocks empty on the grid left out, as MinerU's parser drops them)."""
    from hsd_cli.recipes.blocks import grid_box

    size = (record["page_info"]["width"], record["page_info"]["height"])
    kept = []
    for block in sorted(record["layout_dets"], key=lambda block: block.get("order") or 0):
        label = OMNIDOCBENCH_TYPES.get(block["category_type"])
        if label is None or block.get("ignore"):
            continue
        xs, ys = block["poly"][0::2], block["poly"][1::2]
        grid = tuple(min(1000, max(0, value)) for value in grid_box((min(xs), min(ys), max(xs), max(ys)), size))
        if grid[0] < grid[2] and grid[1] < grid[3]:
            kept.append((block, label, grid))
    return kept


def ground_truth_layout(record: dict[str, Any]) -> str:
    """An OmniDocBench page's layout as MinerU's layout answer."""
    from hsd_cli.recipes.mineru_layout import layout_line

    return "\n".join(layout_line(label, grid) for _, label, grid in laid_out(record))


def ground_truth_blocks(record: dict[str, Any]) -> list[tuple[str, tuple[int, int, int, int], str]]:
    """The blocks MinerU2.5 reads of an OmniDocBench page, in reading order: (label, box on the
    0-1000 grid, the ground truth in MinerU's dialect: tables in OTSL, formulas bare)."""
    from hsd_cli.recipes.blocks import MINERU_2_5
    from hsd_cli.recipes.otsl import html_to_otsl
    from hsd_cli.stages.blocks import bare_latex

    answers = []
    for block, label, grid in laid_out(record):
        if not MINERU_2_5.reads(label):
            continue
        answer = (html_to_otsl(block.get("html", "")) if label == "table"
                  else bare_latex(block.get("latex", "")) if label == "equation" else block.get("text", ""))
        if answer.strip():
            answers.append((label, grid, answer))
    return answers


def two_step(
    gt: Annotated[Path, typer.Option(help="OmniDocBench's ground truth (OmniDocBench_gt.json).")],
    images: Annotated[Path, typer.Option(help="The pages' images.")],
    tokenizer: Annotated[str, typer.Option(help="MinerU2.5's tokenizer (Qwen2's): a local directory or a hub id in the HF cache.")],
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Acceptance of MinerU2.5's two steps on hsd's draft: forwards and tau of lossless greedy
    decoding of the layout step and of each block, the ground truth standing for the model's
    answers (no model runs)."""
    from transformers import AutoTokenizer

    from hsd_cli.bench.oracle import OracleTarget, simulate, step_counts, totals
    from hsd_cli.config import ConvertConfig
    from hsd_cli.decoding import DecodeConfig
    from hsd_cli.document.inputs import sniff_kind
    from hsd_cli.models.family_settings import settings_for
    from hsd_cli.recipes.blocks import MINERU_2_5
    from hsd_cli.recipes.mineru_layout import layout_text
    from hsd_cli.stages.blocks import answer_drafts, inside
    from hsd_cli.stages.draft import draft_page, make_draft_backend
    from hsd_cli.stages.rasterize import open_document

    loaded = AutoTokenizer.from_pretrained(tokenizer)
    loaded.add_special_tokens({"additional_special_tokens": MINERU_LAYOUT_TOKENS})
    stop = loaded.convert_tokens_to_ids("<|im_end|>")
    settings = settings_for("qwen2_vl")
    answers: dict[str, list[int]] = {}
    drafts: dict[str, list[str]] = {}
    labels: dict[str, str] = {}
    for record in json.loads(gt.read_text(encoding="utf-8")):
        path = images / record["page_info"]["image_path"]
        document, _ = open_document(path, sniff_kind(path), None)
        with document:
            draft = draft_page(make_draft_backend(ConvertConfig(output_dir=images).document, path.stem), document[0])
        answers[path.name] = loaded.encode(ground_truth_layout(record), add_special_tokens=False) + [stop]
        drafts[path.name] = [layout_text(draft.blocks, draft.size_pt)]
        for i, (label, grid, answer) in enumerate(ground_truth_blocks(record)):
            key = f"{path.name}#{i}"
            answers[key] = loaded.encode(answer, add_special_tokens=False) + [stop]
            drafted = [block for block in draft.blocks if block.text and inside(block, grid, draft.size_pt)]
            drafts[key] = [text for block in drafted for text in answer_drafts(block, MINERU_2_5, settings) if text]
            labels[key] = label
        print(f"{path.name}: {len(draft.blocks)} draft blocks", file=sys.stderr)
    target = OracleTarget(loaded, answers, [stop])
    config = DecodeConfig(max_new_tokens=4096)
    rows = {key: step_counts(simulate(target, key, drafts[key], settings.draft_match, config)) for key in answers}
    pages = [{"page": key, **counts} for key, counts in rows.items() if key not in labels]
    blocks = [{"block": key, "label": labels[key], **counts} for key, counts in rows.items() if key in labels]
    report = {
        "layout_step": totals(pages), "blocks": totals(blocks),
        "by_label": {label: totals([b for b in blocks if b["label"] == label]) for label in sorted(set(labels.values()))},
        "pages": pages, "per_block": blocks, "tokenizer": tokenizer, "gt": str(gt),
    }
    for name in ("layout_step", "blocks"):
        summary = report[name]
        print(f"{name}: {summary['pages']} reads, {summary['tokens']} tokens, {summary['forwards']} forwards, tau {summary['tau']}")
    for label, summary in report["by_label"].items():
        print(f"  {label}: {summary['pages']} blocks, {summary['tokens']} tokens, tau {summary['tau']}")
    if json_output:
        print(json.dumps(report, ensure_ascii=False))
