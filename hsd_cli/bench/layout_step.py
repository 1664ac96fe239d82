"""`hsd bench layout-step`: how many of MinerU2.5's layout-step tokens hsd's draft layout carries.

MinerU2.5's first step answers one line of box and type tokens per block. No recorded answer of
the model is at hand, so a page's ground-truth layout (OmniDocBench's typed, ordered blocks)
written in MinerU's tokens stands for it; hsd's draft of the page, written the same way
(`recipes.mineru_layout.layout_text`), drafts it. The oracle target (`bench.oracle`) counts the
forwards lossless greedy decoding takes on that draft, in a real tokenizer's tokens (MinerU2.5's is
Qwen2's, with its box, type and rotation tokens added).
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


def ground_truth_layout(record: dict[str, Any]) -> str:
    """An OmniDocBench page's layout, in reading order, as MinerU's layout answer."""
    from hsd_cli.recipes.blocks import grid_box
    from hsd_cli.recipes.mineru_layout import layout_line

    size = (record["page_info"]["width"], record["page_info"]["height"])
    lines = []
    for block in sorted(record["layout_dets"], key=lambda block: block.get("order") or 0):
        label = OMNIDOCBENCH_TYPES.get(block["category_type"])
        if label is None or block.get("ignore"):
            continue
        xs, ys = block["poly"][0::2], block["poly"][1::2]
        grid = tuple(min(1000, max(0, value)) for value in grid_box((min(xs), min(ys), max(xs), max(ys)), size))
        if grid[0] < grid[2] and grid[1] < grid[3]:
            lines.append(layout_line(label, grid))
    return "\n".join(lines)


def layout_step(
    gt: Annotated[Path, typer.Option(help="OmniDocBench's ground truth (OmniDocBench_gt.json).")],
    images: Annotated[Path, typer.Option(help="The pages' images.")],
    tokenizer: Annotated[str, typer.Option(help="MinerU2.5's tokenizer (Qwen2's): a local directory or a hub id in the HF cache.")],
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Acceptance of MinerU2.5's layout step on hsd's draft layout: forwards and tau of lossless
    greedy decoding, the ground-truth layout standing for the model's answer (no model runs)."""
    from transformers import AutoTokenizer

    from hsd_cli.bench.oracle import OracleTarget, simulate, step_counts, totals
    from hsd_cli.config import ConvertConfig
    from hsd_cli.decoding import DecodeConfig
    from hsd_cli.document.inputs import sniff_kind
    from hsd_cli.recipes.mineru_layout import layout_text
    from hsd_cli.stages.draft import draft_page, make_draft_backend
    from hsd_cli.stages.rasterize import open_document

    loaded = AutoTokenizer.from_pretrained(tokenizer)
    loaded.add_special_tokens({"additional_special_tokens": MINERU_LAYOUT_TOKENS})
    stop = loaded.convert_tokens_to_ids("<|im_end|>")
    records = json.loads(gt.read_text(encoding="utf-8"))
    answers, drafts = {}, {}
    for record in records:
        path = images / record["page_info"]["image_path"]
        document, _ = open_document(path, sniff_kind(path), None)
        with document:
            draft = draft_page(make_draft_backend(ConvertConfig(output_dir=images).document, path.stem), document[0])
        answers[path.name] = loaded.encode(ground_truth_layout(record), add_special_tokens=False) + [stop]
        drafts[path.name] = layout_text(draft.blocks, draft.size_pt)
        print(f"{path.name}: {len(draft.blocks)} draft blocks, {len(answers[path.name])} answer tokens", file=sys.stderr)
    target = OracleTarget(loaded, answers, [stop])
    config = DecodeConfig(max_new_tokens=4096)
    rows = [{"page": name, **step_counts(simulate(target, name, [drafts[name]], "tokens", config))} for name in answers]
    report = {"layout_step": totals(rows), "pages": rows, "tokenizer": tokenizer, "gt": str(gt)}
    summary = report["layout_step"]
    print(f"layout step: {summary['pages']} pages, {summary['tokens']} tokens, {summary['forwards']} forwards, tau {summary['tau']}")
    if json_output:
        print(json.dumps(report, ensure_ascii=False))
