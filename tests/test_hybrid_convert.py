"""Hybrid models (Qwen3.5's text model: Gated DeltaNet layers beside full attention; under Qwen3.5's
pictures, MiniCPM-OCR's 1-D ones and MiniCPM-V 4.7's canvas) through
`hsd convert --stages auto --baseline`: every page it reads equals transformers' `generate`. On the
hand-written GPU-like profile the planner packs report.pdf's regions with its page and reads the
scan's regions before its page, so rows prefilled apart join, commit trees and leave."""

import json

import pytest

from tests.conftest import run_hsd
from tests.test_output_identity import PROFILE


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_5", "minicpm_ocr", "minicpmv4_7"])
def test_every_page_a_hybrid_model_reads_equals_generate(family, docs_dir, tmp_path):
    from hsd_cli.models.tiny_families import build_tiny_random

    model = build_tiny_random(family, tmp_path / f"tiny_{family}")
    out = tmp_path / "out"
    result = run_hsd(
        "convert", docs_dir, "-o", out, "--model", model, "--stages", "auto", "--baseline", "--profile", PROFILE,
        "--device", "cpu", "--dtype", "float32", "--pages", "1", "--max-new-tokens", "60",
    )
    assert result.exit_code == 0, result.stderr
    ways = set()
    for document in ("report", "scan"):
        for page in json.loads((out / f"{document}.json").read_text())["pages"]:
            stats = page["stats"]
            assert stats["baseline"]["identical"] is True, (document, page["page"], stats["baseline"])
            ways.add(stats["plan"]["chosen"])
    assert ways == {"packed", "region-page"}, "both read paths with region passes"
