"""A model read as its makers read it, through `hsd convert --recipe` (or the recipe of a known
model id): their pixels, their chat layout and prompt, their budget and decoding, recorded in
each page's JSON; the family's default where no makers' recipe applies."""

import json

import pymupdf
import pytest

from hsd_cli.decoding.hf_target.families import ChatLayout
from hsd_cli.recipes.registry import recipes
from hsd_cli.recipes.sizes import render_size
from tests.conftest import run_hsd

OLMOCR = recipes()["olmocr-2"]


def _convert(docs_dir, out, tiny_model, *options):
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", out, "--model", tiny_model, "--pages", "1",
                     "--stages", "page", "--max-new-tokens", "12", "--device", "cpu", "--dtype", "float32", *options)
    assert result.exit_code == 0, result.stderr
    return json.loads((out / "report.json").read_text())


def test_a_recipe_reads_the_makers_pixels_and_records_what_the_model_read(docs_dir, tiny_model, tmp_path):
    document = _convert(docs_dir, tmp_path / "olmocr", tiny_model, "--recipe", "olmocr-2", "--greedy")
    read = document["pages"][0]["stats"]["model_input"]
    with pymupdf.open(docs_dir / "report.pdf") as pdf:
        size_pt = (pdf[0].rect.width, pdf[0].rect.height)
    assert read["recipe"] == "olmocr-2"
    assert tuple(read["image_px"]) == render_size(OLMOCR.render, size_pt) and max(read["image_px"]) == 1288
    assert document["config"]["recipe"] == "olmocr-2" and document["config"]["greedy"] is True

    default = _convert(docs_dir, tmp_path / "default", tiny_model)
    own = default["pages"][0]["stats"]["model_input"]
    assert own["recipe"] == "hsd-qwen2_5_vl"
    assert tuple(own["image_px"]) == render_size(recipes()["hsd-qwen2_5_vl"].render, size_pt), "150 dpi, as the draft"
    assert "recipe" not in default["config"], "a family's default is hsd's way before recipes: its config is unchanged"
    assert own["prompt_tokens"] > 0 and read["prompt_tokens"] > 0  # the tiny processor's pixel cap makes them alike


def test_sampling_at_the_makers_temperature_is_plain_sampling_with_the_same_seed(docs_dir, tiny_model, tmp_path):
    """olmOCR samples at temperature 0.1: with --baseline, hsd's reading equals transformers'
    `generate` sampling with the same keyed seed, token for token."""
    document = _convert(docs_dir, tmp_path / "sampled", tiny_model, "--recipe", "olmocr-2", "--seed", "3", "--baseline")
    baseline = document["pages"][0]["stats"]["baseline"]
    assert baseline["identical"] is True, baseline
    assert document["config"]["seed"] == 3


def test_the_chat_layout_puts_the_text_first_and_a_system_turn_as_the_makers_do(tiny_model):
    from hsd_cli.decoding.hf_target import load_target

    target = load_target(str(tiny_model), device="cpu", dtype="float32", layout=ChatLayout(image_first=False, system=""))
    text = target.adapter.chat_text(target.processor, "Read it.", True, target.layout)
    assert text.index("Read it.") < text.index("<|vision_start|>"), "olmOCR sends its text before the image"
    assert text.startswith("<|im_start|>system\n<|im_end|>"), "an empty system turn, as HunyuanOCR sends"
    image_first = target.adapter.chat_text(target.processor, "Read it.", True)
    assert image_first.index("<|vision_start|>") < image_first.index("Read it.")


@pytest.mark.parametrize(("options", "complaint"), [
    (("--recipe", "no-such-recipe"), "no recipe 'no-such-recipe'"),
    (("--recipe", "deepseek-ocr-2"), "is for deepseek_ocr2 models"),
    (("--recipe", "olmocr-2", "--near-lossless", "0.5"), "add --greedy"),
])
def test_a_recipe_that_cannot_be_read_is_a_one_line_usage_error(docs_dir, tiny_model, tmp_path, options, complaint):
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", tiny_model, *options)
    assert result.exit_code == 2 and complaint in result.stderr, result.stderr


def test_the_makers_text_rules_hsd_does_not_apply_elsewhere_give_the_pages_text():
    from hsd_cli.records.page import Reading
    from hsd_cli.stages.makers_text import makers_text

    looped = "Intro. " + "ab" * 5000
    hunyuan = makers_text(Reading(result=None, front_matter=None, text=looped, dialect={}), recipes()["hunyuan-ocr"])
    assert hunyuan.text == "Intro. ab" and hunyuan.model_text == looped, "HunyuanOCR cuts a long repeated tail"
    olmocr = Reading(result=None, front_matter=None, text="---\nnot read twice", dialect={})
    assert makers_text(olmocr, OLMOCR) is olmocr, "olmOCR's front matter is the stages' to read"


def test_pages_are_joined_as_the_makers_join_them():
    from hsd_cli.output.markdown import document_markdown
    from hsd_cli.records.page import DocumentResult, Page

    pages = tuple(Page(page_no=n, size_pt=(1, 1), text=f"page {n}") for n in (1, 2))
    result = DocumentResult(pages=pages, page_count=2, metadata={}, warnings=(), damaged=False, tracebacks=())
    assert document_markdown(result, lambda block: None, False, OLMOCR.output.page_join) == "page 1\npage 2\n"
    assert document_markdown(result, lambda block: None, False) == "page 1\n\npage 2\n", "hsd's own: a blank line"
