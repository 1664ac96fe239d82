"""Front matter through `hsd convert`: only olmOCR's is split off a page's output. A replay model
built by the test recites two pages, one opening with a form's own `---` block, one with
olmOCR's front matter."""

import json

import pymupdf
import torch

from hsd_cli.models.tiny import QWEN_TOKENS, build_tiny_tokenizer
from hsd_cli.replay.build import BuildRequest, build
from hsd_cli.replay.model import TINY_SHAPE
from hsd_cli.replay.train_config import TrainConfig, available_cpus
from tests.conftest import run_hsd

FORM = "---\nName: John Smith\n---\n\nThe harvest came early."
OLMOCR = (
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\n"
    "is_diagram: False\n---\nDelta epsilon zeta."
)


def test_only_olmocr_front_matter_is_split_off_the_markdown(tmp_path):
    for folder in ("in", "out"):
        (tmp_path / folder).mkdir()
    with pymupdf.open() as doc:
        for page_no, (layer, output, (width, height)) in enumerate(
            zip(("Name: John Smith", "Delta epsilon zeta."), (FORM, OLMOCR), ((300, 150), (200, 400))), start=1
        ):
            page = doc.new_page(width=width, height=height)
            page.insert_text((40, 80), layer, fontsize=20)
            if page_no == 2:  # pages that look unalike are quick to tell apart
                page.draw_rect(pymupdf.Rect(0, 150, width, height), color=(0, 0, 0), fill=(0, 0, 0))
            (tmp_path / "out" / f"pages_pg{page_no}_repeat1.md").write_text(output + "\n")
        doc.save(tmp_path / "in" / "pages.pdf")
    tokenizer = build_tiny_tokenizer(QWEN_TOKENS, 2000)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    train = TrainConfig(seed=3, max_steps=400, warmup_steps=5, learning_rate=3e-3, opening_steps=30, threads=min(2, available_cpus()))
    request = BuildRequest(
        outputs_dir=tmp_path / "out", inputs_dir=tmp_path / "in", model_dir=tmp_path / "model", name="front-matter",
        licence="CC0 (test)", shape=TINY_SHAPE, tokenizer=str(tmp_path / "tokenizer"), train=train, evaluate=False,
    )
    threads = torch.get_num_threads()
    try:
        record = build(request)
    finally:
        torch.set_num_threads(threads)
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
