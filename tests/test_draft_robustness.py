"""Pages that MuPDF renders but whose own content breaks reading them (issue 31): the draft reads
them anyway, from OCR of the rendering where reading raises, and says why it is degraded."""

import json
import os
import random
import subprocess
import sys
import time

import pymupdf
import pytest
from pymupdf4llm.helpers.utils import analyze_page
from rapidfuzz import fuzz

from hsd_cli.config import ConvertConfig, DraftBackendName
from hsd_cli.stages.draft import draft_page, layout, make_draft_backend
from tests.text_metrics import plain

UNKNOWN_FORMAT_SENTENCE = "Harbour lanterns glow over quiet docks."
WIDE_IMAGE_SENTENCE = "Fishermen mend their nets before dawn."
SHEET_SENTENCE = "Elevation of the north wing, sheet four."
SHEET_PATHS = 40_000
FILLER = (
    "The survey counted every boat in the bay twice, once at low tide and once at high tide, "
    "and wrote the numbers in the ledger kept at the harbour office."
)


def _page_with_an_image(sentence: str) -> tuple[pymupdf.Document, int]:
    """Two letter pages, the second with a paragraph holding the sentence (body text, which the
    Markdown keeps) and a small grey image below it; and the image's xref."""
    doc = pymupdf.open()
    doc.new_page().insert_textbox(pymupdf.Rect(72, 180, 540, 300), FILLER, fontsize=12)
    page = doc.new_page()
    page.insert_textbox(pymupdf.Rect(72, 180, 540, 300), f"{sentence} {FILLER}", fontsize=12)
    grey = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 64, 64))
    grey.clear_with(160)
    return doc, page.insert_image(pymupdf.Rect(72, 320, 272, 520), pixmap=grey)


def unknown_format_image_pdf(path):
    """The image claims to be a JPEG and holds no image at all: MuPDF renders the page (with a
    warning about the image), pymupdf4llm's page analysis raises FzErrorFormat "unknown image file
    format" on the bytes text extraction hands it as the image."""
    doc, xref = _page_with_an_image(UNKNOWN_FORMAT_SENTENCE)
    doc.update_stream(xref, b"no image here " * 40, compress=False)
    doc.xref_set_key(xref, "Filter", "/DCTDecode")
    doc.xref_set_key(xref, "DecodeParms", "null")
    doc.save(path)
    return path


def overly_wide_image_pdf(path):
    """The image claims 800 million pixels a row. Decoding it throws MuPDF's "Overly wide image".
    Rendering swallows that, leaving out the image and whatever the content stream draws after it
    (the paragraph comes before); text extraction hands the image on empty, and the page's analysis
    raises "bad image data" on it. Extractions that decode images themselves (XHTML, say) raise
    "Overly wide image"; the draft's layout asks for none of them."""
    doc, xref = _page_with_an_image(WIDE_IMAGE_SENTENCE)
    doc.xref_set_key(xref, "Width", "800000000")
    doc.save(path)
    return path


def vector_sheet_pdf(path):
    """A 24 x 36 inch sheet: the sentence, then 40,000 short stroked lines scattered over it."""
    doc = pymupdf.open()
    page = doc.new_page(width=24 * 72, height=36 * 72)
    page.insert_text((72, 100), SHEET_SENTENCE, fontsize=24)
    scatter = random.Random(31)
    lines = []
    for _ in range(SHEET_PATHS):
        x, y = scatter.uniform(72, 1656), scatter.uniform(72, 2448)
        dx, dy = scatter.uniform(-20, 20), scatter.uniform(-20, 20)
        lines.append(f"{x:.1f} {y:.1f} m {x + dx:.1f} {y + dy:.1f} l S")
    # Written as content-stream operators, each line its own path: Shape takes 7 s to draw as many.
    (contents,) = page.get_contents()
    doc.update_stream(contents, doc.xref_stream(contents) + "\n".join(["", *lines, ""]).encode())
    doc.save(path)
    return path


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    root = tmp_path_factory.mktemp("broken")
    return {
        "unknown-format": unknown_format_image_pdf(root / "unknown-format.pdf"),
        "overly-wide": overly_wide_image_pdf(root / "overly-wide.pdf"),
        "sheet": vector_sheet_pdf(root / "sheet.pdf"),
    }


SENTENCES = {"unknown-format": UNKNOWN_FORMAT_SENTENCE, "overly-wide": WIDE_IMAGE_SENTENCE}


def _draft(path, tmp_path, backend=DraftBackendName.AUTO):
    """The draft of the document's last page, and how many vector paths that page has after it."""
    config = ConvertConfig(output_dir=tmp_path, draft_backend=backend)
    with pymupdf.open(path) as doc:
        draft = draft_page(make_draft_backend(config, path.stem), doc[-1])
        return draft, len(doc[-1].get_cdrawings())


def _reads(sentence: str, text: str) -> bool:
    """The sentence is in the text, give or take an OCR slip."""
    return fuzz.partial_ratio(sentence, plain(text)) >= 90


def _text(draft) -> str:
    return " ".join(block.text for block in draft.blocks)


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("unknown-format", "FzErrorFormat: unknown image file format"),  # MuPDF's "code=7: " left out
        ("overly-wide", "ValueError: bad image data"),
    ],
)
def test_auto_reads_a_page_whose_analysis_raises_from_ocr_of_its_rendering(broken, tmp_path, name, error):
    with pymupdf.open(broken[name]) as doc:
        doc[-1].get_pixmap()  # it renders ...
        with pytest.raises(Exception, match=error.split(": ")[1]):
            analyze_page(doc[-1])  # ... and the analysis `auto` starts with raises
    draft, _ = _draft(broken[name], tmp_path)
    assert draft.backend == "ocr"
    assert draft.notice == f"text layer unreadable ({error}); OCR of the rendering" and "degraded" in draft.flags
    assert _reads(SENTENCES[name], _text(draft))
    assert draft.blocks and all(block.id.startswith("p2-b") for block in draft.blocks)


@pytest.mark.parametrize("backend", [DraftBackendName.PDF_TEXT, DraftBackendName.OCR])
@pytest.mark.parametrize("name", ["unknown-format", "overly-wide"])
def test_text_layer_and_ocr_backends_read_the_broken_image_pages_as_they_are(broken, tmp_path, name, backend):
    draft, _ = _draft(broken[name], tmp_path, backend)
    assert (draft.backend, draft.notice, draft.flags) == (backend.value, None, ("draft_only",))
    assert _reads(SENTENCES[name], _text(draft))


def test_pdf_text_falls_back_to_ocr_where_the_layout_raises(broken, tmp_path, monkeypatch):
    """No PDF we could build makes this layout raise (it decodes no image itself); the XHTML
    extraction the layout is made to start with here does, on the overly wide image, with MuPDF's
    own "Overly wide image"."""
    parse_document = layout.document_layout.parse_document

    def parse_after_xhtml(doc, **options):
        doc[options["pages"][0]].get_text("xhtml")
        return parse_document(doc, **options)

    monkeypatch.setattr(layout.document_layout, "parse_document", parse_after_xhtml)
    draft, _ = _draft(broken["overly-wide"], tmp_path, DraftBackendName.PDF_TEXT)
    assert draft.backend == "ocr"
    assert draft.notice == "text layer unreadable (FzErrorLimit: Overly wide image); OCR of the rendering"
    assert _reads(WIDE_IMAGE_SENTENCE, _text(draft))


def test_a_sheet_of_forty_thousand_paths_drafts_in_seconds(broken, tmp_path):
    started = time.perf_counter()
    draft, drawings_left = _draft(broken["sheet"], tmp_path)
    assert time.perf_counter() - started < 20  # 90 s before the layout left the paths out
    assert draft.backend == "pdf-text" and _reads(SHEET_SENTENCE, _text(draft))
    assert draft.notice.startswith(f"{SHEET_PATHS:,} vector drawings, over the {layout.MAX_LAYOUT_DRAWINGS:,}")
    assert drawings_left == SHEET_PATHS  # the layout read a copy: the page itself stays whole


def test_convert_writes_the_page_whose_analysis_raises(broken, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "hsd_cli.cli", "convert", str(broken["unknown-format"]), "-o", str(tmp_path),
         "--stages", "draft", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (document,) = json.loads(proc.stdout)["documents"]
    assert document["status"] == "degraded"
    assert _reads(UNKNOWN_FORMAT_SENTENCE, (tmp_path / "unknown-format.md").read_text())
    page = json.loads((tmp_path / "unknown-format.json").read_text())["pages"][1]
    line = "text layer unreadable (FzErrorFormat: unknown image file format); OCR of the rendering"
    assert page["flags"] == ["draft_only", "degraded"] and page["notice"] == line
    assert f"unknown-format.pdf: page 2: {line}" in proc.stderr
