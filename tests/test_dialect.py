"""Drafts in the model's dialect, and text layers repaired before they draft: each rule on a
hand-made block or page."""

from dataclasses import replace

import pymupdf
import pytest

from hsd_cli.bench.oracle import OracleTarget, simulate
from hsd_cli.decoding import DecodeConfig
from hsd_cli.models.family_settings import settings_for
from hsd_cli.output.json_doc import stats_json
from hsd_cli.records.kinds import Block, BlockKind
from hsd_cli.stages.dialect import (
    block_drafts, indented_html_table, page_drafts, paragraph_text, plain_text, primary_language, settled, split_front_matter,
    table_forms,
)
from hsd_cli.stages.draft.layout import layout_blocks
from hsd_cli.stages.draft.pdf_text import PdfTextDraft
from hsd_cli.stages.draft.rtl import ZWNJ, persian_orthography

SPANNING = (
    "<table><tr><th>#</th><th colspan=\"2\">Score</th></tr>"
    "<tr><td>1</td><td>0.87</td><td>0.20</td></tr><tr><td>2</td><td>0.88</td><td>0.40</td></tr></table>"
)
PIPE = "| # | Score |  |\n|---|---|---|\n| 1 | 0.87 | 0.20 |\n| 2 | 0.88 | 0.40 |"
INDENTED = [indented_html_table(SPANNING, rows, cells) for rows, cells in ((0, 2), (2, 4), (4, 8))]


def block(kind: BlockKind, text: str, html: str | None = None) -> Block:
    return Block(id="p1-b1", kind=kind, bbox=(0, 0, 100, 100), order=0, text=text, confidence=1.0, source="pdf-text", html=html)


def settings(**dialect):
    return replace(settings_for("default"), **dialect)


def test_a_table_is_drafted_in_each_form_the_family_may_write():
    table = block(BlockKind.TABLE, SPANNING, html=SPANNING)
    assert table_forms(table, "html", "compact") == [SPANNING], "HTML keeps the spans"
    assert table_forms(table, "pipe", "either") == [PIPE], "a pipe table lists each row's cells, short rows padded"
    assert table_forms(table, "either", "compact") == [SPANNING, PIPE]
    assert table_forms(table, "html", "indented") == INDENTED
    assert table_forms(table, "either", "either") == [SPANNING, *INDENTED, PIPE]


def test_an_indented_html_table_has_a_row_tag_or_cell_a_line():
    assert indented_html_table(SPANNING, 2, 4) == (
        "<table>\n"
        "  <tr>\n    <th>#</th>\n    <th colspan=\"2\">Score</th>\n  </tr>\n"
        "  <tr>\n    <td>1</td>\n    <td>0.87</td>\n    <td>0.20</td>\n  </tr>\n"
        "  <tr>\n    <td>2</td>\n    <td>0.88</td>\n    <td>0.40</td>\n  </tr>\n"
        "</table>"
    )
    assert indented_html_table(INDENTED[2], 0, 2) == INDENTED[0], "a laid out table is laid out again"


def test_a_pipe_table_without_html_gets_an_html_form():
    table = block(BlockKind.TABLE, "| a | b |\n|---|---|\n| 1 | x<y |")
    assert table_forms(table, "html", "compact") == ["<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>x&lt;y</td></tr></table>"]


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
    assert page_drafts(blocks, settings(emphasis="strip")) == ["A wrapped paragraph.", "- one\n- two", SPANNING, *INDENTED, PIPE]
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
    output = table_forms(table, "pipe", "compact")[0]
    target = OracleTarget(CharTokenizer(), {"page": CharTokenizer().encode(output) + [0]}, [0])
    config = DecodeConfig(max_new_tokens=len(output) + 8)
    forwards = {
        form: simulate(target, "page", block_drafts(table, settings(table_format=form)), "tokens", config).forwards
        for form in ("html", "pipe", "either")
    }
    assert forwards["either"] <= forwards["pipe"] + 2
    assert forwards["either"] * 3 < forwards["html"]


def test_decoding_follows_the_html_layout_the_model_writes():
    """A model that lays its HTML tables out a cell a line: drafting every layout takes about the
    forwards the model's own layout takes, and far fewer than the compact table alone."""
    rows = "".join(f"<tr><td>{i}</td><td>0.{i}5</td><td>0.{i}0</td></tr>" for i in range(1, 9))
    html = f"<table><tr><th>#</th><th colspan=\"2\">Score</th></tr>{rows}</table>"
    table = block(BlockKind.TABLE, html, html=html)
    output = indented_html_table(html, 2, 4)
    target = OracleTarget(CharTokenizer(), {"page": CharTokenizer().encode(output) + [0]}, [0])
    config = DecodeConfig(max_new_tokens=len(output) + 8)
    forwards = {
        layout: simulate(target, "page", block_drafts(table, settings(table_format="html", table_layout=layout)), "tokens", config).forwards
        for layout in ("compact", "indented", "either")
    }
    assert forwards["either"] <= forwards["indented"] + 2
    assert forwards["either"] * 3 < forwards["compact"]


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


@pytest.fixture(scope="module")
def noto():
    pytest.importorskip("pymupdf_fonts", reason="pip install pymupdf-fonts (the test extra)")
    return {"text": pymupdf.Font("notos"), "italic": pymupdf.Font("notosit"), "math": pymupdf.Font("math")}


def write_line(page, fonts, pieces, y: float, size: float = 11):
    """Pieces (text, font key, script) left to right on one baseline; `_`/`^` pieces set small,
    below or above it, as TeX sets sub- and superscripts."""
    writer = pymupdf.TextWriter(page.rect)
    x = 72.0
    for text, font, script in pieces:
        small = size * 0.7 if script else size
        rise = {"_": 2.5, "^": -4.0}.get(script, 0.0)
        writer.append((x, y + rise), text, font=fonts[font], fontsize=small)
        x += fonts[font].text_length(text, small)
    writer.write_text(page)


def test_inline_math_of_a_text_layer_is_written_as_latex_and_drafted_in_both_delimiters(noto):
    page = pymupdf.open().new_page()
    write_line(page, noto, [
        ("the spectrum of ", "text", ""), ("G", "italic", ""), ("R", "italic", "_"), ("(", "text", ""),
        ("D", "italic", ""), (") = ", "text", ""), ("Γ", "math", ""), ("(", "text", ""), ("R", "italic", ""),
        (", ", "text", ""), ("S", "italic", ""), (") is the multiset", "text", ""),
    ], y=100)
    write_line(page, noto, [
        ("{", "math", ""), ("λ", "math", ""), ("g", "italic", "_"), ("}", "math", ""), ("g", "italic", "_"),
        ("∈", "math", "_"), ("R", "italic", "_"), (" where ", "text", ""), ("u", "italic", ""), (" ∈ ", "math", ""),
        ("R", "italic", ""), ("×", "math", "^"), (" is a unit.", "text", ""),
    ], y=116)
    # The trap: the layout text has the math as loose letters.
    assert "\\(" not in " ".join(b.text for b in layout_blocks(page, source="pdf-text"))
    (text_block,) = PdfTextDraft().blocks(page)
    assert text_block.text == (
        "the spectrum of \\(G_R(D) = \\Gamma(R, S)\\) is the multiset\n"
        "\\(\\{\\lambda_g\\}_{g \\in R}\\) where \\(u \\in R^\\times\\) is a unit."
    )
    paren, dollar = block_drafts(text_block, settings(math_delimiters="either"))
    assert paren == text_block.text.replace("\n", " ")
    assert dollar.startswith("the spectrum of $G_R(D) = \\Gamma(R, S)$ is") and "$u \\in R^\\times$ is a unit." in dollar
    assert block_drafts(text_block, settings(math_delimiters="dollar")) == [dollar]
    assert block_drafts(text_block, settings(math_delimiters="paren")) == [paren]


def test_italic_letters_and_symbols_without_a_math_font_stay_as_they_are(noto):
    """Lists lettered in italics and a "≥" in a table of ages are no math: only a block with
    spans set in a math font is rewritten."""
    page = pymupdf.open().new_page()
    write_line(page, noto, [("Patients aged ≥ 65 in group ", "text", ""), ("b", "italic", ""), (" were excluded.", "text", "")], y=100)
    (text_block,) = PdfTextDraft().blocks(page)
    assert "\\(" not in text_block.text and "≥ 65" in text_block.text


def test_emphasis_stripping_leaves_subscripts_in_math_alone():
    text = "We _define_ \\(\\lambda_g = \\sum_{s \\in S} x_s\\) for _each_ g."
    assert plain_text(text, "strip") == "We define \\(\\lambda_g = \\sum_{s \\in S} x_s\\) for each g."


def test_headings_are_drafted_with_their_marks_bare_or_both():
    heading = replace(block(BlockKind.SECTION_HEADER, "2.1 Pretraining data"), level=3)
    assert block_drafts(heading, settings(headings="markdown")) == ["### 2.1 Pretraining data"]
    assert block_drafts(heading, settings(headings="plain")) == ["2.1 Pretraining data"]
    assert block_drafts(heading, settings(headings="either")) == ["### 2.1 Pretraining data", "2.1 Pretraining data"]


def test_a_documents_earlier_outputs_settle_the_forms_its_later_pages_draft():
    either = settings()
    assert (either.table_format, either.math_delimiters, either.headings) == ("either", "either", "either")
    html_page = "<table><tr><th>a</th></tr></table>\n\nThe fee is $5 and $6 a page."  # prices are no math
    assert (settled(either, [html_page]).table_format, settled(either, [html_page]).math_delimiters) == ("html", "either")
    later = settled(either, ["| a | b |\n|---|---|\n| 1 | 2 |", "# Intro\n\nLet \\(x_i\\) be"])
    assert (later.table_format, later.math_delimiters, later.headings) == ("pipe", "paren", "markdown")
    assert settled(either, ["Let $x_i$ and \\(y\\)."]).math_delimiters == "either"  # both seen: undecided
    assert settled(either, ["Let $\\lambda$ be"]).math_delimiters == "dollar"
    assert settled(settings(table_format="pipe"), [html_page]).table_format == "pipe"  # a family's own choice stays
    table = block(BlockKind.TABLE, PIPE, html=SPANNING)
    assert page_drafts((table,), settled(either, [html_page])) == [SPANNING]
    assert page_drafts((table,), either) == [SPANNING, *INDENTED, PIPE]
    assert settled(either, [html_page]).table_layout == "compact"
    assert settled(either, [INDENTED[1]]).table_layout == "indented"
    assert page_drafts((table,), settled(either, [INDENTED[1]])) == INDENTED
    assert settled(either, [html_page, INDENTED[1]]).table_layout == "either"  # both seen: undecided


def _tiny_model(tmp_path):
    from hsd_cli.models.tiny_families import build_tiny_random
    from hsd_cli.serving.model import VlmModel
    from tests.fixtures import model_config

    return VlmModel(model_config(build_tiny_random("qwen2_5_vl", tmp_path / "tiny"), dtype="float32", max_new_tokens=4))


def _blank_page():
    from hsd_cli.records.page import Page

    return Page(page_no=1, size_pt=(595, 842), picture=pymupdf.open().new_page().get_pixmap().pil_image(), scale=1.0)


def _vlm_page(model, page, blocks, earlier_outputs=()):
    """The VLM stages on a page whose draft is `blocks`, as the pipeline orders them (no region pass)."""
    from hsd_cli.config import Stages
    from hsd_cli.document.pipeline import DocumentSoFar, vlm_stage

    drafted = replace(page, blocks=blocks, backend="test", flags=("draft_only",))
    return vlm_stage(drafted, model, Stages.PAGE, DocumentSoFar(outputs=tuple(earlier_outputs)))


def test_the_page_stage_drafts_in_the_dialect_earlier_pages_settled_and_reports_it(tmp_path, monkeypatch):
    model, image = _tiny_model(tmp_path), _blank_page()
    table = block(BlockKind.TABLE, PIPE, html=SPANNING)
    seen_drafts = []
    real_decode = model.decode
    monkeypatch.setattr(
        model, "decode",
        lambda picture, prompt, drafts, near_lossless=None: seen_drafts.append(drafts) or real_decode(picture, prompt, drafts, near_lossless),
    )
    output = _vlm_page(model, image, (table,), ["|---|---|\n"])
    assert seen_drafts[0][2:] == [PIPE] and "is_table: True" in seen_drafts[0][0], "the family's front matter first"
    assert output.reading.dialect["table_format"] == "pipe"
    output = _vlm_page(model, image, (table,), ["<table><tr><td>1</td></tr></table>"])
    assert stats_json(output)["dialect"]["table_format"] == "html"
    assert _vlm_page(model, image, (table,)).reading.dialect["table_format"] == model.settings.table_format


OLMOCR_OUTPUT = (
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\n"
    "is_diagram: False\n---\nThe harvest came early.\n"
)


def test_olmocr_front_matter_is_drafted_with_the_pages_language_and_is_table_both_ways():
    prose = block(BlockKind.TEXT, "The harvest came early.")
    drafts = page_drafts((prose,), settings(front_matter="olmocr"))
    assert drafts[0] + drafts[2] == OLMOCR_OUTPUT.strip(), "the likelier form first, then the page text"
    assert "is_table: True" in drafts[1] and drafts[1].replace("True\nis_diagram", "False\nis_diagram") == drafts[0]
    table = block(BlockKind.TABLE, PIPE, html=SPANNING)
    assert "is_table: True" in page_drafts((table, prose), settings(front_matter="olmocr"))[0]
    assert page_drafts((prose,), settings(front_matter="none")) == ["The harvest came early."]
    assert settings_for("qwen2_5_vl").front_matter == "olmocr", "olmOCR's prompt asks for it"
    assert [primary_language(text) for text in ("", "12 34", "Ein Haus", "دانشگاه تهران", "جامعة القاهرة", "東京の大学", "北京大学", "Москва")] == [
        "null", "null", "en", "fa", "ar", "ja", "zh", "ru",
    ]


def test_an_outputs_front_matter_is_split_off_as_plain_values():
    fields, text = split_front_matter(OLMOCR_OUTPUT)
    assert text == "The harvest came early."
    assert fields == {"primary_language": "en", "is_rotation_valid": True, "rotation_correction": 0,
                      "is_table": False, "is_diagram": False}
    assert split_front_matter("---\nprimary_language: null\nis_table: 2024-01-02\n---") == ({"primary_language": None, "is_table": "2024-01-02"}, "")
    # A leading block that is not olmOCR's is the page's text (a form, another model's Markdown).
    for untouched in ("No front matter here.", "---\nprimary_language: en\nis_rot", "---\n[unclosed\n---\nText",
                      "---\n- a list\n---\nText", "---\nName: John Smith\n---\nText", "---\n{}\n---\nText",
                      "---\nprimary_language: en\ntitle: Report\n---\nText"):
        assert split_front_matter(untouched) == (None, untouched)


def test_the_page_stage_keeps_front_matter_out_of_the_pages_text_and_reports_it(tmp_path, monkeypatch):
    from hsd_cli.decoding import DecodeResult, DecodeStats

    model, image = _tiny_model(tmp_path), _blank_page()
    # The tiny random model writes no front matter: stand in an olmOCR output for its decoding.
    seen_drafts, outputs = [], [OLMOCR_OUTPUT, OLMOCR_OUTPUT.replace("en", "null").split("The")[0]]

    def olmocr_decode(image, prompt, drafts, near_lossless=None):
        seen_drafts.append(drafts)
        return DecodeResult(tokens=[1, 2], stats=DecodeStats(forwards=1, new_tokens=2), stop_reason="eos", text=outputs.pop(0))

    monkeypatch.setattr(model, "decode", olmocr_decode)
    output = _vlm_page(model, image, (block(BlockKind.TEXT, "The harvest came early."),))
    assert output.text == "The harvest came early."
    stats = stats_json(output)
    assert stats["front_matter"]["primary_language"] == "en" and stats["dialect"]["front_matter"] == "olmocr"
    assert seen_drafts[0][0].startswith("---\nprimary_language: en\n")
    blank = _vlm_page(model, image, ())  # olmOCR's blank page: front matter alone
    # An empty reading of a page without text is a reading: the page is written empty, unflagged.
    assert blank.text == "" and blank.flags == ("vlm",) and blank.notice is None
    assert blank.reading.front_matter["primary_language"] is None
    assert seen_drafts[1][0].startswith("---\nprimary_language: null\n")



def test_a_page_the_front_matter_calls_rotated_is_turned_and_read_again(tmp_path, monkeypatch):
    from hsd_cli.decoding import DecodeResult, DecodeStats

    model, image = _tiny_model(tmp_path), _blank_page()
    sideways = OLMOCR_OUTPUT.replace("is_rotation_valid: True\nrotation_correction: 0", "is_rotation_valid: False\nrotation_correction: 90")
    seen_sizes, outputs = [], [sideways.replace("The harvest", "Garbled"), OLMOCR_OUTPUT]

    def olmocr_decode(image, prompt, drafts, near_lossless=None):
        seen_sizes.append(image.size)
        return DecodeResult(tokens=[1, 2], stats=DecodeStats(forwards=5, new_tokens=2), stop_reason="eos", text=outputs.pop(0))

    monkeypatch.setattr(model, "decode", olmocr_decode)
    prose = (block(BlockKind.TEXT, "The harvest came early."),)
    output = _vlm_page(model, image, prose)
    assert output.text == "The harvest came early." and "rotated" in output.flags
    assert seen_sizes == [image.picture.size, image.picture.size[::-1]], "read again turned a quarter"
    assert stats_json(output)["rotation"] == {"degrees": 90, "reads": 2, "earlier_forwards": 5}
    outputs[:] = [sideways] * 5  # a model that never calls the page upright: four reads, the last one kept
    stuck = _vlm_page(model, image, prose)
    assert stats_json(stuck)["rotation"] == {"degrees": 270, "reads": 4, "earlier_forwards": 15} and len(outputs) == 1
    assert stuck.text == "The harvest came early." and "rotated" in stuck.flags
