"""Page images cut short convert what decodes as `degraded`, with a warning; `corrupt` when nothing does."""

import io
import json
from pathlib import Path

import pymupdf
import pytest
from PIL import Image

from hsd_cli.stages.rasterize import DocumentError, open_document
from tests import fixtures
from tests.conftest import run_hsd


def _page_bytes(source: Path, fmt: str, **options) -> bytes:
    pixmap = pymupdf.open(source)[0].get_pixmap(dpi=100, alpha=False)
    image = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples).convert("L")
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def images(docs_dir, tmp_path_factory) -> Path:
    """A whole JPEG, and JPEG, PNG and (uncompressed, directory first) TIFF pages cut in half;
    a JPEG cut inside its header and a compressed TIFF that lost its directory (at the end)."""
    root = tmp_path_factory.mktemp("images")
    jpeg = _page_bytes(docs_dir / "report.pdf", "JPEG", quality=80)
    png = _page_bytes(docs_dir / "report.pdf", "PNG")
    tiff = _page_bytes(docs_dir / "report.pdf", "TIFF")
    packed_tiff = _page_bytes(docs_dir / "report.pdf", "TIFF", compression="tiff_deflate")
    (root / "whole.jpg").write_bytes(jpeg)
    (root / "half.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (root / "half.png").write_bytes(png[: len(png) // 2])
    (root / "half.tif").write_bytes(tiff[: len(tiff) // 2])
    (root / "header.jpg").write_bytes(jpeg[:100])
    (root / "nodirectory.tif").write_bytes(packed_tiff[: len(packed_tiff) // 2])
    return root


@pytest.mark.slow
def test_cut_images_are_degraded_or_corrupt_never_silently_ok(images, tmp_path):
    out = tmp_path / "out"
    result = run_hsd("convert", images, "-o", out, "--json")
    summary = json.loads(result.stdout)
    documents = {Path(d["input"]).name: d for d in summary["documents"]}
    assert {name: d["status"] for name, d in documents.items()} == {
        "half.jpg": "degraded",
        "half.png": "degraded",
        "half.tif": "degraded",
        "header.jpg": "corrupt",
        "nodirectory.tif": "corrupt",
        "whole.jpg": "ok",
    }
    assert result.exit_code == 1  # the corrupt ones
    assert documents["whole.jpg"]["warnings"] == []
    for name, kind in (("half.jpg", "JPEG"), ("half.png", "PNG"), ("half.tif", "TIFF")):
        assert any(f"damaged {kind}" in warning for warning in documents[name]["warnings"]), documents[name]
        assert [line for line in result.stderr.splitlines() if name in line and f"damaged {kind}" in line]
        outputs = documents[name]["outputs"]
        assert any(f"damaged {kind}" in warning for warning in json.loads(Path(outputs["json"]).read_text())["warnings"])
        assert fixtures.TITLE in Path(outputs["markdown"]).read_text(), "what decodes is converted"
    assert "no image data decodes" in documents["header.jpg"]["error"]
    assert "Traceback" not in result.stderr


def test_a_whole_image_opens_without_a_damage_note(images, monkeypatch):
    doc, damage = open_document(images / "whole.jpg", "jpeg", None)
    assert damage is None and doc.page_count == 1
    with pytest.raises(DocumentError):
        open_document(images / "header.jpg", "jpeg", None)
    # An image above PIL's size limit goes unchecked to MuPDF, as before the check existed.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    doc, damage = open_document(images / "whole.jpg", "jpeg", None)
    assert damage is None and doc.page_count == 1
