"""The in-place KV store (decoding/hf_target/kv_store.py) by default where it pays: resolved once
in the parent (serving.resolve.kv_store_slots: CUDA, a row's budget of slots), used by the
worker's model as resolved, and the same output bytes as transformers' DynamicCache."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from hsd_cli.serving.rows import a4_page
from hsd_cli.config import ConvertConfig
from hsd_cli.decoding.hf_target import StoreConfig
from hsd_cli.decoding.hf_target.kv_store import StoreState
from hsd_cli.serving import resolve
from hsd_cli.serving.rows import row_tokens
from tests.conftest import run_hsd
from tests.decoding.conftest import random_image
from tests.fixtures import model_config


def test_the_store_holds_a_rows_budget_on_cuda_and_is_off_on_the_cpu(tiny_model):
    config = ConvertConfig(output_dir=Path("."), model=str(tiny_model), dpi=100)
    on_cpu = model_config(tiny_model, dpi=100)
    assert on_cpu.device == "cpu" and on_cpu.kv_store_slots is None
    on_cuda = replace(on_cpu, device="cuda")  # resolved without a device: the budget is the processor's
    tokens = row_tokens(on_cuda, a4_page(config.dpi, config.max_pixels))
    assert tokens > on_cuda.max_new_tokens
    assert resolve.kv_store_slots(on_cuda, config) == tokens + 64


@pytest.mark.parametrize("slots", [None, 512])
def test_the_workers_model_keeps_its_cache_as_resolved(tiny_model, slots):
    from hsd_cli.serving.model import VlmModel

    model = VlmModel(replace(model_config(tiny_model, dtype="float32"), kv_store_slots=slots))
    assert model.target.kv_store == (None if slots is None else StoreConfig(slots=slots))
    state, _ = model.target.prefill(model.target.inputs([random_image(0)], ["Read."]))
    assert isinstance(state, StoreState) == (slots is not None)
    if slots is not None:
        state.store.open(4)
        assert state.store.slots == slots  # allocated at the budget, not doubled


def test_convert_writes_the_same_bytes_with_the_store_on_and_off(tiny_model, docs_dir, tmp_path, monkeypatch):
    """Two documents sharing the batch (rows join, leave and verify trees), the store on as on CUDA
    (the parent resolves it for the CPU here) and off."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("a.pdf", "b.pdf"):
        shutil.copy(docs_dir / "report.pdf", inputs / name)
    outputs = {}
    for devices in (("cuda",), ("cuda", "cpu")):
        monkeypatch.setattr(resolve, "STORE_DEVICES", devices)
        assert (model_config(tiny_model).kv_store_slots is not None) == ("cpu" in devices)
        out = tmp_path / f"out{len(devices)}"
        result = run_hsd(
            "convert", inputs, "-o", out, "--model", tiny_model, "--stages", "page", "--pages", "1-2",
            "--max-new-tokens", "96", "--max-rows", "2", "--json", "-q",
        )
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["decoding"]["pages"] == 4
        outputs[devices] = {path.name: path.read_bytes() for path in sorted(out.glob("*.md"))}
    dynamic, stored = outputs.values()
    assert len(dynamic) == 2 and dynamic == stored


def test_every_tree_a_proposer_builds_fits_the_slots_the_store_budgets_for_trees():
    from hsd_cli.decoding import ProposerConfig
    from hsd_cli.decoding.tree import WIDTH_BUCKETS

    default = ProposerConfig()
    assert max(default.chain_max, default.trie_budget) + 1 <= WIDTH_BUCKETS[-1], "a tree: its drafted nodes and its root"
    wide = run_hsd("bench", "decode", "--tiny-random", "qwen2_5_vl", "--trie-budget", str(WIDTH_BUCKETS[-1]))
    assert wide.exit_code == 2 and "--trie-budget" in wide.stderr and "drafted nodes" in wide.stderr
