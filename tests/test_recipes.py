"""The recipes' data and pure functions on small inputs built here (the makers' own code is
compared in test_recipes_parity.py, where it is installed)."""

from dataclasses import fields

import pymupdf
import pytest

from hsd_cli.models.family_settings import all_settings, settings_for
from hsd_cli.recipes import recipe as recipe_data
from hsd_cli.recipes.known import KNOWN_RECIPES, QWEN2_VL_PROCESSOR
from hsd_cli.recipes.messages import build_messages, image_first, prompt_text
from hsd_cli.recipes.postprocess import (
    POSTPROCESSORS,
    deepseek_page,
    hunyuan_clean_repeats,
    join_pages,
    olmocr_json_page,
    olmocr_yaml_page,
)
from hsd_cli.recipes.recipe import Output
from hsd_cli.recipes.registry import family_default, recipe_for, recipes
from hsd_cli.recipes.retry import attempt_temperature, chandra_has_repeat, retry_reasons
from hsd_cli.recipes.sizes import (
    chandra_scale_to_fit,
    hsd_render_scale,
    image_tokens,
    pdf_box_size,
    processor_input,
    render_size,
)

LETTER = (612.0, 792.0)
FRONT_MATTER = "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\nis_diagram: False\n---\n"


def test_every_known_id_finds_its_recipe_and_names_find_theirs():
    for recipe in KNOWN_RECIPES:
        assert recipe_for(recipe.name) is recipe
        for model_id in recipe.model_ids:
            assert recipe_for(model_id) is recipe
            assert recipe_for(model_id.upper()) is recipe
    assert recipe_for("/models/my-olmocr-finetune") is None
    assert recipe_for("hsd-qwen2_5_vl").prompt.text == settings_for("qwen2_5_vl").page_prompt


def test_recipes_hold_only_known_choices():
    for recipe in recipes().values():
        assert recipe.family in {settings.family for settings in all_settings()}
        assert recipe.render.renderer in recipe_data.RENDERERS
        assert recipe.render.rule in recipe_data.SIZE_RULES
        assert set(recipe.retry.retry_when) <= set(recipe_data.RETRY_REASONS)
        assert recipe.output.fallback in recipe_data.FALLBACKS
        assert recipe.output.postprocess in POSTPROCESSORS
        assert sorted(recipe.prompt.order) == ["image", "text"]
        assert recipe.retry.max_attempts >= 1


def test_family_default_is_hsd_today():
    settings = settings_for("qwen2_5_vl")
    default = family_default(settings)
    assert (default.render.renderer, default.render.dpi, default.render.max_pixels) == ("pymupdf", 150, 4_194_304)
    assert default.decoding.max_new_tokens == settings.max_new_tokens == 4096
    assert image_first(default.prompt) and default.prompt.system is None
    assert default.output.page_join == "\n\n"


def test_olmocr_2_pixels_and_tokens_against_hsd_today():
    olmocr = recipe_for("allenai/olmOCR-2-7B-1025")
    # pdftoppm's ceil: a Letter page at 1288 px is 996 wide, not 995.
    assert processor_input(olmocr.render, None, olmocr.processor, LETTER) == ((996, 1288), (1008, 1288), 1656)
    hsd = family_default(settings_for("qwen2_5_vl"))
    assert processor_input(hsd.render, None, QWEN2_VL_PROCESSOR, LETTER) == ((1275, 1650), (1288, 1652), 2714)


def test_pdftoppm_sizes_where_floats_tip_the_ceil():
    olmocr = recipe_for("olmocr-2").render
    # 720 * 128.8 / 72 is 1288.0000000000002; pdfinfo prints 841.89001 as 841.89.
    assert render_size(olmocr, (720.0, 540.0)) == (1289, 966)
    assert render_size(olmocr, (595.276, 841.89001)) == (911, 1289)
    assert render_size(recipe_for("olmocr-0225").render, LETTER) == (792, 1024)
    # The box as the file writes it, in doubles: PyMuPDF's float32 rect cannot tell these apart.
    assert render_size(olmocr, pdf_box_size("[0 0 595.276 841.89]")) == (911, 1288)
    assert render_size(olmocr, pdf_box_size("[0 0 595.276 841.89001]")) == (911, 1289)


@pytest.mark.parametrize("size_pt", [LETTER, (595.276, 841.89), (180.0, 300.0), (1836.75, 2267.25)])
def test_hsd_render_size_is_pymupdfs(size_pt):
    render = family_default(settings_for("default")).render
    doc = pymupdf.open()
    page = doc.new_page(width=size_pt[0], height=size_pt[1])
    scale = hsd_render_scale(size_pt, render.dpi, render.max_pixels)
    pixmap = page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), alpha=False)
    assert render_size(render, size_pt) == (pixmap.width, pixmap.height)


def test_other_render_rules():
    assert render_size(recipe_for("deepseek-ocr-2").render, LETTER) == (1224, 1584)
    # Chandra: 192 dpi unless the short side would be under 1024 px.
    assert render_size(recipe_for("chandra-2").render, LETTER) == (1632, 2112)
    assert render_size(recipe_for("chandra-2").render, (180.0, 300.0)) == (1024, 1707)
    # GLM-OCR: 200 dpi, the long side capped at 3500.
    assert render_size(recipe_for("glm-ocr").render, LETTER) == (1700, 2200)
    assert render_size(recipe_for("glm-ocr").render, (1836.75, 2267.25)) == (2836, 3500)


def test_chandra_scale_to_fit():
    chandra_2 = recipe_for("chandra-2").client_resize
    chandra_1 = recipe_for("chandra-1").client_resize
    assert chandra_scale_to_fit((1632, 2112), chandra_2) == (1624, 2100)
    width, height = chandra_scale_to_fit((3000, 4000), chandra_2)
    assert width % 28 == height % 28 == 0 and width * height <= 3072 * 2048
    assert chandra_scale_to_fit((3000, 4000), chandra_1) == (2172, 2896)
    assert chandra_scale_to_fit((1000, 1000), chandra_1) == (1000, 1000)


def test_image_tokens_follow_the_grid_and_the_limits():
    assert image_tokens(28, 28, QWEN2_VL_PROCESSOR) == 4  # raised to min_pixels 3136: 56 x 56
    assert image_tokens(1288, 1008, QWEN2_VL_PROCESSOR) == 46 * 36
    huge = image_tokens(10000, 8000, QWEN2_VL_PROCESSOR)
    assert huge * 28 * 28 <= QWEN2_VL_PROCESSOR.max_pixels


def test_messages_in_the_makers_order():
    olmocr = build_messages(recipe_for("olmocr-2").prompt)
    assert [part["type"] for part in olmocr[0]["content"]] == ["text", "image"] and olmocr[0]["role"] == "user"
    assert not image_first(recipe_for("olmocr-2").prompt)
    hunyuan = build_messages(recipe_for("hunyuan-ocr").prompt)
    assert hunyuan[0] == {"role": "system", "content": ""}
    assert [part["type"] for part in hunyuan[1]["content"]] == ["image", "text"]
    nanonets = build_messages(recipe_for("nanonets-ocr-s").prompt)
    assert nanonets[0]["content"] == "You are a helpful assistant."
    assert build_messages(family_default(settings_for("lighton_ocr")).prompt) == [{"role": "user", "content": [{"type": "image"}]}]


def test_anchor_text_goes_in_its_slot():
    prompt = recipe_for("olmocr-0225").prompt
    text = prompt_text(prompt, "Page {1} [a]")
    assert text.endswith("RAW_TEXT_START\nPage {1} [a]\nRAW_TEXT_END")
    with pytest.raises(ValueError):
        prompt_text(prompt)


def test_olmocr_front_matter():
    page = olmocr_yaml_page(FRONT_MATTER + "# Title\n\nBody\n")
    assert page.valid and page.text == "# Title\n\nBody"
    assert page.fields == {"primary_language": "en", "is_rotation_valid": True, "rotation_correction": 0, "is_table": False, "is_diagram": False}
    assert olmocr_yaml_page(FRONT_MATTER).text is None  # no text: natural_text None
    assert not olmocr_yaml_page("# Title without front matter").valid
    assert not olmocr_yaml_page(FRONT_MATTER.replace("rotation_correction: 0", "rotation_correction: 45")).valid
    assert not olmocr_yaml_page(FRONT_MATTER.replace("is_table: False\n", "")).valid
    assert olmocr_yaml_page(FRONT_MATTER.replace("en", "no")).fields["primary_language"] is None  # YAML's no


def test_olmocr_json():
    record = '{"primary_language": "en", "is_rotation_valid": true, "rotation_correction": 0, "is_table": false, "is_diagram": false, "natural_text": "Hello"}'
    assert olmocr_json_page(record).text == "Hello"
    assert not olmocr_json_page(record[:-3]).valid
    assert not olmocr_json_page(record.replace('"is_table": false, ', "")).valid


def test_deepseek_pages():
    eos = "<｜end▁of▁sentence｜>"
    raw = ("<|ref|>title<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>\n# Head\n\n\n\n"
           "<|ref|>image<|/ref|><|det|>[[5, 6, 7, 8]]<|/det|>\n<|ref|>text<|/ref|><|det|>[[0, 0, 9, 9]]<|/det|>\nx \\coloneqq y" + eos)
    page = deepseek_page(raw, page_index=3)
    assert page.text == "\n# Head\n\n![](images/3_0.jpg)\n\nx := y"
    assert page.fields["tagged"] == raw.replace(eos, "")
    assert deepseek_page(raw.replace(eos, "")).text is None


def test_hunyuan_cleanup_keeps_short_outputs_and_one_copy_of_a_long_tail():
    assert hunyuan_clean_repeats("ab" * 100) == "ab" * 100
    text = "Intro. " + "<td>1</td>" * 1000
    assert hunyuan_clean_repeats(text) == "Intro. <td>1</td>"


def test_page_joins():
    olmocr = recipe_for("olmocr-2").output
    assert join_pages(["A", None, "C"], olmocr) == "A\nC"
    assert join_pages(["A", None], olmocr) == "A\n"  # as build_dolma_document: the join goes by index
    deepseek = recipe_for("deepseek-ocr-2").output
    assert join_pages(["A", None, "B"], deepseek) == "A\n\n<--- Page Split --->\nB\n\n<--- Page Split --->\n"
    assert join_pages(["A", "B"], Output(postprocess="plain", fallback="draft", page_join="")) == "AB"


def test_retry_rules():
    olmocr = recipe_for("olmocr-2").retry
    assert [attempt_temperature(olmocr, k) for k in (0, 1, 2, 7, 9)] == [0.1, 0.1, 0.2, 1.0, 1.0]
    good = olmocr_yaml_page(FRONT_MATTER + "Text")
    assert retry_reasons(olmocr, good, stopped=True, total_tokens=3000) == ()
    assert retry_reasons(olmocr, good, stopped=False, total_tokens=17000) == ("out_of_budget", "over_context")
    rotated = olmocr_yaml_page(FRONT_MATTER.replace("is_rotation_valid: True", "is_rotation_valid: False") + "Text")
    assert retry_reasons(olmocr, rotated, stopped=True, total_tokens=10) == ("rotation_invalid",)
    chandra = recipe_for("chandra-2").retry
    assert [attempt_temperature(chandra, k) for k in range(7)] == [0.0, 0.2, 0.4, 0.6, 0.8, 0.8, 0.8]
    assert chandra_has_repeat("<p>intro</p>" + "ha" * 40) and not chandra_has_repeat("<p>a plain page of text.</p>")
    loop = olmocr_yaml_page("x")
    assert retry_reasons(chandra, loop, stopped=True, total_tokens=0, raw="z" * 30) == ("repeats",)


def test_chandra_markdown_drops_headers_and_writes_math_in_dollars():
    pytest.importorskip("markdownify")
    page = POSTPROCESSORS["chandra_html"](
        '<div data-label="Page-Header">Journal</div><div data-label="Text">Cost $5 and <math>x^2</math></div>'
        '<div data-label="Equation-Block"><math display="block">E=mc^2</math></div>', 0)
    assert page.text == "Cost \\$5 and  $x^2$ \n$$E=mc^2$$"


def test_recipe_fields_are_frozen():
    recipe = recipe_for("olmocr-2")
    with pytest.raises(AttributeError):
        recipe.name = "other"
    assert {field.name for field in fields(recipe)} >= {"render", "processor", "prompt", "decoding", "retry", "output"}
