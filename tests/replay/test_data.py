"""Pairing outputs with pages, aligning blocks to the output text, and the prepared examples."""

from pathlib import Path

import pytest
from PIL import Image

from hsd_cli.recipes.registry import recipe_named
from hsd_cli.records.page import Page
from hsd_cli.replay.align import char_accuracy, edit_distance, locate
from hsd_cli.replay.dataset import load_examples, pair_pages, prepare, region_target
from hsd_cli.replay.model import FAMILY
from hsd_cli.stages.rasterize import crop_block
from tests import fixtures
from tests.replay.conftest import PAGE_OUTPUTS


def test_edit_distance_and_char_accuracy():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3 and edit_distance("abc", "abc") == 0
    assert char_accuracy("", "") == 1.0
    assert char_accuracy("abcd", "abXd") == pytest.approx(0.75)
    assert char_accuracy("", "abcd") == 0.0


def test_locate_widens_to_markup_but_not_into_other_text():
    output = "# Annual Report\n\nSome intro text here.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nThe end of it."
    title = locate("Annual Report", output)
    assert output[title.start : title.end] == "# Annual Report" and title.score == 1.0
    table = locate("<table><tr><td>a</td><td>b</td></tr><tr><td>1</td><td>2</td></tr></table>", output)
    assert output[table.start : table.end] == "| a | b |\n|---|---|\n| 1 | 2 |"
    partial = locate("Some intro", output)
    assert output[partial.start : partial.end] == "Some intro", "the rest of the line is other text"
    assert locate("completely unrelated words", output) is None
    assert locate("a", output) is None, "too short to place"


def test_locate_skips_html_tags_of_the_output():
    output = "<table><tr><td>North</td><td>4</td></tr></table>"
    span = locate("North 4", output)
    assert span is not None and output[span.start : span.end] == output


def test_region_target_is_empty_for_text_the_output_left_out():
    assert region_target("Page 7 of 12, confidential draft", "# Title\n\nBody text.") == ("", None)


def test_pair_pages_takes_lowest_repeat_and_matching_subfolder(tmp_path):
    inputs, outputs = tmp_path / "in", tmp_path / "out"
    (inputs / "cat").mkdir(parents=True)
    (outputs / "cat").mkdir(parents=True)
    for path in (inputs / "doc.pdf", inputs / "cat" / "doc.pdf", inputs / "scan_pg1.jpg"):
        path.write_bytes(b"%PDF-1.4\n")
    for name in ("doc_pg2_repeat2.md", "doc_pg2_repeat1.md", "scan_pg1.md", "orphan_pg1_repeat1.md", "cat/doc_pg1_repeat1.md"):
        (outputs / name).write_text("x")
    pairs, unmatched = pair_pages(outputs, inputs)
    found = {(p.document.relative_to(inputs).as_posix(), p.page_no, p.output.name) for p in pairs}
    assert found == {
        ("doc.pdf", 2, "doc_pg2_repeat1.md"),
        ("cat/doc.pdf", 1, "doc_pg1_repeat1.md"),
        ("scan_pg1.jpg", 1, "scan_pg1.md"),
    }
    assert unmatched == ["orphan_pg1_repeat1.md"]


def test_crop_block_pads_clips_and_drops_slivers():
    image = Page(page_no=1, size_pt=(144, 192), picture=Image.new("RGB", (300, 400), "white"), scale=150 / 72)
    crop = crop_block(image, (10.0, 20.5, 100.2, 60.0), 4)
    assert crop.size == (round(100.2 * 150 / 72) - round(10 * 150 / 72) + 8, round(60 * 150 / 72) - round(20.5 * 150 / 72) + 8)
    assert crop_block(image, (0.0, 0.0, 144.0, 192.0), 4).size == (300, 400), "clipped to the page"
    assert crop_block(image, (10.0, 20.0, 11.0, 21.0), 0) is None


def test_prepare_makes_page_and_aligned_crop_examples(replay_corpus, tmp_path):
    inputs, outputs = replay_corpus
    pairs, _ = pair_pages(outputs, inputs)
    examples, prints = prepare(pairs, inputs, tmp_path / "data", region_padding_px=4, recipe=recipe_named("", FAMILY))
    assert load_examples(tmp_path / "data") == examples
    pages = [e for e in examples if e.kind == "page"]
    assert [(e.source, e.page_no, e.target) for e in pages] == [
        ("report.pdf", 1, PAGE_OUTPUTS[0].strip()), ("report.pdf", 2, PAGE_OUTPUTS[1].strip())
    ]
    assert [(p.source, p.page_no) for p in prints] == [("report.pdf", 1), ("report.pdf", 2)]
    crops = {e.target for e in examples if e.kind == "crop"}
    assert f"# {fixtures.TITLE}" in crops, "a heading crop gets its Markdown line"
    assert fixtures.LEFT_COLUMN in crops
    table = next(e for e in examples if e.kind == "crop" and e.block_kind == "table")
    assert table.target.startswith("| Region | Gardens | Mean height |") and table.target.endswith("| West | 3 | 9.8 |")
    for example in examples:
        assert Path(tmp_path / "data" / example.image).is_file()
