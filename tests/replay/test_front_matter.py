"""Front matter through `hsd convert`: only olmOCR's is split off a page's output. A replay model
built by the test recites two pages, one opening with a form's own `---` block, one with
olmOCR's front matter."""

import json

import pytest

from tests.conftest import run_hsd

from .two_pages import build_two_page_model

# It builds two-page replay models and converts with them: the slow tier.
pytestmark = pytest.mark.slow

FORM = "---\nName: John Smith\n---\n\nThe harvest came early."
OLMOCR = (
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\n"
    "is_diagram: False\n---\nDelta epsilon zeta."
)


def test_only_olmocr_front_matter_is_split_off_the_markdown(tmp_path):
    record, _ = build_two_page_model(tmp_path, ("Name: John Smith", "Delta epsilon zeta."), (FORM, OLMOCR), max_steps=400)
    assert record["training"]["stop_reason"] == "done", "the model must recite both pages"

    converted = run_hsd(
        "convert", tmp_path / "in", "-o", tmp_path / "converted", "--model", tmp_path / "model", "--stages", "page",
        "--dtype", "float32", "--json",
    )
    assert converted.exit_code == 0, converted.stderr
    form, olmocr = json.loads((tmp_path / "converted" / "pages.json").read_text())["pages"]
    assert form["markdown"] == FORM and "front_matter" not in form["stats"], "a form's block is the page's text"
    assert olmocr["markdown"] == "Delta epsilon zeta."
    assert olmocr["stats"]["front_matter"] == {
        "primary_language": "en", "is_rotation_valid": True, "rotation_correction": 0, "is_table": False, "is_diagram": False,
    }
