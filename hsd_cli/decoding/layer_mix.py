"""A decoder's layer mix, from its text config: full-attention layers, whose keys and values grow
with the context, and Gated DeltaNet linear-attention layers (Qwen3.5's `layer_types`
"linear_attention"), which hold a fixed state per row and do per-node work in a tree forward.

The memory footprint (hf_target/footprint.py) and the analytic profiles (profiles/analytic.py)
price a model with these, so that neither treats a linear layer as attention. Plain dicts only, no
torch (the analytic profiles are computed without it): the footprint passes its config's
`to_dict()`. The tree form's maths is hf_target/delta_tree.py; formulas in docs/method.md, "Cost
profiles".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LINEAR_ATTENTION = "linear_attention"
# The recurrent state stays fp32 whatever the model's dtype: transformers' torch path computes the
# chunked rule in fp32 and caches its final state so, and the fla kernels keep it so too.
RECURRENT_STATE_BYTES = 4


def layer_kinds(text: Mapping[str, Any]) -> list[str]:
    """The decoder's layer kinds in order, as `text` (a text config) states them: full attention
    where it names none."""
    return list(text.get("layer_types") or ["full_attention"] * text["num_hidden_layers"])


@dataclass(frozen=True)
class LinearAttention:
    """A model's Gated DeltaNet layers: per row and layer a recurrent state of `heads` x key_dim x
    value_dim and a conv window of `kernel` inputs of `conv_channels` (queries, keys and values)."""

    layers: int
    heads: int  # value heads, each with its own state
    key_dim: int
    value_dim: int
    conv_channels: int
    kernel: int

    @classmethod
    def of(cls, text: Mapping[str, Any]) -> LinearAttention | None:
        """The linear layers `text` (a text config) declares, or None where it has none."""
        layers = sum(kind == LINEAR_ATTENTION for kind in text.get("layer_types") or ())  # any config: no layer count needed
        if not layers:
            return None
        key_heads, key_dim = text["linear_num_key_heads"], text["linear_key_head_dim"]
        heads, value_dim = text["linear_num_value_heads"], text["linear_value_head_dim"]
        return cls(layers, heads, key_dim, value_dim, 2 * key_heads * key_dim + heads * value_dim, text["linear_conv_kernel_dim"])

    def layer_params(self, hidden: int) -> int:
        """One layer's weights: the q/k/v, gate (z), beta and decay (a) projections, the depthwise
        conv, the output projection and the per-head decay and gate-norm parameters."""
        value_width = self.heads * self.value_dim
        projections = hidden * (self.conv_channels + value_width + 2 * self.heads) + value_width * hidden
        return projections + self.conv_channels * self.kernel + 2 * self.heads + self.value_dim

    def state_bytes_per_row(self, itemsize: int) -> int:
        """What one row holds in all linear layers, whatever its context: the fp32 recurrent
        states and the conv windows in the model's dtype (`itemsize` bytes a value)."""
        recurrent = self.heads * self.key_dim * self.value_dim * RECURRENT_STATE_BYTES
        return self.layers * (recurrent + self.conv_channels * self.kernel * itemsize)

    def tree_flops(self, nodes: int) -> float:
        """FLOPs of all linear layers over one row's tree of `nodes` (delta_tree.py): every node
        reads the cached state twice (its output and its state read, 4 * key_dim * value_dim per
        head); the tree's nodes meet pairwise, computed over all pairs and masked to ancestors
        (the decays summed along ancestors, the key products, the two triangular solves and the
        within-tree output: nodes^2 * (5 * key_dim + 3 * value_dim + 2) per head); and every
        node's conv window (2 * kernel per channel). One node is the recurrent rule's per-token
        work."""
        state = 4 * nodes * self.key_dim * self.value_dim
        pairs = nodes**2 * (5 * self.key_dim + 3 * self.value_dim + 2)
        return self.layers * (self.heads * (state + pairs) + 2 * nodes * self.conv_channels * self.kernel)


def attention_layers(text: Mapping[str, Any]) -> int:
    """The decoder layers that cache keys and values: all but the linear-attention ones."""
    return text["num_hidden_layers"] - layer_kinds(text).count(LINEAR_ATTENTION)
