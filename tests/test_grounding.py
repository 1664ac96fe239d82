"""Grounding tags (DeepSeek-OCR's `<|ref|>label<|/ref|><|det|>[[x1, y1, x2, y2]]<|/det|>` before each
block): the page's Markdown without them, its JSON with what they say, drafts that carry them;
on hand-written model text, no model."""

from dataclasses import replace

from PIL import Image

from hsd_cli.bench.oracle import OracleTarget
from hsd_cli.decoding import (
    DecodeConfig,
    DecodeRequest,
    DecodeResult,
    DecodeStats,
    ProposerConfig,
    decode_batch,
    make_proposer,
)
from hsd_cli.models.family_settings import settings_for
from hsd_cli.output.json_doc import page_json
from hsd_cli.output.markdown import page_markdown
from hsd_cli.records.page import Page
from hsd_cli.records.kinds import Block, BlockKind
from hsd_cli.stages.dialect import page_drafts
from hsd_cli.stages.grounding import split_grounding
from hsd_cli.stages.outcome import model_reading
from hsd_cli.stages.page_stage import upright_read
from hsd_cli.stages.region import region_result
from tests.test_dialect import CharTokenizer

TABLE = "<table><tr><td>a</td><td>1</td></tr></table>"
OUTPUT = (
    "<|ref|>title<|/ref|><|det|>[[330, 198, 559, 230]]<|/det|>\n# R&D QUALITY IMPROVEMENT  \n\n"
    "<|ref|>text<|/ref|><|det|>[[115, 250, 270, 278]]<|/det|>\nName: Lea Fischer \n\n"
    "<|ref|>image<|/ref|><|det|>[[0, 0, 999, 999]]<|/det|>\n \n\n"
    "<|ref|>table<|/ref|><|det|>[[89, 540, 907, 700]]<|/det|>\n"
    "<|ref|>table_caption<|/ref|><|det|>[[91, 520, 353, 535]]<|/det|>\nTable 1. Results.   \n\n"
    f"{TABLE}\n\n"
    "<|ref|>text<|/ref|><|det|>[[100, 710, 400, 730], [500, 710, 900, 730]]<|/det|>\nTwo columns of one line."
)
MARKDOWN = f"# R&D QUALITY IMPROVEMENT  \n\nName: Lea Fischer \n\nTable 1. Results.   \n\n{TABLE}\n\nTwo columns of one line."
SETTINGS = settings_for("deepseek_ocr2")


def test_the_markdown_is_the_text_without_its_tags_and_the_tags_say_each_blocks_label_boxes_and_text():
    grounding, body = split_grounding(OUTPUT, "deepseek")
    assert body == MARKDOWN
    assert grounding.scale == 999
    assert [(block.label, block.boxes) for block in grounding.blocks] == [
        ("title", ((330, 198, 559, 230),)),
        ("text", ((115, 250, 270, 278),)),
        ("image", ((0, 0, 999, 999),)),
        ("table", ((89, 540, 907, 700),)),
        ("table_caption", ((91, 520, 353, 535),)),
        ("text", ((100, 710, 400, 730), (500, 710, 900, 730))),
    ]
    assert [block.text for block in grounding.blocks] == [
        "# R&D QUALITY IMPROVEMENT", "Name: Lea Fischer", "", "", f"Table 1. Results.   \n\n{TABLE}", "Two columns of one line.",
    ]


def test_a_tag_the_output_ends_inside_is_dropped_and_text_without_tags_is_left_alone():
    grounding, body = split_grounding(OUTPUT + "\n\n<|ref|>image<|/ref|><|det|>[[480, 270", "deepseek")
    assert body == MARKDOWN and len(grounding.blocks) == 6
    assert split_grounding("<|ref|>tit", "deepseek")[1] == ""
    assert split_grounding("# Plain Markdown", "deepseek") == (None, "# Plain Markdown")
    assert split_grounding(OUTPUT, "none") == (None, OUTPUT), "a family without tags keeps its text as written"


def _read(text: str):
    result = DecodeResult(tokens=[1, 2, 3], stats=DecodeStats(forwards=3, new_tokens=3), stop_reason="eos", text=text)
    return lambda picture: result


def test_the_page_json_keeps_the_grounding_in_the_models_coordinates_and_in_points():
    drafted = Page(page_no=1, size_pt=(612.0, 792.0), picture=Image.new("RGB", (8, 8)), flags=("draft_only",))
    reading = upright_read(drafted.picture, SETTINGS, _read(OUTPUT))
    page = model_reading(drafted, reading, SETTINGS.max_new_tokens)
    markdown = page_markdown(page, lambda block: None)
    assert markdown == MARKDOWN
    record = page_json(page, markdown, lambda block: None)
    assert record["markdown"] == MARKDOWN and record["text_source"] == "model"
    grounding = record["grounding"]
    assert grounding["scale"] == 999
    image = grounding["blocks"][2]
    assert image == {"label": "image", "boxes": [[0, 0, 999, 999]], "boxes_pt": [[0.0, 0.0, 612.0, 792.0]], "text": ""}
    title = [round(330 / 999 * 612, 2), round(198 / 999 * 792, 2), round(559 / 999 * 612, 2), round(230 / 999 * 792, 2)]
    assert grounding["blocks"][0]["boxes_pt"] == [title]
    assert len(grounding["blocks"][5]["boxes_pt"]) == 2
    untagged = model_reading(drafted, upright_read(drafted.picture, SETTINGS, _read(MARKDOWN)), 100)
    assert "grounding" not in page_json(untagged, MARKDOWN, lambda block: None)


def test_a_region_output_drafts_the_page_without_its_tags():
    block = Block("p1-b1", BlockKind.TEXT, (0, 0, 10, 10), 0, "Name: Lea", 1.0, "pdf-text")
    region = region_result(block, _read(OUTPUT)(None), SETTINGS)
    assert region.text == MARKDOWN
    assert region_result(block, _read(OUTPUT)(None), replace(SETTINGS, grounding="none")).text == OUTPUT


def _blocks():
    rows = [(BlockKind.TITLE, "Quality improvement", 1), (BlockKind.TEXT, "Name: Lea Fischer, engineer.", 0)]
    rows += [(BlockKind.TEXT, f"Paragraph {n} says what the page holds and why it matters to the reader.", 0) for n in range(8)]
    return tuple(
        Block(f"p1-b{i}", kind, (60.0, 80.0 + 40 * i, 560.0, 110.0 + 40 * i), i, text, 1.0, "pdf-text", level=level)
        for i, (kind, text, level) in enumerate(rows)
    )


def test_drafts_carry_each_blocks_tag_with_its_box_on_the_page():
    blocks = _blocks()
    drafts = page_drafts(blocks, SETTINGS, page_size=(612.0, 792.0))
    assert drafts[0] == "<|ref|>title<|/ref|><|det|>[[98, 101, 914, 139]]<|/det|>\n# Quality improvement"
    assert drafts[1].startswith("<|ref|>text<|/ref|><|det|>[[98, 151, 914, 189]]<|/det|>\nName: Lea Fischer")
    assert page_drafts(blocks, replace(SETTINGS, grounding="none"), page_size=(612.0, 792.0))[0] == "# Quality improvement"


def test_tagged_drafts_keep_decoding_on_the_drafts_through_the_models_tags():
    """The model tags every block with boxes a few units off the draft's: drafts with tags are
    verified through the tags (their labels and brackets, and the text after the coordinates),
    where untagged drafts leave every tag to plain steps, or to the lookup of the tags the output
    already wrote (the oracle counts a lossless model's forwards)."""
    blocks = _blocks()

    def tag(block, box):
        label = "title" if block.kind is BlockKind.TITLE else "text"
        return f"<|ref|>{label}<|/ref|><|det|>[[{box[0]}, {box[1]}, {box[2]}, {box[3]}]]<|/det|>\n"

    untagged = page_drafts(blocks, SETTINGS)
    output = "\n\n".join(tag(b, (97, 100 + 50 * b.order, 915, 140 + 50 * b.order)) + text for b, text in zip(blocks, untagged))
    tokenizer = CharTokenizer()
    target = OracleTarget(tokenizer, {"page": tokenizer.encode(output) + [0]}, [0])
    config = DecodeConfig(max_new_tokens=len(output) + 8, repetition_guard=False)
    with_tags = page_drafts(blocks, SETTINGS, page_size=(612.0, 792.0))

    def forwards(drafts, proposer_config):
        request = DecodeRequest(None, "page", make_proposer(target, drafts, "tokens", proposer_config))
        return decode_batch(target, [request], config)[0].stats.forwards

    drafts_only = ProposerConfig(own_output=False)  # the output's own repeated tags left out
    assert forwards(with_tags, drafts_only) * 2 < forwards(untagged, drafts_only)
    assert forwards(with_tags, ProposerConfig()) < forwards(untagged, ProposerConfig())
