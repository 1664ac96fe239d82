"""Documents the tests make themselves: born-digital PDFs written by PyMuPDF and degraded scans."""

from __future__ import annotations

import codecs
import html
import io
import random
import string
from pathlib import Path

import pymupdf
from PIL import Image, ImageFilter

TITLE = "Annual Report on Garden Widgets"
SECTION = "Methods and Materials"
LEFT_COLUMN = (
    "The left column opens the report. Widgets were grown in twelve gardens across three regions "
    "during the spring season. Each garden received the same soil mixture and the same amount of water."
)
RIGHT_COLUMN = (
    "The right column continues the story. Growth was measured every week by two independent observers, "
    "and the results were compared at the end of the season."
)
LIST_ITEMS = ("Measure the height of every widget", "Count the leaves twice", "Record the weather daily")
TABLE_SECTION = "Results by Region"
TABLE_HEADER = ("Region", "Gardens", "Mean height")
TABLE_ROWS = (("North", "4", "12.5"), ("South", "5", "14.1"), ("West", "3", "9.8"))

_CSS = "body {font-family: sans-serif; font-size: 11pt;} td, th {border: 1px solid black; padding: 3px;}"


def known_text() -> str:
    """Every word the born-digital fixture puts on its pages, in reading order."""
    table = " ".join(" ".join(row) for row in (TABLE_HEADER, *TABLE_ROWS))
    return " ".join([TITLE, SECTION, LEFT_COLUMN, RIGHT_COLUMN, *LIST_ITEMS, TABLE_SECTION, table])


def born_digital_pdf(path: Path) -> Path:
    """Two pages: a title, a heading and two columns (the right one with a list); then a table."""
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    page.insert_htmlbox(pymupdf.Rect(50, 50, 545, 140), f"<h1>{TITLE}</h1><h2>{SECTION}</h2>", css=_CSS)
    page.insert_htmlbox(pymupdf.Rect(50, 150, 290, 700), f"<p>{LEFT_COLUMN}</p>", css=_CSS)
    items = "".join(f"<li>{item}</li>" for item in LIST_ITEMS)
    page.insert_htmlbox(pymupdf.Rect(305, 150, 545, 700), f"<p>{RIGHT_COLUMN}</p><ul>{items}</ul>", css=_CSS)
    page = doc.new_page(width=595, height=842)
    header = "".join(f"<th>{cell}</th>" for cell in TABLE_HEADER)
    rows = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in TABLE_ROWS)
    page.insert_htmlbox(
        pymupdf.Rect(50, 50, 545, 400),
        f"<h2>{TABLE_SECTION}</h2><table><tr>{header}</tr>{rows}</table>",
        css=_CSS,
    )
    doc.subset_fonts()
    doc.save(path, garbage=4, deflate=True)
    return path


def scanned_pdf(source: Path, path: Path, dpi: int = 200, seed: int = 7) -> Path:
    """Render the first page of `source`, blur it, add noise, skew it slightly: an image-only PDF."""
    page = pymupdf.open(source)[0]
    pixmap = page.get_pixmap(dpi=dpi, alpha=False)
    image = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples).convert("L")
    image = image.filter(ImageFilter.GaussianBlur(0.8)).rotate(0.7, fillcolor=255, resample=Image.BICUBIC)
    rng = random.Random(seed)
    noisy = image.point(lambda v: v)  # copy
    pixels = noisy.load()
    for _ in range(noisy.width * noisy.height // 50):
        x, y = rng.randrange(noisy.width), rng.randrange(noisy.height)
        pixels[x, y] = rng.choice((0, 255))
    buffer = io.BytesIO()
    noisy.save(buffer, format="JPEG", quality=70)
    doc = pymupdf.open()
    scan_page = doc.new_page(width=page.rect.width, height=page.rect.height)
    scan_page.insert_image(scan_page.rect, stream=buffer.getvalue())
    doc.save(path)
    return path


# Born-digital pages whose text layer and rendering disagree, as with a broken ToUnicode map: the
# page shows RENDERED_LINES while its font's ToUnicode map turns every letter into its ROT13 twin.
RENDERED_LINES = ("Harbour lanterns glow over quiet docks", "Fishermen mend their nets before dawn")
TEXT_LAYER_LINES = tuple(codecs.encode(line, "rot13") for line in RENDERED_LINES)


def _rot13_to_unicode_cmap() -> bytes:
    pairs = "".join(f"<{ord(c):02X}> <{ord(codecs.encode(c, 'rot13')):04X}>\n" for c in string.ascii_letters)
    return (
        "/CIDInit /ProcSet findresource begin 12 dict begin begincmap\n"
        "/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def\n"
        "/CMapName /Adobe-Identity-UCS def /CMapType 2 def\n"
        "1 begincodespacerange <00> <FF> endcodespacerange\n"
        f"{len(string.ascii_letters)} beginbfchar\n{pairs}endbfchar\n"
        "endcmap CMapName currentdict /CMap defineresource pop end end\n"
    ).encode()


def mismatched_text_layer_pdf(path: Path) -> Path:
    """Two such pages: the first holds only text (nothing an OCR-need analysis would flag), the
    second also a small grey picture."""
    doc = pymupdf.open()
    for with_picture in (False, True):
        page = doc.new_page(width=595, height=842)
        for index, line in enumerate(RENDERED_LINES):
            page.insert_text((72, 120 + 30 * index), line, fontsize=16, fontname="helv")
        if with_picture:
            picture = io.BytesIO()
            Image.new("RGB", (60, 40), (128, 128, 128)).save(picture, format="PNG")
            page.insert_image(pymupdf.Rect(72, 300, 192, 380), stream=picture.getvalue())
    cmap = doc.get_new_xref()
    doc.update_object(cmap, "<<>>")
    doc.update_stream(cmap, _rot13_to_unicode_cmap())
    for font_xref in {font[0] for page in doc for font in page.get_fonts()}:
        doc.xref_set_key(font_xref, "ToUnicode", f"{cmap} 0 R")
    doc.save(path)
    return path


# A one-column page of a physics paper set in a ruled grid (a column of equation numbers beside
# the paragraphs and display formulas), which table finders take for a table; below it a real
# small table.
RULED_TEXT_ROWS = (
    "We consider a scalar field coupled to a heat bath at temperature T and ask how quickly the field "
    "relaxes towards equilibrium when the coupling is weak.",
    "The equation of motion for the field amplitude follows from the Lagrangian density, and after "
    "averaging over the bath it takes the damped form",
    "d2phi/dt2 + gamma dphi/dt + dV/dphi = xi(t)",
    "where gamma is the damping rate set by the bath. For a harmonic potential the solution decays "
    "exponentially, and the relaxation time is the inverse of the rate.",
    "Comparing with the fluctuation dissipation relation we obtain the noise strength, which fixes the "
    "amplitude of thermal fluctuations at late times.",
    "<xi(t) xi(s)> = 2 gamma T delta(t - s)",
    "These results agree with the numerical simulations described in the next section, within the "
    "statistical errors of the ensemble.",
)
RULED_TEXT_FORMULAS = (2, 5)  # indices of the display formulas in RULED_TEXT_ROWS
SMALL_TABLE = (("Run", "Rate", "Time"), ("A", "0.12", "8.3"), ("B", "0.25", "4.0"), ("C", "0.50", "2.1"))


def ruled_text_page_pdf(path: Path) -> Path:
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    css = (
        "body {font-family: serif; font-size: 11pt;} table {border-collapse: collapse;} "
        "td {border: 1px solid black; padding: 6pt; text-align: justify;} td.formula {text-align: center;}"
    )
    rows, number = [], 0
    for index, text in enumerate(RULED_TEXT_ROWS):
        if index in RULED_TEXT_FORMULAS:
            number += 1
            rows.append(f"<tr><td class='formula'>{html.escape(text)}</td><td>({number})</td></tr>")
        else:
            rows.append(f"<tr><td>{html.escape(text)}</td><td></td></tr>")
    page.insert_htmlbox(pymupdf.Rect(60, 60, 535, 400), f"<table width='100%'>{''.join(rows)}</table>", css=css)
    small = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in SMALL_TABLE)
    page.insert_htmlbox(pymupdf.Rect(60, 450, 300, 600), f"<table>{small}</table>", css=css)
    doc.save(path)
    return path


def distinct_copies(source: Path, root: Path, count: int) -> Path:
    """`count` copies of `source` in `root` (doc0.pdf, doc1.pdf, ...), each with bytes of its own
    (a comment appended), so that the manifest tells them apart."""
    data = source.read_bytes()
    for n in range(count):
        (root / f"doc{n}.pdf").write_bytes(data + f"\n% copy {n}\n".encode())
    return root


def encrypted_pdf(source: Path, path: Path, password: str) -> Path:
    doc = pymupdf.open(source)
    doc.save(path, encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw=password, owner_pw=password + "-owner")
    return path


def truncated_pdf(source: Path, path: Path) -> Path:
    data = source.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def pageless_pdf(path: Path) -> Path:
    """A well-formed PDF whose page tree is empty (PyMuPDF refuses to save one, so write it)."""
    objects = [b"<</Type/Catalog/Pages 2 0 R>>", b"<</Type/Pages/Kids[]/Count 0>>"]
    body, offsets = b"%PDF-1.4\n", []
    for number, obj in enumerate(objects, start=1):
        offsets.append(len(body))
        body += b"%d 0 obj\n" % number + obj + b"\nendobj\n"
    xref = len(body)
    body += b"xref\n0 3\n0000000000 65535 f \n" + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    body += b"trailer\n<</Size 3/Root 1 0 R>>\nstartxref\n%d\n%%%%EOF\n" % xref
    path.write_bytes(body)
    return path


def half_node_profile(path: Path) -> Path:
    """A cost profile (JSON) on which every tree node costs half a plain row: trees pay only where
    drafts hold."""
    import json

    from hsd_cli.profiles import ForwardCost, PrefillCost, Profile

    forwards = tuple(ForwardCost(r, n, c, 0.01 * r * (1 + (n - 1) / 2)) for r in (1, 64) for n in (1, 64) for c in (16, 8192))
    prefills = (PrefillCost(100, 10, 0.05), PrefillCost(4000, 10, 0.05))
    path.write_text(json.dumps(Profile("half-node", "m", "d", "float32", "measured", forwards, prefills).to_json()))
    return path


def model_config(model: Path | str, **options):
    """The ModelConfig `hsd convert --model MODEL` with these options resolves to."""
    from hsd_cli.config import ConvertConfig
    from hsd_cli.serving.resolve import resolve_model

    return resolve_model(ConvertConfig(output_dir=Path("."), model=str(model), **options))


def resolved(config, model=None, run=None):
    """The ResolvedConfig a task of a run with these options carries (`model`: a ModelConfig)."""
    from hsd_cli.batch.resolve import resolve_schedule
    from hsd_cli.config import ResolvedConfig, RunConfig

    return ResolvedConfig(config.document, model, resolve_schedule(config, model, run or RunConfig(), None, []))
