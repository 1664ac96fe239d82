"""What a model takes on its device, known without loading its weights: the weights' bytes (the
model built on the meta device), the KV cache's bytes per token of a row (from its text config, in
the layout cache.py keeps: every layer's keys and values, per key-value head), the tokens of a
prompt (its processor), and the device's memory. `serving.rows` budgets rows in flight with them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image

from .devices import DTYPES
from .families import adapter_for


@dataclass(frozen=True)
class Footprint:
    weight_bytes: int
    kv_bytes_per_token: int  # one row's cache grows by this per token


def kv_bytes_per_token(config, itemsize: int) -> int:
    """A row's cache bytes per token: keys and values of every decoder layer. Multi-head latent
    attention (DeepSeek's) caches full keys (`qk_nope_head_dim + qk_rope_head_dim`) and values
    (`v_head_dim`) per head in transformers; every other family `head_dim` per key-value head.
    Layers without attention (linear-attention layers keep a fixed state) are counted as if they
    had it: the budget errs on the safe side."""
    text = config.get_text_config()
    layers = text.num_hidden_layers
    if getattr(text, "qk_nope_head_dim", None):
        per_layer = text.num_attention_heads * (text.qk_nope_head_dim + text.qk_rope_head_dim + text.v_head_dim)
    else:
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        per_layer = 2 * heads * head_dim
    return layers * per_layer * itemsize


def model_footprint(config, dtype: str, trust_remote_code: bool = False) -> Footprint:
    """The footprint of the model `config` describes, in `dtype` (a DTYPES name)."""
    from transformers import AutoModelForImageTextToText

    itemsize = DTYPES[dtype].itemsize
    with torch.device("meta"):  # shapes only: no memory, no weights read
        model = AutoModelForImageTextToText.from_config(config, trust_remote_code=trust_remote_code)
    weights = sum(p.numel() for p in model.parameters()) * itemsize + sum(
        b.numel() * (itemsize if b.is_floating_point() else b.element_size()) for b in model.buffers()
    )
    return Footprint(weight_bytes=weights, kv_bytes_per_token=kv_bytes_per_token(config, itemsize))


def prompt_tokens(model: str, model_type: str, image: Image.Image, prompt: str, trust_remote_code: bool = False) -> int:
    """The tokens of the prompt `HFTarget.inputs` gives the model for (`image`, `prompt`)."""
    adapter = adapter_for(model_type)
    processor = adapter.load_processor(model, trust_remote_code)
    return int(adapter.processor_inputs(processor, [image], [prompt])["input_ids"].shape[-1])


def device_memory(device: str) -> int | None:
    """The device's total memory in bytes (MPS: what Metal recommends a process to use); None for
    the CPU, whose rows are not budgeted by memory."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    if device == "mps":
        return torch.mps.recommended_max_memory()
    return None
