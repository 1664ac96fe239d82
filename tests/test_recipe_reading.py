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


def test_answers_the_makers_would_not_accept_are_read_again_as_they_do(docs_dir, tiny_model, tmp_path):
    """olmOCR reads a page again at its next temperature while the answer ran out of budget or
    has no front matter, eight attempts in all, then keeps the PDF's text layer. A tiny random
    model never writes front matter: every attempt is read, each one plain sampling at its
    attempt's temperature and seed (the last checked token for token by --baseline), and their
    forwards are the page's. Under --greedy the second attempt would be the first again: none is
    decoded, and the fallback stands in at once."""
    document = _convert(docs_dir, tmp_path / "sampled", tiny_model, "--recipe", "olmocr-2", "--seed", "5", "--baseline")
    page = document["pages"][0]
    attempts = page["stats"]["attempts"]
    assert [retry["attempt"] for retry in attempts["retried"]] == list(range(7))
    assert all("unparsable" in retry["reasons"] and retry["forwards"] > 0 for retry in attempts["retried"])
    assert "unparsable" in attempts["not_accepted"]
    assert page["stats"]["baseline"]["identical"] is True, "the eighth attempt, at temperature 1.0, is plain sampling's"
    with pymupdf.open(docs_dir / "report.pdf") as pdf:
        text_layer = pdf[0].get_text().strip()
    assert page["markdown"].strip() == text_layer and page["text_source"] == "makers_fallback"
    assert page["flags"] == ["fallback", "not_accepted"] and "accept none of its 8 answer(s)" in page["notice"]
    answers = {retry["new_tokens"] for retry in attempts["retried"]}
    assert answers == {12}, "each attempt ran to the budget"

    greedy = _convert(docs_dir, tmp_path / "greedy", tiny_model, "--recipe", "olmocr-2", "--greedy")["pages"][0]
    assert greedy["stats"]["attempts"]["retried"] == [] and greedy["stats"]["attempts"]["not_accepted"]
    assert greedy["markdown"].strip() == text_layer


def test_a_retried_attempt_is_read_at_the_makers_temperature_for_it():
    from hsd_cli.config import ModelConfig
    from hsd_cli.decoding import SamplingConfig
    from hsd_cli.serving.model import ATTEMPT_SEEDS, attempt_sampling

    config = ModelConfig("m", "qwen2_5_vl", "cpu", "float32", False, 12, False, None, recipe="olmocr-2", seed=2)
    first = SamplingConfig(temperature=0.1, seed=2)
    temperatures = [attempt_sampling(OLMOCR, config, first, attempt).temperature for attempt in range(9)]
    assert temperatures == [0.1, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1.0, 1.0]
    seeds = [attempt_sampling(OLMOCR, config, first, attempt).seed for attempt in range(3)]
    assert seeds == [2, 2 * ATTEMPT_SEEDS + 1, 2 * ATTEMPT_SEEDS + 2], "a retry at 0.1 draws anew"
    chandra = recipes()["chandra-2"]
    second = attempt_sampling(chandra, config, SamplingConfig(), 1)
    assert (second.temperature, second.top_p) == (0.2, 0.95), "Chandra: greedy first, then 0.2 at top-p 0.95"
    greedy = ModelConfig("m", "qwen2_5_vl", "cpu", "float32", False, 12, False, None, recipe="olmocr-2", greedy=True)
    assert attempt_sampling(OLMOCR, greedy, SamplingConfig(), 5).greedy


class ScriptedAttempts:
    """A reader whose answer depends on the attempt it reads as: the page stage's side of the
    Reader, enough for the makers' retries."""

    def __init__(self, answers, recipe=OLMOCR):
        from hsd_cli.models.family_settings import settings_for

        self.answers, self.recipe, self.near_lossless = answers, recipe, None
        self.settings = settings_for("qwen2_5_vl")
        self.current, self.reads, self.drafts_seen = 0, [], []

    def attempt(self, attempt):
        from contextlib import contextmanager

        @contextmanager
        def reading_as():
            self.current = attempt
            yield
        return reading_as()

    def attempt_sampling(self, attempt):
        from hsd_cli.decoding import SamplingConfig

        return SamplingConfig(temperature=0.1, seed=attempt)

    def decode(self, picture, prompt, drafts, near_lossless=None):
        from hsd_cli.decoding import DecodeResult, DecodeStats

        text, stop = self.answers[self.current]
        self.reads.append(self.current)
        self.drafts_seen.append(list(drafts))
        return DecodeResult([1] * 4, DecodeStats(forwards=2, new_tokens=4), stop, text)


ACCEPTED = "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\nis_diagram: False\n---\nThe page."


def test_the_first_answer_the_makers_accept_ends_the_attempts():
    from PIL import Image

    from hsd_cli.config import Stages
    from hsd_cli.records.page import Page
    from hsd_cli.stages.planner import fixed_plan
    from hsd_cli.stages.page_stage import page_stage
    from hsd_cli.stages.retries import makers_attempts

    page = Page(page_no=1, size_pt=(612.0, 792.0), picture=Image.new("RGB", (64, 64), "white"), plan=fixed_plan(Stages.PAGE, ()))
    reader = ScriptedAttempts({0: ("no front matter", "eos"), 1: ("---\nis_table: [", "budget"), 2: (ACCEPTED, "eos"), 3: (ACCEPTED, "eos")})
    first = page_stage(reader, page.model_view, [], reader.settings)
    reading = makers_attempts(page, reader, first, 100, (), lambda: 0.0)
    assert reader.reads == [0, 1, 2], "read until the third attempt's answer is accepted, then no more"
    assert [(retry.attempt, retry.reasons) for retry in reading.retries] == [(0, ("unparsable",)), (1, ("out_of_budget", "unparsable"))]
    assert reading.text == "The page." and reading.not_accepted == () and reading.forwards == 6
    assert "no front matter" in reader.drafts_seen[1] and "---\nis_table: [" in reader.drafts_seen[2], "earlier answers draft the next"

    over = ScriptedAttempts(dict.fromkeys(range(8), (ACCEPTED, "eos")))
    crowded = makers_attempts(page, over, page_stage(over, page.model_view, [], over.settings), 16_381, (), lambda: 0.0)
    assert len(crowded.retries) == 7 and crowded.not_accepted == ("over_context",), "prompt and answer past olmOCR's 16,384 tokens"


def test_a_page_deepseek_would_drop_is_left_out_and_says_why():
    from types import SimpleNamespace

    from hsd_cli.decoding import DecodeResult, DecodeStats
    from hsd_cli.records.page import Page, Reading
    from hsd_cli.stages.retries import makers_fallback

    reading = Reading(DecodeResult([1], DecodeStats(), "budget", "half a page"), None, "half a page", {}, not_accepted=("out_of_budget",))
    page = Page(page_no=1, size_pt=(612.0, 792.0), reading=reading, text="half a page", flags=("vlm", "truncated"))
    dropped = makers_fallback(page, SimpleNamespace(recipe=recipes()["deepseek-ocr-2"]), lambda: "the text layer")
    assert dropped.text == "" and dropped.flags == ("fallback", "not_accepted") and "left out" in dropped.notice
    kept = makers_fallback(page, SimpleNamespace(recipe=recipes()["chandra-2"]), lambda: "the text layer")
    assert kept is page, "Chandra keeps its last answer"
