"""Training examples of a replay model: each page (rendered as `hsd convert` renders it for the
recipe the model is built on) with its published output (as that recipe's model answers), and each layout-block crop with the part of that output the block aligns to.

The examples are written once into the model directory (PNG images + examples.json), so a
resumed build and `replay-model eval` see exactly the same inputs without drafting again.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image

from hsd_cli.config import ConvertConfig
from hsd_cli.document.inputs import DOCUMENT_SUFFIXES, sniff_kind
from hsd_cli.recipes.postprocess import model_answer
from hsd_cli.recipes.recipe import Recipe
from hsd_cli.recipes.registry import is_family_default
from hsd_cli.replay.align import locate
from hsd_cli.replay.fingerprint import PageFingerprint, fingerprint
from hsd_cli.stages.draft import draft_page, make_draft_backend
from hsd_cli.stages.rasterize import crop_block, open_document, render_for_model, render_page
from hsd_cli.stages.dialect import draft_plan

# `<stem>_pg<N>_repeat<K>.md` (olmOCR-Bench candidates) or `<stem>.md` (page 1 of `<stem>`).
_REPEAT = re.compile(r"^(?P<name>.+?)(?:_repeat(?P<repeat>\d+))?$")
_PAGE = re.compile(r"^(?P<stem>.+)_pg(?P<page>\d+)$")
DATA_DIR = "replay_data"


class ReplayInputError(ValueError):
    """Inputs that cannot make a replay model (the CLI exits with code 2)."""


@dataclass(frozen=True)
class PagePair:
    document: Path
    page_no: int  # 1-based
    output: Path


@dataclass(frozen=True)
class Example:
    id: str
    kind: str  # "page" or "crop"
    image: str  # PNG path relative to the data directory
    target: str
    source: str  # document path relative to --inputs
    page_no: int
    block_kind: str | None = None
    align_score: float | None = None  # crops: how well the block's draft matched its span


def pair_pages(outputs_dir: Path, inputs_dir: Path) -> tuple[list[PagePair], list[str]]:
    """Each published output with the document page it was made from; returns (pairs, names of
    outputs without a document). Of several repeats of a page only the lowest is taken."""
    documents: dict[str, list[Path]] = {}
    for path in sorted(inputs_dir.rglob("*")):
        if path.is_file() and (path.suffix.lower() in DOCUMENT_SUFFIXES or sniff_kind(path)):
            documents.setdefault(path.stem, []).append(path)
    chosen: dict[tuple[Path, int], tuple[int, Path]] = {}
    unmatched: list[str] = []
    for output in sorted(outputs_dir.rglob("*.md")):
        named = _REPEAT.match(output.stem)
        stem, page_no, repeat = named["name"], 1, int(named["repeat"] or 1)
        paged = _PAGE.match(stem)
        if stem not in documents and paged:  # `scan_pg1.md` of `scan_pg1.jpg` is that file's page 1
            stem, page_no = paged["stem"], int(paged["page"])
        candidates = documents.get(stem, [])
        # Same sub-folder first (olmOCR-Bench mirrors pdfs/<category>/ in its outputs).
        relative_dir = output.parent.relative_to(outputs_dir)
        same_dir = [c for c in candidates if c.parent.relative_to(inputs_dir) == relative_dir]
        found = same_dir or candidates
        if len(found) != 1:
            unmatched.append(str(output.relative_to(outputs_dir)))
            continue
        key = (found[0], page_no)
        if key not in chosen or repeat < chosen[key][0]:
            chosen[key] = (repeat, output)
    pairs = [PagePair(document, page_no, output) for (document, page_no), (_, output) in sorted(chosen.items())]
    return pairs, unmatched


def region_target(block_text: str, output: str) -> tuple[str, float | None]:
    """The part of the page output that belongs to a block, or "" when none does (the replay
    model then answers nothing and hsd keeps the block's pipeline draft)."""
    span = locate(block_text, output)
    return ("", None) if span is None else (output[span.start : span.end].strip(), span.score)


def prepare(
    pairs: list[PagePair], inputs_dir: Path, data_dir: Path, region_padding_px: int, recipe: Recipe, log=lambda message: None
) -> tuple[list[Example], list[PageFingerprint]]:
    """Render, draft, crop and align every page; write the images and examples.json. A page's
    example is the page as the `recipe` renders it for the model, answered as the recipe's model
    answers (olmOCR-2: its front matter, then the published text); its crops are the region
    stage's, answered with the published text they align to."""
    defaults = ConvertConfig(output_dir=data_dir)  # the render and draft settings of `hsd convert`
    (data_dir / "images").mkdir(parents=True, exist_ok=True)
    examples: list[Example] = []
    prints: list[PageFingerprint] = []
    for index, pair in enumerate(pairs):
        source = str(pair.document.relative_to(inputs_dir))
        output = pair.output.read_text(encoding="utf-8").strip()
        doc, _ = open_document(pair.document, sniff_kind(pair.document), None)
        with doc:
            if pair.page_no > doc.page_count:
                raise ReplayInputError(f"{pair.output.name}: {source} has no page {pair.page_no}")
            page = doc[pair.page_no - 1]
            drafted = draft_page(
                make_draft_backend(defaults.document, pair.document.stem), page, render_page(page, defaults.dpi, defaults.max_pixels)
            )
            seen = drafted.picture if is_family_default(recipe) else render_for_model(page, recipe.render)
        page_id = f"p{index:03d}"
        seen.save(data_dir / "images" / f"{page_id}.png")
        answer = model_answer(recipe.output, output)
        examples.append(Example(page_id, "page", f"images/{page_id}.png", answer, source, pair.page_no))
        prints.append(fingerprint(drafted.picture, source, pair.page_no))
        crops = 0
        for block, region in draft_plan(drafted.blocks, lambda block: True):  # as --stages region-page
            if not region:
                continue
            crop = crop_block(drafted, block.bbox, region_padding_px)  # the region stage's own crop
            if crop is None:
                continue
            target, score = region_target(block.text, output)
            crop_id = f"{page_id}-{block.id}"
            crop.save(data_dir / "images" / f"{crop_id}.png")
            examples.append(
                Example(crop_id, "crop", f"images/{crop_id}.png", target, source, pair.page_no, block.kind.value, score)
            )
            crops += 1
        log(f"{source} page {pair.page_no}: {len(output)} chars, {crops} crops ({drafted.backend} draft)")
    (data_dir / "examples.json").write_text(json.dumps([asdict(e) for e in examples], indent=1, ensure_ascii=False))
    return examples, prints


def load_examples(data_dir: Path) -> list[Example]:
    return [Example(**row) for row in json.loads((data_dir / "examples.json").read_text(encoding="utf-8"))]


def load_image(data_dir: Path, example: Example) -> Image.Image:
    with Image.open(data_dir / example.image) as image:
        return image.convert("RGB")
