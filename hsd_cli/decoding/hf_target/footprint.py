"""What a model takes on its device, known without loading its weights: the weights' bytes (the
model built on the meta device), the KV cache's bytes per token of a row (from its text config, in
the layout cache.py keeps: every layer's keys and values, per key-value head), the tokens of a
prompt (its processor), and the device's memory; a hybrid's linear-attention layers hold a fixed
state per row instead of keys and values (decoding/layer_mix.py). `serving.rows` budgets rows in
flight with them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image

from ..layer_mix import LinearAttention

from .devices import DTYPES
from .families import adapter_for


@dataclass(frozen=True)
class Footprint:
    weight_bytes: int
    kv_bytes_per_token: int  # one row's cache grows by this per token
    state_bytes_per_row: int = 0  # and holds this whatever its length (a hybrid's linear-attention layers)

    def row_bytes(self, tokens: int) -> int:
        """What a row of `tokens` cached tokens takes."""
        return tokens * self.kv_bytes_per_token + self.state_bytes_per_row


def kv_bytes_per_token(config, itemsize: int) -> int:
    """A row's cache bytes per token: keys and values of every attention layer. Multi-head latent
    attention (DeepSeek's) caches full keys (`qk_nope_head_dim + qk_rope_head_dim`) and values
    (`v_head_dim`) per head in transformers; every other family `head_dim` per key-value head.
    Linear-attention layers (a hybrid's Gated DeltaNet layers) hold a fixed state instead
    (`state_bytes_per_row`)."""
    text = config.get_text_config()
    linear = LinearAttention.of(text.to_dict())
    layers = text.num_hidden_layers - (linear.layers if linear else 0)
    if getattr(text, "qk_nope_head_dim", None):
        per_layer = text.num_attention_heads * (text.qk_nope_head_dim + text.qk_rope_head_dim + text.v_head_dim)
    else:
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        per_layer = 2 * heads * head_dim
    return layers * per_layer * itemsize


def state_bytes_per_row(config, itemsize: int) -> int:
    """A row's fixed state in the linear-attention layers (its recurrent states in fp32, its conv
    windows in the model's dtype); 0 for a model without them."""
    linear = LinearAttention.of(config.get_text_config().to_dict())
    return linear.state_bytes_per_row(itemsize) if linear else 0


def model_footprint(config, dtype: str, trust_remote_code: bool = False) -> Footprint:
    """The footprint of the model `config` describes, in `dtype` (a DTYPES name)."""
    from transformers import AutoModelForImageTextToText

    itemsize = DTYPES[dtype].itemsize
    with torch.device("meta"):  # shapes only: no memory, no weights read
        model = AutoModelForImageTextToText.from_config(config, trust_remote_code=trust_remote_code)
    weights = sum(p.numel() for p in model.parameters()) * itemsize + sum(
        b.numel() * (itemsize if b.is_floating_point() else b.element_size()) for b in model.buffers()
    )
    return Footprint(
        weight_bytes=weights, kv_bytes_per_token=kv_bytes_per_token(config, itemsize),
        state_bytes_per_row=state_bytes_per_row(config, itemsize),
    )


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
