"""Tiny random models, built once per session, for the exactness tests."""

import os

import numpy as np
import pytest
import torch
from PIL import Image

from hsd_cli.decoding.hf_target import StoreConfig, load_target
from hsd_cli.models.tiny_families import TINY_FAMILIES, build_tiny_random


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    # Tiny models gain nothing from threads, and spinning threads slow down on a shared machine.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# The fast tier checks the decoding core on these families (M-RoPE, 1-D positions, Kosmos-2.5's
# own layout); every family's tests run in the slow tier (`-m slow`) and in `.ci/run`.
FAST_FAMILIES = ("qwen2_5_vl", "idefics3", "kosmos-2.5")
# HSD_TEST_KV_STORE=1 runs every test of a `tiny_target` with the cache in a KVStore (kv_store.py).
KV_STORE = StoreConfig() if os.environ.get("HSD_TEST_KV_STORE") == "1" else None


@pytest.fixture(
    scope="session",
    params=[family if family in FAST_FAMILIES else pytest.param(family, marks=pytest.mark.slow) for family in TINY_FAMILIES],
)
def tiny_target(request, tmp_path_factory):
    model_dir = build_tiny_random(request.param, tmp_path_factory.mktemp(request.param))
    return load_target(str(model_dir), device="cpu", dtype="float32", kv_store=KV_STORE)


def random_image(seed: int, height: int = 80, width: int = 100) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="session")
def make_image():
    return random_image


@pytest.fixture(scope="session")
def page_image():
    return random_image(0)


@pytest.fixture(scope="module")
def bf16_target(tiny_target, tmp_path_factory):
    """The family's tiny model loaded in bfloat16."""
    model_dir = tmp_path_factory.mktemp("bf16")
    tiny_target.model.save_pretrained(model_dir)
    tiny_target.processor.save_pretrained(model_dir)
    target = load_target(str(model_dir), device="cpu", dtype="bfloat16", kv_store=KV_STORE)
    assert target.model.dtype == torch.bfloat16
    every_expert_per_token(target.model)
    return target


def every_expert_per_token(model) -> None:
    """A mixture-of-experts model (Qwen3.5-MoE's) routes every token to all its experts. Top-k
    routing picks other experts where bf16 router logits tie, whatever decodes: plain rows beside
    other rows did (a token 101 bf16 units behind, in the tiny model's top-2 of 4), which no
    near-tie bound on the output logits can tell from a bug. The fp32 tests keep top-k routing."""
    for module in model.modules():
        if hasattr(module, "top_k") and hasattr(module, "num_experts"):
            module.top_k = module.num_experts
