"""The draft stage on fixtures with known text: accuracy, reading order, tables, backends."""

import json
import unicodedata

import pymupdf
import pytest

from hsd_cli.config import ConvertConfig, DraftBackendName
from hsd_cli.eval.table_grids import html_table
from hsd_cli.records.kinds import BlockKind
from hsd_cli.stages.draft import AutoDraft, draft_page, make_draft_backend
from hsd_cli.stages.draft.paddle import PaddleJsonDraft
from hsd_cli.stages.draft.table_text import (
    html_table_cells,
    is_plausible_table,
    pipe_table,
    pipe_table_cells,
    table_block_text,
)
from tests import fixtures
from tests.text_metrics import cer, plain


def _draft_document(path, backend_name, tmp_path):
    backend = make_draft_backend(ConvertConfig(output_dir=tmp_path, draft_backend=backend_name), path.stem)
    with pymupdf.open(path) as doc:
        return [draft_page(backend, page) for page in doc]


def _markdown(converted, name):
    return (converted["out"] / f"{name}.md").read_text()


def test_born_digital_text_is_within_one_percent_cer(converted):
    assert cer(_markdown(converted, "report"), fixtures.known_text()) <= 0.01


def test_synthetic_scan_is_within_five_percent_cer(converted):
    page_one = fixtures.known_text().split(fixtures.TABLE_SECTION)[0]
    assert cer(_markdown(converted, "scan"), page_one) <= 0.05


def test_auto_picks_text_layer_or_ocr_per_page(converted):
    documents = {d["input"].rsplit("/", 1)[-1]: d for d in converted["summary"]["documents"]}
    assert documents["report.pdf"]["draft_backends"] == {"pdf-text": 2}
    assert documents["scan.pdf"]["draft_backends"] == {"ocr": 1}


def test_two_columns_are_read_left_then_right(converted):
    text = plain(_markdown(converted, "report"))
    left, right = text.find(fixtures.LEFT_COLUMN), text.find(fixtures.RIGHT_COLUMN)
    assert 0 <= left < right, "each column must appear whole, the left one first"


def test_headings_list_and_table_are_typed(converted):
    document = json.loads((converted["out"] / "report.json").read_text())
    blocks = [b for page in document["pages"] for b in page["blocks"]]
    kinds = {b["kind"] for b in blocks}
    assert {"section_header", "text", "list", "table"} <= kinds
    headings = [b["text"] for b in blocks if b["kind"] in ("title", "section_header")]
    assert fixtures.TITLE in headings and fixtures.SECTION in headings
    assert [b["text"] for b in blocks if b["kind"] == "list"] == [f"- {item}" for item in fixtures.LIST_ITEMS]


def test_table_cells_come_out_as_a_grid(converted):
    document = json.loads((converted["out"] / "report.json").read_text())
    (table,) = [b for page in document["pages"] for b in page["blocks"] if b["kind"] == "table"]
    rows, spans = html_table_cells(table["html"])
    assert rows == [list(fixtures.TABLE_HEADER), *map(list, fixtures.TABLE_ROWS)]
    assert not spans
    assert table["text"].splitlines()[0] == "| Region | Gardens | Mean height |"


def test_blocks_carry_ids_bboxes_order_and_source(converted):
    document = json.loads((converted["out"] / "scan.json").read_text())
    page = document["pages"][0]
    assert (page["unit"], page["origin"]) == ("pt", "top-left")
    for order, block in enumerate(page["blocks"]):
        x0, y0, x1, y1 = block["bbox"]
        assert 0 <= x0 < x1 <= page["width"] and 0 <= y0 < y1 <= page["height"]
        assert block["order"] == order and block["source"] == "ocr"
        assert 0.5 < block["confidence"] <= 1.0


def test_text_layer_backend_finds_nothing_on_a_scan_but_ocr_does(docs_dir, tmp_path):
    (text_page,) = _draft_document(docs_dir / "scan.pdf", DraftBackendName.PDF_TEXT, tmp_path)
    (ocr_page,) = _draft_document(docs_dir / "scan.pdf", DraftBackendName.OCR, tmp_path)
    assert "".join(b.text for b in text_page.blocks if b.kind is not BlockKind.FIGURE) == ""
    assert fixtures.TITLE in " ".join(b.text for b in ocr_page.blocks)


def test_auto_backend_is_the_default(tmp_path):
    assert isinstance(make_draft_backend(ConvertConfig(output_dir=tmp_path), "x"), AutoDraft)


def test_spanning_tables_stay_html_simple_ones_become_pipe_tables():
    spanning = "<table><tr><th colspan='2'>Both</th></tr><tr><td>a</td><td>b</td></tr></table>"
    text, html = table_block_text(spanning, "")
    assert text == spanning and html == spanning
    simple = "<table><tr><th>A</th><th>B</th></tr><tr><td>1</td><td>x|y</td></tr></table>"
    text, _ = table_block_text(simple, "")
    assert text == "| A | B |\n|---|---|\n| 1 | x\\|y |"


def test_drafts_and_scorers_read_an_html_table_alike_but_for_spans_that_do_not_parse():
    # One parser (hsd_cli.html_tables): a cell before any <tr> opens a row for both.
    rowless = "<table><td>a</td><td>b<br>c</td></table>"
    assert html_table_cells(rowless) == ([["a", "b c"]], False)
    assert [(c.row, c.col, c.text) for c in html_table(rowless).cells] == [(0, 0, "a"), (0, 1, "b c")]
    # A declared span that does not parse keeps the draft's table HTML; the scorers count it as 1.
    odd = '<table><tr><td colspan="0">a</td><td>b</td></tr></table>'
    assert table_block_text(odd, "") == (odd, odd)
    assert [(c.col, c.col_span) for c in html_table(odd).cells] == [(0, 1), (1, 1)]
    # A marked section Python 3.11's parser asserts on ends the table there, as an error would not.
    assert html_table_cells("<table><tr><td>a</td></tr><![x <tr><td>b</td></tr></table>")[0] == [["a"]]


def test_pp_structure_results_are_read_and_scaled_to_points(docs_dir, tmp_path):
    result = {
        "page_index": 0,
        "parsing_res_list": [
            {"block_label": "doc_title", "block_content": "A Title", "block_bbox": [144, 144, 720, 216]},
            {"block_label": "text", "block_content": "Body text.", "block_bbox": [144, 288, 1008, 432]},
            {
                "block_label": "table",
                "block_content": "<html><body><table><tr><td>1</td><td>2</td></tr></table></body></html>",
                "block_bbox": [144, 500, 1008, 700],
            },
            {"block_label": "number", "block_content": "7", "block_bbox": [500, 1600, 520, 1620]},
        ],
    }
    (tmp_path / "report_0_res.json").write_text(json.dumps({"res": result}))
    backend = PaddleJsonDraft(tmp_path, "report")
    with pymupdf.open(docs_dir / "report.pdf") as doc:
        blocks = backend.blocks(doc[0])
        with pytest.raises(FileNotFoundError):
            backend.blocks(doc[1])
    assert [b.kind for b in blocks] == [BlockKind.TITLE, BlockKind.TEXT, BlockKind.TABLE, BlockKind.PAGE_FOOTER]
    assert blocks[0].bbox == (72.0, 72.0, 360.0, 108.0)  # 144 dpi pixels -> points
    assert blocks[2].text == "| 1 | 2 |\n|---|---|"
    assert all(b.source == "paddleocr-json" for b in blocks)


def test_auto_falls_back_to_ocr_when_the_text_layer_is_empty(docs_dir, monkeypatch):
    """An image page that PyMuPDF's analysis calls text-only must not come out empty."""
    import hsd_cli.stages.draft as draft_module
    from hsd_cli.stages.draft.ocr import OcrDraft
    from hsd_cli.stages.draft.pdf_text import PdfTextDraft

    monkeypatch.setattr(draft_module, "analyze_page", lambda page: {"needs_ocr": False})
    with pymupdf.open(docs_dir / "scan.pdf") as doc:
        result = draft_page(AutoDraft(PdfTextDraft(), OcrDraft(150, 4_194_304, keep_text_layer=True)), doc[0])
    assert result.backend == "ocr"
    assert fixtures.TITLE in " ".join(b.text for b in result.blocks)


def _words(text: str) -> set[str]:
    return set(plain(text).lower().replace(".", " ").split())


def _block_words(blocks) -> set[str]:
    return _words(" ".join(b.text for b in blocks))


@pytest.fixture(scope="module")
def mismatched_pdf(tmp_path_factory):
    return fixtures.mismatched_text_layer_pdf(tmp_path_factory.mktemp("mismatch") / "mismatch.pdf")


@pytest.fixture(scope="module")
def mismatched_ocr_pages(mismatched_pdf, tmp_path_factory):
    return _draft_document(mismatched_pdf, DraftBackendName.OCR, tmp_path_factory.mktemp("ocr-out"))


RENDERED_WORDS = _words(" ".join(fixtures.RENDERED_LINES))
TEXT_LAYER_WORDS = _words(" ".join(fixtures.TEXT_LAYER_LINES))


@pytest.mark.parametrize("page_index", [0, 1], ids=["text-only page", "page with a picture"])
def test_ocr_backend_reads_the_rendering_not_the_text_layer(mismatched_ocr_pages, page_index):
    """`--draft ocr` OCRs every page, born-digital ones too, and keeps none of the text layer."""
    page = mismatched_ocr_pages[page_index]
    words = _block_words(page.blocks)
    assert page.backend == "ocr"
    assert len(words & RENDERED_WORDS) >= 0.8 * len(RENDERED_WORDS), words
    assert not words & (TEXT_LAYER_WORDS - RENDERED_WORDS), words
    assert all(b.source == "ocr" for b in page.blocks)
    assert all(b.confidence is not None for b in page.blocks if b.kind is not BlockKind.FIGURE)


@pytest.mark.parametrize("backend", [DraftBackendName.PDF_TEXT, DraftBackendName.AUTO])
def test_text_layer_backends_read_the_text_layer_not_the_rendering(mismatched_pdf, tmp_path, backend):
    """`pdf-text` reads only the text layer; `auto` keeps it too where PyMuPDF's analysis finds
    the text layer usable (as documented), so it does not OCR these pages."""
    for page in _draft_document(mismatched_pdf, backend, tmp_path):
        words = _block_words(page.blocks)
        assert page.backend == "pdf-text"
        assert len(words & TEXT_LAYER_WORDS) >= 0.8 * len(TEXT_LAYER_WORDS), words
        assert not words & (RENDERED_WORDS - TEXT_LAYER_WORDS), words


def test_auto_ocr_keeps_the_legible_text_layer(mismatched_pdf, tmp_path, monkeypatch):
    """Where PyMuPDF's analysis asks for OCR, `auto` OCRs what the text layer does not cover and
    keeps the legible text it has, unlike `--draft ocr`."""
    import hsd_cli.stages.draft as draft_module

    monkeypatch.setattr(draft_module, "analyze_page", lambda page: {"needs_ocr": True})
    page = _draft_document(mismatched_pdf, DraftBackendName.AUTO, tmp_path)[1]
    assert page.backend == "ocr"
    assert len(_block_words(page.blocks) & TEXT_LAYER_WORDS) >= 0.8 * len(TEXT_LAYER_WORDS)


@pytest.fixture(scope="module")
def ruled_pdf(tmp_path_factory):
    return fixtures.ruled_text_page_pdf(tmp_path_factory.mktemp("ruled") / "ruled.pdf")


def _ruled_text_reference() -> str:
    """The ruled page's text in reading order, each formula followed by its number."""
    parts, number = [], 0
    for index, row in enumerate(fixtures.RULED_TEXT_ROWS):
        parts.append(row)
        if index in fixtures.RULED_TEXT_FORMULAS:
            number += 1
            parts.append(f"({number})")
    return " ".join(parts)


@pytest.mark.parametrize("backend", [DraftBackendName.PDF_TEXT, DraftBackendName.OCR])
def test_a_ruled_page_of_paragraphs_and_formulas_is_text_while_a_small_table_stays_a_table(
    ruled_pdf, tmp_path, backend
):
    """Both finders take the ruled box of paragraphs for a table; it must come out as text, whole
    and in reading order, from the text layer and from the image alike."""
    (page,) = _draft_document(ruled_pdf, backend, tmp_path)
    (table,) = [b for b in page.blocks if b.kind is BlockKind.TABLE]
    assert html_table_cells(table.html)[0] == [list(row) for row in fixtures.SMALL_TABLE]
    text = " ".join(b.text for b in page.blocks if b.kind is not BlockKind.TABLE)
    assert cer(unicodedata.normalize("NFKC", text), _ruled_text_reference()) <= 0.02


def test_a_one_column_table_from_pp_structure_is_text(docs_dir, tmp_path):
    """Every draft source passes the same rule: a page-long one-column 'table' of formulas and
    sentences read from an image becomes one text block, its rows in order."""
    rows = ["E = m c^2", "p = h / lambda", "The two relations combine into the de Broglie wavelength."]
    table = "<table>" + "".join(f"<tr><td>{row}</td></tr>" for row in rows) + "</table>"
    result = {"parsing_res_list": [{"block_label": "table", "block_content": table, "block_bbox": [100, 100, 1000, 1500]}]}
    (tmp_path / "report_0_res.json").write_text(json.dumps(result))
    with pymupdf.open(docs_dir / "report.pdf") as doc:
        (block,) = draft_page(PaddleJsonDraft(tmp_path, "report"), doc[0]).blocks
    assert (block.kind, block.text, block.html) == (BlockKind.TEXT, "\n".join(rows), None)


@pytest.mark.parametrize(
    ("rows", "area_share", "plausible"),
    [
        ([["Run", "Rate", "Time"], ["A", "0.12", "8.3"], ["B", "0.25", "4.0"], ["C", "0.50", "2.1"]], 0.05, True),
        ([["Run", "Rate", "Time"], ["A", "0.12", "8.3"]], 0.8, True),  # a page-sized table of three columns
        ([["x = 1"], ["y = 2"], ["z = 3"]], 0.1, False),  # one column
        ([["Run", ""], ["", "0.12"], ["B", ""]], 0.1, True),  # two columns hold text, however sparse
        ([["", "Run"], ["", "A"]], 0.1, False),  # the other columns are empty
        ([["Name", "Value"], ["alpha", "1"], ["beta", "2"]], 0.7, False),  # two columns over most of the page
        ([["Name", "Value"], ["alpha", "1"], ["beta", "2"]], 0.3, True),
        ([["Term", "Meaning"], ["gain", "the ratio of the output power to the input power of the stage"]], 0.2, True),
        (
            [
                ["we consider a scalar field coupled to a heat bath at temperature T", "(1)"],
                ["the equation of motion for the field amplitude follows from the Lagrangian", ""],
            ],
            0.2,
            False,  # most cells are sentences
        ),
    ],
)
def test_table_plausibility_rule(rows, area_share, plausible):
    assert is_plausible_table(rows, area_share) is plausible


def test_pipe_table_text_parses_back_to_its_cells():
    rows = [["A", "B"], ["1", "x|y"], ["", "z"]]
    assert pipe_table_cells(pipe_table(rows)) == rows
