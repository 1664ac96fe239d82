"""Hybrid text models (Qwen3.5's: Gated DeltaNet linear-attention layers beside full attention)
as tree targets: during a tree forward each linear-attention layer runs hsd's tree form
(delta_tree.py) instead of its own forward, which would read the tree's nodes as one sequence.

Why a scoped forward on each layer instance, not a fork of the model file or a patched
`generate`: prefill, plain one-token steps and `generate` (the baseline) stay transformers' own
code, bit for bit; only a tree forward, inside `tree_form`, sees hsd's. The tree form calls the
layer's own projections, conv weights and gated norm, so a checkpoint's weights are used as
loaded, and it reads the cache without writing it: what a commit needs stays in a `NodeRecord`
per layer (cache.py's `commit_linear_states` rebuilds the accepted path's states from it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import torch

from .delta_tree import NodeRecord, conv_sources, tree_conv, tree_gated_delta_rule, tree_parents

# The parts of transformers' Gated DeltaNet layer (Qwen3.5, Qwen3.5-MoE) the tree form calls. A
# layer laid out otherwise (Qwen3-Next's fused in_proj_qkvz) is refused, not guessed at.
LAYER_PARTS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "A_log", "dt_bias", "norm", "out_proj", "layer_idx")


class UnknownLinearAttentionError(ValueError):
    """A linear-attention layer whose layout the tree form does not know; the message is one line."""


def linear_attention_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's Gated DeltaNet layers (none in an attention-only model), checked to have the
    parts the tree form calls."""
    layers = [module for module in model.modules() if type(module).__name__.endswith("GatedDeltaNet")]
    for layer in layers:
        missing = [part for part in LAYER_PARTS if not hasattr(layer, part)]
        if missing:
            raise UnknownLinearAttentionError(
                f"{type(layer).__name__} lacks {', '.join(missing)}: hsd's tree form knows Qwen3.5's Gated DeltaNet layout only"
            )
    return layers


@contextmanager
def tree_form(layers: Sequence[torch.nn.Module], ancestors: torch.Tensor, depths: torch.Tensor) -> Iterator[dict[int, NodeRecord]]:
    """Within: every layer in `layers` runs the tree form over the forward's nodes (ancestors (B,
    K, K) bool, depths (B, K)) and leaves the cache as it was; yields the records its layers fill,
    by layer index."""
    records: dict[int, NodeRecord] = {}
    parents = tree_parents(ancestors, depths)
    for layer in layers:
        sources = conv_sources(parents, depths, layer.conv1d.weight.shape[-1])
        # An instance attribute: nn.Module.__call__ finds it before the class's forward.
        layer.forward = partial(_tree_forward, layer, ancestors, sources, records)
    try:
        yield records
    finally:
        for layer in layers:
            del layer.forward


def _tree_forward(
    layer, ancestors: torch.Tensor, sources: torch.Tensor, records: dict[int, NodeRecord],
    hidden_states: torch.Tensor, cache_params=None, attention_mask=None, **kwargs,
) -> torch.Tensor:
    """Qwen3_5GatedDeltaNet.forward for a tree forward: the same projections, conv, gates and
    norm, with each node reading only its ancestors (a tree forward's mask is 4-D, so transformers
    gives these layers no padding mask: `attention_mask` is None here)."""
    from transformers.activations import ACT2FN

    rows, width, _ = hidden_states.shape
    conv_state = cache_params.get_conv_state(layer.layer_idx, state_idx=0)
    recurrent_state = cache_params.get_recurrent_state(layer.layer_idx, state_idx=0)
    conv_inputs = layer.in_proj_qkv(hidden_states).transpose(1, 2)
    z = layer.in_proj_z(hidden_states).reshape(rows, width, -1, layer.head_v_dim)
    b, a = layer.in_proj_b(hidden_states), layer.in_proj_a(hidden_states)
    mixed = tree_conv(conv_inputs, conv_state, sources, layer.conv1d.weight.squeeze(1), layer.conv1d.bias)
    mixed = ACT2FN[layer.activation](mixed).to(hidden_states.dtype).transpose(1, 2)
    query, key, value = torch.split(mixed, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    query = query.reshape(rows, width, -1, layer.head_k_dim)
    key = key.reshape(rows, width, -1, layer.head_k_dim)
    value = value.reshape(rows, width, -1, layer.head_v_dim)
    beta = b.sigmoid()
    g = -layer.A_log.float().exp() * torch.nn.functional.softplus(a.float() + layer.dt_bias)
    out, keys, deltas, decays = tree_gated_delta_rule(query, key, value, g, beta, ancestors.to(hidden_states.device), recurrent_state)
    records[layer.layer_idx] = NodeRecord(conv_inputs, keys, deltas, decays)
    out = layer.norm(out.reshape(-1, layer.head_v_dim), z.reshape(-1, layer.head_v_dim))
    return layer.out_proj(out.reshape(rows, width, -1))
