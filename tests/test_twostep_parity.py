"""The two-step models' block rules against the makers' own functions (mineru-vl-utils 0.1.22,
paddlex 3.7.2, glmocr 0.1.5), on hand-made answers and boxes. Each test skips where its maker's
package is not installed (pip install --no-deps mineru-vl-utils==0.1.22 paddlex==3.7.2
glmocr==0.1.5, and the `parity` extra); paddlex's module is read from its source less its
relative imports, which pull in all of paddlex."""

import ast
import importlib.util
import types
from pathlib import Path

import pytest
import yaml
from PIL import Image, ImageDraw

from hsd_cli.recipes.block_text import glm_block, mineru_equation_brackets
from hsd_cli.recipes.blocks import GLM_OCR, MINERU_2_5, PADDLEOCR_VL, PADDLEOCR_VL_1_6, block_picture, mineru_resize
from hsd_cli.recipes.mineru_layout import layout_text, parse_layout
from hsd_cli.recipes.otsl import mineru_otsl_to_html, paddle_otsl_to_html
from hsd_cli.records.kinds import Block, BlockKind

OTSL_ANSWERS = [
    "<fcel>a<fcel>b<nl><fcel>c<fcel>d<nl>",
    "<fcel>Head<lcel><nl><fcel>x<fcel>y<nl>",
    "<fcel>A<fcel>B<nl><ucel><fcel>2<nl>",
    "<fcel>a<fcel>b<fcel>c<nl><fcel>d<nl>",
    "<fcel>a & <b><ecel><nl><xcel><fcel>q",
    "<fcel>1<lcel><lcel><nl><ucel><xcel><xcel><nl><fcel>z<ecel><fcel>w<nl>",
    "<fcel>a<nl><fcel>b<fcel>c<fcel>d<nl><fcel>e<nl>",
    "<fcel> <fcel>x<nl>",
    "<table><tr><td>1</td></tr></table>",
    "",
    "no tags at all",
]
LAYOUT_ANSWER = "\n".join([
    "<|box_start|>100 50 900 90<|box_end|><|ref_start|>title<|ref_end|><|rotate_up|>",
    "<|box_start|>900 100 100 400<|box_end|><|ref_start|>Text<|ref_end|><|rotate_right|>",
    "<|box_start|>100 400 900 400<|box_end|><|ref_start|>text<|ref_end|><|rotate_up|>",
    "<|box_start|>100 500 1001 600<|box_end|><|ref_start|>table<|ref_end|><|rotate_up|>",
    "<|box_start|>100 500 900 600<|box_end|><|ref_start|>nonsense<|ref_end|><|rotate_up|>",
    "<|box_start|>120 610 880 700<|box_end|><|ref_start|>equation<|ref_end|>",
    "free text",
    "<|box_start|>0 950 1000 1000<|box_end|><|ref_start|>page_number<|ref_end|><|rotate_down|>",
])


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


needs_mineru = pytest.mark.skipif(not _installed("mineru_vl_utils"), reason="mineru-vl-utils is not installed")
needs_paddlex = pytest.mark.skipif(not _installed("paddlex"), reason="paddlex is not installed")
needs_glmocr = pytest.mark.skipif(not _installed("glmocr"), reason="glmocr is not installed")


def _mineru_helper():
    from mineru_vl_utils.mineru_client import DEFAULT_PROMPTS, DEFAULT_SAMPLING_PARAMS, MinerUClientHelper

    return MinerUClientHelper(
        backend="transformers", prompts=DEFAULT_PROMPTS, sampling_params=DEFAULT_SAMPLING_PARAMS,
        layout_image_size=(1036, 1036), min_image_edge=28, max_image_edge_ratio=50, simple_post_process=False,
        handle_equation_block=True, abandon_list=False, abandon_paratext=False, debug=False,
    )


def _paddle_uilts() -> types.ModuleType:
    path = Path(importlib.util.find_spec("paddlex").origin).parent / "inference/pipelines/paddleocr_vl/uilts.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    tree.body = [node for node in tree.body if not (isinstance(node, ast.ImportFrom) and node.level)]
    module = types.ModuleType("paddleocr_vl_uilts")
    exec(compile(tree, str(path), "exec"), module.__dict__)
    return module


def _page(size=(700, 900)) -> Image.Image:
    page = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(page)
    for i in range(0, size[1], 37):
        draw.rectangle((i % 300, i, i % 300 + 200, i + 20), fill=(i % 256, 80, 200 - i % 200))
    return page


@needs_mineru
@pytest.mark.parametrize("otsl", OTSL_ANSWERS)
def test_otsl_to_html_is_minerus(otsl):
    from mineru_vl_utils.post_process.otsl2html import convert_otsl_to_html

    assert mineru_otsl_to_html(otsl) == convert_otsl_to_html(otsl)


@needs_paddlex
def test_otsl_to_html_is_paddleocr_vls():
    convert = _paddle_uilts().convert_otsl_to_html
    for otsl in OTSL_ANSWERS[:-3]:
        assert paddle_otsl_to_html(otsl) == convert(otsl), otsl


@needs_mineru
@pytest.mark.parametrize("latex", ["x^2", "  \\[ a \\]  ", "\\[ a", "b \\]", ""])
def test_formula_wrapping_is_minerus(latex):
    from mineru_vl_utils.post_process import _add_equation_brackets

    assert mineru_equation_brackets(latex) == _add_equation_brackets(latex)


@needs_mineru
def test_the_prompts_and_skipped_kinds_are_minerus():
    from mineru_vl_utils.mineru_client import DEFAULT_PROMPTS
    from mineru_vl_utils.post_process import PARATEXT_TYPES

    assert MINERU_2_5.layout.prompt == DEFAULT_PROMPTS["[layout]"]
    assert MINERU_2_5.default_prompt == DEFAULT_PROMPTS["[default]"]
    assert all(MINERU_2_5.prompt(label) == DEFAULT_PROMPTS[label] for label in ("table", "equation"))
    assert set(MINERU_2_5.dropped) == PARATEXT_TYPES - {"unknown"}


@needs_mineru
def test_the_layout_answer_is_read_as_mineru_reads_it():
    theirs = _mineru_helper().parse_layout_output(LAYOUT_ANSWER)
    ours = parse_layout(LAYOUT_ANSWER)
    assert [(b.label, list(b.fractions), b.angle) for b in ours] == [(b.type, b.bbox, b.angle) for b in theirs]
    assert len(ours) == 4, "a line that is no box, an empty box, one off the grid and an unknown type are left out"


@needs_mineru
def test_the_draft_layout_written_as_mineru_layout_is_read_back_by_mineru():
    blocks = (
        Block("b1", BlockKind.TITLE, (50.0, 40.0, 550.0, 70.0), 0, "A title", None, "pdf-text"),
        Block("b2", BlockKind.TABLE, (60.0, 100.5, 540.2, 400.9), 1, "<table></table>", None, "pdf-text"),
        Block("b3", BlockKind.PAGE_FOOTER, (280.0, 760.0, 320.0, 780.0), 2, "3", None, "pdf-text"),
    )
    answer = layout_text(blocks, (612.0, 792.0))
    theirs = _mineru_helper().parse_layout_output(answer)
    assert [b.type for b in theirs] == ["title", "table", "footer"]
    assert [list(b.fractions) for b in parse_layout(answer)] == [b.bbox for b in theirs]


@needs_mineru
@pytest.mark.parametrize("size", [(40, 3000), (10, 12), (300, 200), (3000, 20)])
def test_a_crop_is_resized_as_mineru_resizes_it(size):
    image = _page(size)
    assert mineru_resize(image).tobytes() == _mineru_helper().resize_by_need(image).tobytes()


@needs_mineru
def test_block_pictures_are_minerus_crops():
    from mineru_vl_utils.structs import ContentBlock

    page = _page()
    blocks = parse_layout(LAYOUT_ANSWER)
    theirs, prompts, _, indices = _mineru_helper().prepare_for_extract(
        page, [ContentBlock(b.label, list(b.fractions), angle=b.angle) for b in blocks],
    )
    read = [b for b in blocks if MINERU_2_5.reads(b.label) or b.label in MINERU_2_5.dropped]
    ours = [block_picture(MINERU_2_5, page, b.grid, b.angle or 0) for b in read]
    assert [o.size for o in ours] == [t.size for t in theirs]
    assert all(o.tobytes() == t.tobytes() for o, t in zip(ours, theirs))
    assert prompts == [MINERU_2_5.prompt(b.label) for b in read]


@needs_paddlex
def test_the_labels_paddleocr_vl_leaves_out_of_markdown_are_its_configs():
    root = Path(importlib.util.find_spec("paddlex").origin).parent / "configs/pipelines"
    for two_step, config in ((PADDLEOCR_VL, "PaddleOCR-VL.yaml"), (PADDLEOCR_VL_1_6, "PaddleOCR-VL-1.6.yaml")):
        settings = yaml.safe_load((root / config).read_text(encoding="utf-8"))
        assert set(two_step.dropped) == set(settings["markdown_ignore_labels"])


@needs_glmocr
def test_the_prompts_and_kinds_glm_ocr_reads_and_drops_are_its_configs():
    settings = yaml.safe_load((Path(importlib.util.find_spec("glmocr").origin).parent / "config.yaml").read_text())["pipeline"]
    tasks = settings["layout"]["label_task_mapping"]
    prompts = settings["page_loader"]["task_prompt_mapping"]
    assert set(GLM_OCR.skipped) == set(tasks["skip"]) and set(GLM_OCR.dropped) == set(tasks["abandon"])
    assert all(GLM_OCR.prompt(label) == prompts["text"] for label in tasks["text"])
    assert all(GLM_OCR.prompt(label) == prompts["formula"] for label in tasks["formula"])
    assert GLM_OCR.prompt("table") == prompts["table"] and settings["layout"]["threshold"] == GLM_OCR.layout.threshold


@needs_glmocr
@pytest.mark.parametrize(("label", "raw"), [
    ("text", "A line\nand the next.\n\nA paragraph $ x + 1 $after."),
    ("text", "• a bullet"), ("text", "(3)the third"), ("text", "2）second"), ("text", "```py\nprint()"),
    ("text", "Leaders......... 12"), ("doc_title", "## The Title"), ("paragraph_title", "- 1 Intro"),
    ("display_formula", "\\[ E = mc^2 \\]"), ("display_formula", "$$a$$"), ("inline_formula", "\\( x \\)"),
    ("table", "<table><tr><td>1</td></tr></table>"), ("table", " <table>x"), ("formula_number", "(1)"),
])
def test_a_blocks_text_is_glm_ocrs(label, raw):
    import glmocr.config as glm_config
    from glmocr.postprocess.result_formatter import ResultFormatter

    settings = yaml.safe_load((Path(glm_config.__file__).parent / "config.yaml").read_text())["pipeline"]["result_formatter"]
    formatter = ResultFormatter(glm_config.ResultFormatterConfig(**settings))
    assert glm_block(label, raw) == formatter._format_content(raw, formatter._map_label(label), label)


@needs_glmocr
def test_glm_ocr_crops_on_its_grid():
    from glmocr.utils.image_utils import crop_image_region

    page = _page()
    for grid in ((100, 50, 900, 90), (0, 0, 1000, 1000), (333, 667, 340, 999)):
        assert block_picture(GLM_OCR, page, grid).tobytes() == crop_image_region(page, list(grid)).tobytes()
