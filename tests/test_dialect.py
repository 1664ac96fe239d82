"""Drafts in the model's dialect, and text layers repaired before they draft: each rule on a
hand-made block or page."""

from dataclasses import replace

import pymupdf
import pytest

from hsd_cli.bench.oracle import OracleTarget, simulate
from hsd_cli.decoding import DecodeConfig
from hsd_cli.models.settings import settings_for
from hsd_cli.records import Block, BlockKind
from hsd_cli.stages.dialect import block_drafts, page_drafts, paragraph_text, plain_text, table_forms
from hsd_cli.stages.draft.layout import layout_blocks
from hsd_cli.stages.draft.pdf_text import PdfTextDraft
from hsd_cli.stages.draft.rtl import ZWNJ, persian_orthography

SPANNING = (
    "<table><tr><th>#</th><th colspan=\"2\">Score</th></tr>"
    "<tr><td>1</td><td>0.87</td><td>0.20</td></tr><tr><td>2</td><td>0.88</td><td>0.40</td></tr></table>"
)
PIPE = "| # | Score |  |\n|---|---|---|\n| 1 | 0.87 | 0.20 |\n| 2 | 0.88 | 0.40 |"


def block(kind: BlockKind, text: str, html: str | None = None) -> Block:
    return Block(id="p1-b1", kind=kind, bbox=(0, 0, 100, 100), order=0, text=text, confidence=1.0, source="pdf-text", html=html)


def settings(**dialect):
    return replace(settings_for("default"), **dialect)


def test_a_table_is_drafted_in_each_form_the_family_may_write():
    table = block(BlockKind.TABLE, SPANNING, html=SPANNING)
    assert table_forms(table, "html") == [SPANNING], "HTML keeps the spans"
    assert table_forms(table, "pipe") == [PIPE], "a pipe table lists each row's cells, short rows padded"
    assert table_forms(table, "either") == [SPANNING, PIPE]


def test_a_pipe_table_without_html_gets_an_html_form():
    table = block(BlockKind.TABLE, "| a | b |\n|---|---|\n| 1 | x<y |")
    assert table_forms(table, "html") == ["<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>x&lt;y</td></tr></table>"]


def test_emphasis_marks_come_off_only_when_the_family_strips_them():
    text = "_Proof._ Let **S** be ***the*** set in my_file_name and 2*3*4, x<sup>2</sup>."
    assert plain_text(text, "strip") == "Proof. Let S be the set in my_file_name and 2*3*4, x2."
    assert plain_text(text, "keep") == "_Proof._ Let **S** be ***the*** set in my_file_name and 2*3*4, x2."


def test_paragraph_lines_are_joined_and_words_broken_at_line_ends_made_whole():
    wrapped = "the improv-\nement of Anglo-\nSaxon law\nin COVID-\n19 times"
    assert paragraph_text(wrapped, "joined") == "the improvement of Anglo-Saxon law in COVID-19 times"
    assert paragraph_text(wrapped, "kept") == wrapped


def test_list_items_keep_their_lines_and_page_furniture_drafts_nothing():
    blocks = (
        block(BlockKind.PAGE_HEADER, "Journal of Things, vol. 3"),
        block(BlockKind.TEXT, "A _wrapped_\nparagraph."),
        block(BlockKind.LIST, "- one\n- two"),
        block(BlockKind.TABLE, SPANNING, html=SPANNING),
    )
    assert page_drafts(blocks, settings(emphasis="strip")) == ["A wrapped paragraph.", "- one\n- two", SPANNING, PIPE]
    assert block_drafts(blocks[1], settings(emphasis="keep", line_breaks="kept")) == ["A _wrapped_\nparagraph."]


class CharTokenizer:
    """One token per character: enough for the oracle to count what a step accepts."""

    def encode(self, text, add_special_tokens=False):
        return [ord(ch) for ch in text]

    def decode(self, tokens, skip_special_tokens=True):
        return "".join(map(chr, tokens))


def test_decoding_follows_the_table_form_the_model_writes():
    """A model that writes pipe tables: drafting both forms takes the forwards a pipe-only draft
    takes, and far fewer than an HTML-only draft (the oracle counts a lossless model's forwards)."""
    rows = "".join(f"<tr><td>{i}</td><td>0.{i}5</td><td>0.{i}0</td></tr>" for i in range(1, 9))
    html = f"<table><tr><th>#</th><th colspan=\"2\">Score</th></tr>{rows}</table>"
    table = block(BlockKind.TABLE, html, html=html)
    output = table_forms(table, "pipe")[0]
    target = OracleTarget(CharTokenizer(), {"page": CharTokenizer().encode(output) + [0]}, [0])
    config = DecodeConfig(max_new_tokens=len(output) + 8)
    forwards = {
        form: simulate(target, "page", block_drafts(table, settings(table_format=form)), "tokens", config).forwards
        for form in ("html", "pipe", "either")
    }
    assert forwards["either"] <= forwards["pipe"] + 2
    assert forwards["either"] * 3 < forwards["html"]


@pytest.fixture(scope="module")
def figo():
    pytest.importorskip("pymupdf_fonts", reason="pip install pymupdf-fonts (the test extra)")
    return pymupdf.Font("figo")  # Fira Go: Latin and Arabic-script glyphs


def write_right_to_left(page, font, words: list[str], y: float, right: float = 500, size: float = 14):
    """Glyphs placed from the right edge leftwards and written into the file in visual order
    (left to right), as many RTL PDFs write them: logical order is in the positions only."""
    placed, x = [], right
    for word in words:
        for char in word:
            x -= font.text_length(char, size)
            placed.append((x, char))
        x -= font.text_length(" ", size) * 1.5
    writer = pymupdf.TextWriter(page.rect)
    for x, char in sorted(placed):
        writer.append((x, y), char, font=font, fontsize=size)
    writer.write_text(page)


def test_a_right_to_left_text_layer_drafts_in_logical_order(tmp_path, figo):
    # Persian as a text layer writes it: Arabic yeh, no non-joiners, words in visual order.
    line_one = "نظر به اهمیت و کاربرد شبکه هاي بي سیم".split()
    line_two = "در کتابخانه ها احساس مي شود".split()
    doc = pymupdf.open()
    page = doc.new_page()
    write_right_to_left(page, figo, line_one, y=100)
    write_right_to_left(page, figo, line_two, y=120)
    # The trap: the layout text reads the words in visual order, the line's last word first.
    assert layout_blocks(page, source="pdf-text")[0].text.split()[0] == line_one[-1]
    blocks = PdfTextDraft().blocks(page)
    text = " ".join(b.text for b in blocks)
    assert text.replace("\n", " ") == (
        f"نظر به اهمیت و کاربرد شبکه{ZWNJ}های بی سیم در کتابخانه{ZWNJ}ها احساس می{ZWNJ}شود"
    )


def test_arabic_keeps_its_own_letters():
    arabic = "في المكتبة الجامعية"  # no Persian letters: Arabic yeh and kaf stay
    assert persian_orthography(arabic) == arabic


def test_spacing_accents_of_tex_text_layers_compose_with_their_letters(figo):
    doc = pymupdf.open()
    page = doc.new_page()
    writer = pymupdf.TextWriter(page.rect)
    writer.append((72, 100), "We thank J´an Min´aˇc and Nguyˆen Duy Tˆan for the co\u00adoperation.", font=figo, fontsize=11)
    writer.write_text(page)
    text = " ".join(b.text for b in PdfTextDraft().blocks(page))
    assert "Ján Mináč and Nguyên Duy Tân for the cooperation." in text
