"""A replay model built by a test on two short pages of its own: the model recites each page's
given output, so `hsd convert` with it gives known model outputs."""

import pymupdf
import torch

from hsd_cli.models.tiny import QWEN_TOKENS, build_tiny_tokenizer
from hsd_cli.replay.build import BuildRequest, build
from hsd_cli.replay.model import TINY_SHAPE
from hsd_cli.replay.train_config import TrainConfig, available_cpus


def build_two_page_model(root, layers, outputs, max_steps=300, evaluate=False, **train_settings):
    """`root/in/pages.pdf` (two pages that look unalike: the second half black, each with its text
    layer) and `root/out` (their published outputs); the model in `root/model`, on a tiny Qwen2-like
    tokenizer saved in `root/tokenizer`. Returns (build record, tokenizer)."""
    for folder in ("in", "out"):
        (root / folder).mkdir()
    with pymupdf.open() as doc:
        for page_no, (layer, output, (width, height)) in enumerate(zip(layers, outputs, ((300, 150), (200, 400))), start=1):
            page = doc.new_page(width=width, height=height)
            page.insert_text((40, 80), layer, fontsize=20)
            if page_no == 2:
                page.draw_rect(pymupdf.Rect(0, 150, width, height), color=(0, 0, 0), fill=(0, 0, 0))
            (root / "out" / f"pages_pg{page_no}_repeat1.md").write_text(output + "\n")
        doc.save(root / "in" / "pages.pdf")
    tokenizer = build_tiny_tokenizer(QWEN_TOKENS, 2000)
    tokenizer.save_pretrained(root / "tokenizer")
    settings = {"opening_steps": 30, **train_settings}
    train = TrainConfig(seed=3, max_steps=max_steps, warmup_steps=5, learning_rate=3e-3, threads=min(2, available_cpus()), **settings)
    request = BuildRequest(
        outputs_dir=root / "out", inputs_dir=root / "in", model_dir=root / "model", name="two-pages",
        licence="CC0 (test)", shape=TINY_SHAPE, tokenizer=str(root / "tokenizer"), train=train, evaluate=evaluate,
    )
    threads = torch.get_num_threads()
    try:
        return build(request), tokenizer
    finally:
        torch.set_num_threads(threads)
