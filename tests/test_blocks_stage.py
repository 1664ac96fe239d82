"""The two-step way (stages/blocks.py) on tiny random models shaped as the makers' (MinerU2.5: a
Qwen2-VL; PaddleOCR-VL): the layout step and every block read exactly as plain decoding reads the
same picture with the same prompt, and the page's Markdown assembled by the makers' rules."""

import json
from dataclasses import replace

import pymupdf
import pytest
from PIL import Image

from hsd_cli.recipes.block_text import page_markdown
from hsd_cli.recipes.blocks import MINERU_2_5
from hsd_cli.recipes.mineru_layout import layout_text
from hsd_cli.records.kinds import Block, BlockKind
from hsd_cli.records.page import Page
from tests.conftest import run_hsd

BUDGET = 10
BLOCKS = (
    Block("t", BlockKind.TITLE, (50.0, 50.0, 545.0, 90.0), 0, "A title", None, "pdf-text"),
    Block("p", BlockKind.TEXT, (50.0, 100.0, 545.0, 300.0), 1, "Some words of a paragraph.", None, "pdf-text"),
    Block("x", BlockKind.TABLE, (50.0, 320.0, 545.0, 500.0), 2, "a b", None, "pdf-text",
          html="<table><tr><td>a</td><td>b</td></tr></table>"),
    Block("f", BlockKind.PAGE_FOOTER, (280.0, 800.0, 320.0, 820.0), 3, "3", None, "pdf-text"),
)


@pytest.fixture(scope="module")
def mineru(tmp_path_factory):
    """A tiny random Qwen2-VL read by MinerU2.5's recipe."""
    from hsd_cli.models.tiny_families import build_tiny_random
    from hsd_cli.serving.model import VlmModel
    from tests.fixtures import model_config

    path = build_tiny_random("qwen2_vl", tmp_path_factory.mktemp("tiny_qwen2_vl"))
    return VlmModel(model_config(path, recipe="mineru-2.5", dtype="float32", max_new_tokens=BUDGET, device="cpu"))


def _page() -> Page:
    with pymupdf.open() as doc:
        pdf_page = doc.new_page(width=595, height=842)
        pdf_page.insert_htmlbox(pymupdf.Rect(50, 50, 545, 500), "<h1>A title</h1><p>Some words of a paragraph.</p>")
        picture = pdf_page.get_pixmap(dpi=72).pil_image()
    return Page(page_no=1, size_pt=(595.0, 842.0), picture=picture, scale=1.0, blocks=BLOCKS, backend="pdf-text")


def _plain(model, picture: Image.Image, prompt: str) -> str:
    return model.decode_text(model.generate_plainly(picture, prompt, BUDGET))


@pytest.mark.slow
def test_the_layout_step_and_every_block_read_as_plain_decoding_reads_them(mineru):
    from hsd_cli.recipes.mineru_layout import draft_layout
    from hsd_cli.stages.blocks import blocks_stage, blocks_to_read, read_blocks

    page = _page()
    reading = blocks_stage(mineru, page, mineru.settings)
    squashed = page.picture.convert("RGB").resize((1036, 1036), Image.Resampling.BICUBIC)
    assert reading.layout.raw == _plain(mineru, squashed, "\nLayout Detection:")
    assert reading.layout.drafted_by == ("t", "p", "x", "f")
    assert reading.blocks == () or reading.text, "a random model's layout answer finds blocks, or none"
    # The blocks of the draft's layout (a layout model's stand-in), read in one batch.
    to_read = blocks_to_read(page, draft_layout(page.blocks, page.size_pt, MINERU_2_5), MINERU_2_5, mineru.settings)
    assert [(b.label, b.prompt) for b in to_read] == [
        ("title", "\nText Recognition:"), ("text", "\nText Recognition:"), ("table", "\nTable Recognition:"),
    ], "the footer is dropped by MinerU's Markdown: never read"
    assert to_read[2].drafts == ("<fcel>a<fcel>b<nl>",), "a table is drafted in OTSL"
    results = read_blocks(mineru, to_read)
    assert [r.text for r in results] == [_plain(mineru, b.picture, b.prompt) for b in to_read]


def test_a_block_drafted_by_the_models_own_reading_accepts_it_and_reads_the_same(mineru):
    from hsd_cli.recipes.mineru_layout import draft_layout
    from hsd_cli.stages.blocks import blocks_to_read, read_blocks

    page = _page()
    to_read = blocks_to_read(page, draft_layout(page.blocks, page.size_pt, MINERU_2_5), MINERU_2_5, mineru.settings)
    first = read_blocks(mineru, to_read)
    again = read_blocks(mineru, [replace(b, drafts=(r.text,)) for b, r in zip(to_read, first)])
    assert [r.tokens for r in again] == [r.tokens for r in first]
    assert sum(r.stats.accepted for r in again) > 0 and sum(r.stats.forwards for r in again) < sum(r.stats.forwards for r in first)


def test_the_draft_layout_drafts_the_layout_step():
    assert layout_text(BLOCKS, (595.0, 842.0)).split("\n")[1] == (
        "<|box_start|>84 118 915 356<|box_end|><|ref_start|>text<|ref_end|><|rotate_up|>")


@pytest.mark.slow
def test_convert_reads_a_paddleocr_vl_page_in_two_steps_as_plain_decoding_would(docs_dir, tmp_path):
    from hsd_cli.models.tiny_families import build_tiny_random
    from hsd_cli.recipes.blocks import PADDLEOCR_VL

    model = build_tiny_random("paddleocr_vl", tmp_path / "tiny")
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", model, "--recipe", "paddleocr-vl",
                     "--pages", "1", "--max-new-tokens", "6", "--device", "cpu", "--dtype", "float32", "--baseline")
    assert result.exit_code == 0, result.stderr
    page = json.loads((tmp_path / "out" / "report.json").read_text())["pages"][0]
    blocks = page["stats"]["two_step"]["blocks"]
    assert page["stats"]["model_input"]["recipe"] == "paddleocr-vl" and "layout" not in page["stats"]["two_step"]
    assert [b["label"] for b in blocks] == ["paragraph_title", "paragraph_title", "text", "text", "text", "text", "text"], (
        "the draft's section headers and text, in the layout model's labels")
    assert page["markdown"] == page_markdown(PADDLEOCR_VL, [(b["label"], b["raw"]) for b in blocks])
    assert page["stats"]["baseline"]["identical"], "every block read as plain decoding reads its crop"
    assert page["stats"]["page"]["new_tokens"] == sum(b["counts"]["new_tokens"] for b in blocks)


@pytest.mark.slow
def test_convert_reads_a_mineru_page_in_two_steps_as_plain_decoding_would(docs_dir, tmp_path):
    from hsd_cli.models.tiny_families import build_tiny_random

    model = build_tiny_random("qwen2_vl", tmp_path / "tiny")
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", model, "--recipe", "mineru-2.5",
                     "--pages", "1", "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32", "--baseline")
    assert result.exit_code == 0, result.stderr
    stats = json.loads((tmp_path / "out" / "report.json").read_text())["pages"][0]["stats"]
    assert stats["two_step"]["layout"]["drafted_by"], "the draft's layout drafted the layout step"
    assert stats["baseline"]["identical"] and stats["model_input"]["image_px"] == [1653, 2339], "200 dpi"


@pytest.fixture(scope="module")
def tiny_layout(tmp_path_factory):
    from hsd_cli.models.tiny_layout import build_tiny_layout

    return build_tiny_layout(tmp_path_factory.mktemp("tiny_pp_doclayout_v3"))


@pytest.mark.slow
def test_a_layout_model_from_a_directory_finds_blocks_in_reading_order(tiny_layout):
    from hsd_cli.models.layout import LayoutModel
    from hsd_cli.models.tiny_layout import PP_DOCLAYOUT_V3_LABELS

    found = LayoutModel(tiny_layout, threshold=0.0).blocks(_page().picture)
    assert len(found) == 12, "the best 12 of (query, class) at threshold 0, as transformers' post-processing"
    assert all(0 <= b.score <= 1 and b.label in PP_DOCLAYOUT_V3_LABELS for b in found)
    assert LayoutModel(tiny_layout, threshold=1.0).blocks(_page().picture) == []


@pytest.mark.slow
def test_paddleocr_vl_16_reads_the_blocks_its_layout_model_finds_as_plain_decoding_would(tiny_layout, tmp_path):
    from hsd_cli.models.layout import LayoutModel
    from hsd_cli.models.tiny_families import build_tiny_random
    from hsd_cli.serving.model import VlmModel
    from hsd_cli.stages.blocks import blocks_stage, plain_reads
    from tests.fixtures import model_config

    path = build_tiny_random("paddleocr_vl", tmp_path / "tiny")
    model = VlmModel(model_config(path, recipe="paddleocr-vl-1.6", dtype="float32", max_new_tokens=4, device="cpu"))
    layout = LayoutModel(tiny_layout, threshold=0.0)  # a random model's scores are its prior, 1/26
    page = _page()
    reading = blocks_stage(model, page, model.settings, layout.blocks)
    two_step = model.recipe.two_step
    read = [b for b in layout.blocks(page.picture) if two_step.reads(b.label)]
    assert reading.blocks and len(reading.blocks) <= len(read)
    assert all(b.label in {r.label for r in read} for b in reading.blocks)
    assert reading.result.tokens == plain_reads(model, page.picture, reading)
