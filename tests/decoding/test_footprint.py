"""A model's footprint, known without its weights, against the loaded model: what the default
rows in flight (serving.rows) budget a device's memory with."""

import torch

from hsd_cli.decoding.hf_target import HFTarget
from hsd_cli.decoding.hf_target.footprint import kv_bytes_per_token, model_footprint


def test_the_weights_bytes_are_the_loaded_models(tiny_target):
    model = tiny_target.model
    loaded = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    assert model_footprint(model.config, "float32").weight_bytes == loaded
    parameters = sum(p.numel() for p in model.parameters())
    assert model_footprint(model.config, "float32").weight_bytes - model_footprint(model.config, "bfloat16").weight_bytes >= parameters * 2


def test_a_rows_cache_grows_by_the_bytes_per_token_budgeted(tiny_target, page_image):
    """What a real prefill leaves in the cache, per token of the prompt, in every layer (the
    DynamicCache path: the KV store's entries are counted in test_kv_store)."""
    target = HFTarget(tiny_target.model, tiny_target.processor, tiny_target.adapter, kv_store=None)
    state, _ = target.prefill(target.inputs([page_image], ["Transcribe the page."]))
    tokens = int(state.past_len[0])
    held = [
        tensor for layer in state.cache.layers
        for tensor in ([layer.keys, layer.values] if hasattr(layer, "keys") else [layer.conv_states[0], layer.recurrent_states[0]])
    ]
    cached = sum(tensor.numel() * tensor.element_size() for tensor in held)
    assert state.slot_valid.shape[1] == tokens, "one row: no padding slots"
    footprint = model_footprint(tiny_target.model.config, "float32")
    assert footprint.kv_bytes_per_token == kv_bytes_per_token(tiny_target.model.config, torch.float32.itemsize)
    assert cached == footprint.row_bytes(tokens), "keys and values per token, and a hybrid's fixed linear-layer states"
    assert (footprint.state_bytes_per_row > 0) == bool(tiny_target.linear_layers)
