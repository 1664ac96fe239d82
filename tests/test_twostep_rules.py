"""The two-step models' block rules (hsd_cli/recipes/blocks.py, block_text.py, otsl.py,
mineru_layout.py) on hand-made answers: what holds without the makers' packages."""

import pytest
from PIL import Image

from hsd_cli.recipes.block_text import block_text, page_markdown, paddle_math_delimiters
from hsd_cli.recipes.blocks import GLM_OCR, MINERU_2_5, PADDLEOCR_VL, block_picture, grid_box
from hsd_cli.recipes.mineru_layout import layout_line, layout_text, parse_layout
from hsd_cli.recipes.otsl import html_to_otsl, mineru_otsl_to_html, pad_rows, paddle_otsl_to_html
from hsd_cli.recipes.registry import recipe_for
from hsd_cli.records.kinds import Block, BlockKind


@pytest.mark.parametrize("table", [
    "<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table>",
    '<table><tr><td colspan="2">head</td></tr><tr><td>x</td><td></td></tr></table>',
    '<table><tr><td rowspan="2">a</td><td>b</td></tr><tr><td>c</td></tr></table>',
    '<table><tr><td rowspan="2" colspan="2">big</td><td>1</td></tr><tr><td>2</td></tr></table>',
])
def test_an_html_table_written_in_otsl_converts_back_to_itself(table):
    otsl = html_to_otsl(table)
    assert otsl.endswith("<nl>") and "<td" not in otsl
    assert mineru_otsl_to_html(otsl) == table == paddle_otsl_to_html(otsl)


def test_otsl_spans_and_padding():
    assert html_to_otsl('<table><tr><td colspan="2">h</td></tr><tr><td>x</td><td>y</td></tr></table>') == "<fcel>h<lcel><nl><fcel>x<fcel>y<nl>"
    assert pad_rows("<fcel>a<nl><fcel>b<fcel>c<fcel>d<nl><fcel>e<nl>") == (
        "<fcel>a<ecel><ecel><nl><fcel>b<fcel>c<fcel>d<nl><fcel>e<ecel><ecel><nl>"), "no narrower than the last <fcel>"
    assert mineru_otsl_to_html("<fcel>1 < 2<nl>") == "<table><tr><td>1 &lt; 2</td></tr></table>", "texts escaped"
    assert mineru_otsl_to_html("no table") == "", "no cells, no table"


def test_each_maker_writes_a_blocks_answer_its_own_way():
    assert block_text(MINERU_2_5, "equation", "x^2") == "$$\nx^2\n$$"
    assert block_text(MINERU_2_5, "table", "<fcel>a<nl>") == "<table><tr><td>a</td></tr></table>"
    assert block_text(MINERU_2_5, "title", "Intro") == "# Intro"
    assert block_text(PADDLEOCR_VL, "paragraph_title", "Intro") == "## Intro"
    assert paddle_math_delimiters("a \\(x\\) b", "text") == "a  $ x $ b"
    assert paddle_math_delimiters("\\(1\\)", "formula_number") == "  1 "
    assert block_text(GLM_OCR, "display_formula", "\\[ a \\]") == "$$\na\n$$"
    assert block_text(GLM_OCR, "text", "one\ntwo") == "one\n\ntwo"


def test_a_page_is_its_blocks_joined_without_the_dropped_kinds():
    blocks = [("header", "Running head"), ("title", "Intro"), ("text", "Body."), ("text", "  "), ("page_number", "3"),
              ("equation", "x")]
    assert page_markdown(MINERU_2_5, blocks) == "# Intro\n\nBody.\n\n$$\nx\n$$"


def test_the_draft_layout_as_mineru_layout_reads_back_as_the_same_blocks():
    blocks = (
        Block("b2", BlockKind.TABLE, (61.2, 79.2, 550.8, 396.0), 1, "", None, "ocr"),
        Block("b1", BlockKind.SECTION_HEADER, (61.2, 39.6, 306.0, 60.0), 0, "", None, "ocr"),
        Block("b3", BlockKind.FORMULA, (100.0, 500.0, 100.1, 520.0), 2, "", None, "ocr"),  # nothing left on the grid
    )
    answer = layout_text(blocks, (612.0, 792.0))
    assert answer.split("\n")[0] == "<|box_start|>100 50 500 75<|box_end|><|ref_start|>title<|ref_end|><|rotate_up|>"
    assert [(b.label, b.grid, b.angle) for b in parse_layout(answer)] == [("title", (100, 50, 500, 75), 0), ("table", (100, 100, 899, 500), 0)], "truncated"
    assert parse_layout(layout_line("text", (1, 2, 3, 4), 270) + "\nnoise") [0].angle == 270


def test_the_draft_layout_in_a_layout_models_labels_keeps_every_kind_it_reads():
    from hsd_cli.recipes.mineru_layout import draft_layout

    blocks = (Block("h", BlockKind.SECTION_HEADER, (61.2, 39.6, 306.0, 60.0), 0, "", None, "ocr"),
              Block("f", BlockKind.FORMULA, (61.2, 79.2, 550.8, 99.0), 1, "", None, "ocr"))
    assert [b.label for b in draft_layout(blocks, (612.0, 792.0), GLM_OCR)] == ["paragraph_title", "display_formula"]
    assert all(GLM_OCR.reads(b.label) for b in draft_layout(blocks, (612.0, 792.0), GLM_OCR))


def test_crops_follow_each_makers_rule():
    page = Image.new("RGB", (1000, 2000), "white")
    assert grid_box((10.0, 20.0, 30.0, 40.0), (100, 200)) == (100, 100, 300, 200)
    assert block_picture(MINERU_2_5, page, (0, 0, 500, 5)).size == (1400, 28), "a thin crop is raised to 28 px"
    assert block_picture(MINERU_2_5, page, (0, 0, 100, 50), 90).size == (100, 100)
    paddle = block_picture(PADDLEOCR_VL, page, (0, 0, 1000, 1000))
    assert paddle.width % 28 == 0 and paddle.height % 28 == 0 and paddle.width * paddle.height <= 1_003_520
    assert block_picture(GLM_OCR, page, (100, 100, 200, 150)).size == (100, 100)
    assert block_picture(GLM_OCR, page, (100, 100, 100, 150)) is None


def test_the_two_step_models_recipes_say_so():
    assert recipe_for("opendatalab/MinerU2.5-2509-1.2B").two_step is MINERU_2_5
    assert recipe_for("PaddlePaddle/PaddleOCR-VL-1.6").two_step.layout.finder == "pp-doclayout-v3"
    assert recipe_for("zai-org/GLM-OCR").two_step.dropped[:2] == ("header", "footer")
    assert recipe_for("allenai/olmOCR-2-7B-1025").two_step is None


def test_a_ground_truth_layout_is_written_as_minerus_answer_in_its_reading_order():
    from hsd_cli.bench.two_step import ground_truth_blocks, ground_truth_layout

    record = {"page_info": {"width": 200, "height": 100}, "layout_dets": [
        {"category_type": "text_block", "order": 2, "poly": [20, 50, 180, 50, 180, 90, 20, 90]},
        {"category_type": "title", "order": 1, "poly": [20, 10, 180, 10, 180, 30, 20, 30]},
        {"category_type": "text_span", "order": 3, "poly": [0, 0, 1, 0, 1, 1, 0, 1]},
        {"category_type": "header", "order": 0, "poly": [0, 0, 10, 0, 10, 5, 0, 5], "ignore": True},
    ]}
    assert [b.label for b in parse_layout(ground_truth_layout(record))] == ["title", "text"]
    assert parse_layout(ground_truth_layout(record))[1].grid == (100, 500, 900, 900)
    record["layout_dets"][0]["text"] = "Body."
    record["layout_dets"].append({"category_type": "equation_isolated", "order": 4, "latex": "$$\nx^2\n$$", "poly": [20, 92, 180, 92, 180, 99, 20, 99]})
    assert ground_truth_blocks(record) == [("text", (100, 500, 900, 900), "Body."), ("equation", (100, 920, 900, 990), "x^2")], (
        "the title has no text to read; the formula is read bare")


def test_a_layout_models_detections_come_in_its_reading_order_above_the_threshold():
    import torch

    from hsd_cli.models.layout import found_blocks, reading_ranks
    from hsd_cli.stages.blocks import found_layout

    # Three queries, two classes; the order head says query 2 reads first, then 0, then 1.
    order = torch.tensor([[[0.0, 9.0, -9.0], [-9.0, 0.0, -9.0], [9.0, 9.0, 0.0]]])
    assert reading_ranks(order).tolist() == [[1, 2, 0]]
    logits = torch.tensor([[[5.0, -9.0], [-9.0, 4.0], [-9.0, -1.0]]])
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.5, 0.1, 1.0, 0.2], [0.25, 0.75, 0.5, 0.5]]])
    found = found_blocks(logits, boxes, order, (200, 100), {0: "text", 1: "table"}, threshold=0.3)
    assert [b.label for b in found] == ["text", "table"], "the third query is under the threshold"
    assert [b.box for b in found] == [pytest.approx((80.0, 40.0, 120.0, 60.0)), pytest.approx((0.0, 0.0, 200.0, 20.0))]
    assert [b.grid for b in found_layout(found, (200, 100))] == [(400, 400, 600, 600), (0, 0, 1000, 200)]


def test_a_ground_truth_block_empty_on_the_grid_does_not_shift_the_others():
    from hsd_cli.bench.two_step import ground_truth_blocks

    record = {"page_info": {"width": 2000, "height": 1000}, "layout_dets": [
        {"category_type": "text_block", "order": 1, "text": "gone", "poly": [10, 10, 11, 10, 11, 11, 10, 11]},
        {"category_type": "table", "order": 2, "html": "<table><tr><td>a</td></tr></table>", "poly": [0, 0, 2000, 0, 2000, 500, 0, 500]},
    ]}
    assert ground_truth_blocks(record) == [("table", (0, 0, 1000, 500), "<fcel>a<nl>")]


def test_hsd_models_says_which_known_models_read_a_page_in_two_steps():
    import json

    from tests.conftest import run_hsd

    result = run_hsd("models", "--json")
    assert result.exit_code == 0, result.output
    reads = {m["id"]: (m["recipe"], m["reads"]) for f in json.loads(result.stdout)["families"] for m in f["models"]}
    assert reads["opendatalab/MinerU2.5-2509-1.2B"] == ("mineru-2.5", "two steps (layout by vlm, then blocks)")
    assert reads["PaddlePaddle/PaddleOCR-VL-1.6"] == ("paddleocr-vl-1.6", "two steps (layout by pp-doclayout-v3, then blocks)")
    assert reads["zai-org/GLM-OCR"][1].startswith("two steps") and reads["allenai/olmOCR-2-7B-1025"][1] == "one pass"
    assert all(read in ("one pass",) or read.startswith("two steps") for _, read in reads.values())
