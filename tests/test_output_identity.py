"""Byte identity of what `hsd convert` writes: each run's `<name>.md` and `<name>.json`, compared
with goldens in tests/data/golden/ that the code before the page-records refactor wrote (issue 32,
item 6: a refactor of the page records must not change a byte of the outputs).

The runs, on the fixtures the session builds (tests/fixtures.py: report.pdf, born-digital, and
scan.pdf, its degraded scan):
- draft: no model, default stages, both documents (the scan is OCR'd);
- auto-profile: the tiny random model on page 1 of both, `--stages auto --baseline`, planned on the
  hand-written cost profile tests/data/golden/profile.json (a memory-bound, GPU-like device), on
  which the planner takes packed decoding for report.pdf and region-page for the scan: both VLM
  paths with region passes, so no run forces them (each run costs a worker and a model load).
The manifest is not compared: it holds timings. In the JSON, the few values that differ from run to
run are replaced by placeholders (`run_specific_values` says why each differs); everything else is
compared as written, hsd_version included (a release regenerates the goldens).

Another machine may do float math differently. The born-digital draft (draft/report) never skips:
its text and boxes come from the text layer, and the layout model's decisions on its clean pages
are far from ties (measured: class probabilities apart by 0.79 or more, edge probabilities 0.12 or
more from their threshold). OCR (onnxruntime) and the tiny random model (fp32, greedy argmax) can
come out otherwise on another CPU, and then the goldens do not apply: those tests skip instead of
failing. Each skip is decided by a probe of the engine alone (probe-*.json: the OCR engine's lines
on the scan, the tiny model's plain `generate` tokens on each document's page 1), never by the
outputs under test, so that a regression cannot pass for a skip. The region passes read crops the
probe does not read: a flip confined to them would fail, not skip.

To write the goldens and probes instead of comparing (the tests then skip), after a change meant
to change the outputs, and review the diff (profile.json is hand-written and stays):
    HSD_REGENERATE_GOLDEN=1 python -m pytest tests/test_output_identity.py
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from pathlib import Path

import pymupdf
import pytest
from PIL import Image

from tests.conftest import run_hsd

GOLDEN = Path(__file__).parent / "data" / "golden"
PROFILE = GOLDEN / "profile.json"
REGENERATE = os.environ.get("HSD_REGENERATE_GOLDEN") == "1"
DPI = 150  # hsd convert's default: the probes see the pages as the conversions do
MAX_NEW_TOKENS = 40


def page_picture(pdf: Path) -> Image.Image:
    """Page 1 rendered at DPI, as hsd's rasterizer and OCR render it (no --max-pixels cap at A4)."""
    with pymupdf.open(pdf) as doc:
        pixmap = doc[0].get_pixmap(matrix=pymupdf.Matrix(DPI / 72, DPI / 72), alpha=False)
    return Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples)


def check_probe(name: str, seen: object, why: str) -> None:
    """Skip with `why` unless `seen` is what the probe `name` saw when the goldens were written."""
    path = GOLDEN / f"probe-{name}.json"
    if REGENERATE:
        path.write_text(json.dumps(seen, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    elif json.loads(path.read_text(encoding="utf-8")) != seen:
        pytest.skip(f"{why}, so the goldens do not apply on this machine (probe {path.name} differs)")


@pytest.fixture(scope="module")
def ocr_as_when_written(docs_dir):
    """Skips where this machine's OCR engine reads the scan otherwise than the goldens' machine did."""
    import numpy as np
    from rapidocr import RapidOCR

    engine = RapidOCR(params={"Global.use_cls": False, "Global.log_level": "error"})  # as the ocr draft's
    result = engine(np.asarray(page_picture(docs_dir / "scan.pdf")))
    found = result.boxes is not None
    lines = [[text, box.tolist(), score] for box, text, score in zip(result.boxes, result.txts, result.scores)] if found else []
    check_probe("ocr-scan", lines, "this CPU's float math gives the OCR engine (onnxruntime) other lines or scores on the scan")


@pytest.fixture(scope="module")
def tiny_model_as_when_written(tiny_model, docs_dir):
    """Skips where this machine's tiny random model decodes the fixtures' pages otherwise than the
    goldens' machine did (the plain, greedy reading every speculative one equals)."""
    from hsd_cli.decoding import load_target
    from hsd_cli.models.family_settings import settings_for

    target = load_target(str(tiny_model), device="cpu", dtype="float32")
    prompt = settings_for(target.model_type).page_prompt
    tokens = {
        document: target.generate_plainly(page_picture(docs_dir / f"{document}.pdf"), prompt, MAX_NEW_TOKENS)
        for document in ("report", "scan")
    }
    check_probe("tiny-model-tokens", tokens, "this CPU's float math gives the tiny random model another greedy output")


@pytest.fixture(scope="module")
def draft_only_output(docs_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("draft")
    result = run_hsd("convert", docs_dir, "-o", out)
    assert result.exit_code == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def planned_output(docs_dir, tiny_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("auto-profile")
    result = run_hsd(
        "convert", docs_dir, "-o", out, "--model", tiny_model, "--stages", "auto", "--baseline", "--profile", PROFILE,
        # Device and dtype given, so that a GPU or a bf16-capable CPU runs the fp32 math the goldens had.
        "--device", "cpu", "--dtype", "float32", "--pages", "1", "--max-new-tokens", MAX_NEW_TOKENS,
    )
    assert result.exit_code == 0, result.stderr
    return out


def run_specific_values(pdf: Path, tiny_model: Path | None = None) -> dict[str, str]:
    """The run's own JSON text -> its golden's placeholder, for the fields that differ from run to run
    (whole JSON values; a number with its key, since the number alone could stand anywhere)."""

    def string(value: str, placeholder: str) -> tuple[str, str]:
        return json.dumps(value, ensure_ascii=False), json.dumps(placeholder)  # as the JSON writes it

    pairs = [
        string(str(pdf), "<fixture path>"),  # source.path: the fixture sits in pytest's temporary directory
        # source.sha256: PyMuPDF saves every PDF with a random trailer /ID, so the fixture's hash
        # changes each session.
        string(hashlib.sha256(pdf.read_bytes()).hexdigest(), "<fixture sha256>"),
        # source.size_bytes: PyMuPDF wrote the same fixture 2 bytes shorter after other tests had run
        # in the same process; hsd reports whatever size the file has.
        (f'"size_bytes": {pdf.stat().st_size}', '"size_bytes": "<fixture size>"'),
    ]
    if tiny_model is not None:
        pairs.append(string(str(tiny_model), "<tiny model>"))  # config.model: built in pytest's temporary directory
        pairs.append(string(str(PROFILE), "<golden profile>"))  # config.profile: lies wherever the checkout is
    return dict(pairs)


def assert_identical_to_golden(out: Path, run: str, document: str, values: dict[str, str]) -> None:
    for name in (f"{document}.md", f"{document}.json"):
        written = (out / name).read_bytes()
        if name.endswith(".json"):  # the Markdown holds none of these values
            for own, placeholder in values.items():
                written = written.replace(own.encode(), placeholder.encode())
        golden = GOLDEN / run / name
        if REGENERATE:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_bytes(written)
            continue
        expected = golden.read_bytes()
        if written != expected:
            diff = difflib.unified_diff(
                expected.decode(errors="replace").splitlines(), written.decode(errors="replace").splitlines(),
                f"golden {run}/{name}", f"written {run}/{name}", lineterm="",
            )
            pytest.fail(f"{run}/{name} is not byte-identical to its golden:\n" + "\n".join(list(diff)[:80]))
    if REGENERATE:
        pytest.skip(f"HSD_REGENERATE_GOLDEN=1: wrote the goldens of {run}/{document}, compared nothing")


@pytest.mark.parametrize("document", ["report", pytest.param("scan", marks=pytest.mark.slow)])
def test_draft_only_outputs_are_byte_identical(document, docs_dir, request):
    if document == "scan":
        request.getfixturevalue("ocr_as_when_written")
    out = request.getfixturevalue("draft_only_output")
    assert_identical_to_golden(out, "draft", document, run_specific_values(docs_dir / f"{document}.pdf"))


@pytest.mark.slow
@pytest.mark.parametrize("document", ["report", "scan"])
def test_planned_tiny_model_outputs_are_byte_identical(document, docs_dir, tiny_model, tiny_model_as_when_written, request):
    if document == "scan":
        request.getfixturevalue("ocr_as_when_written")
    out = request.getfixturevalue("planned_output")  # after the guards: no conversion where they skip
    values = run_specific_values(docs_dir / f"{document}.pdf", tiny_model)
    assert_identical_to_golden(out, "auto-profile", document, values)
