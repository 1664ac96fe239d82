"""The KV cache of a batch of rows being decoded: transformers' DynamicCache, edited in place.

The only module that knows the cache's layout: a prefill's rows joined into one left-padded batch,
a verified tree's kept nodes kept and the rest dropped, padding squeezed out, finished rows
dropped; and which transformers versions keep the layout these edits assume. A hybrid model's
linear-attention layers hold one conv and one recurrent state per row instead of slots: rows
join, leave and commit by those states (a commit rebuilds them from the tree forward's records,
delta_tree.py), and slot edits pass them by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .delta_tree import NodeRecord, path_states


@dataclass
class BatchState:
    """Cache and bookkeeping for the rows being decoded. Slots of the cache can be padding."""

    cache: object
    slot_valid: torch.Tensor  # (B, L) bool, which cache slots hold real tokens
    past_len: torch.Tensor  # (B,) long, real tokens in the cache per row (= next text position)
    rope_delta: torch.Tensor  # (B,) long
    rows: list[int]  # the caller's index of each row still in the batch
    # A hybrid model's tree forward: per linear-attention layer, what its commit rebuilds the
    # states from (None after a commit, and where the forward updated the states itself).
    linear_records: dict[int, NodeRecord] | None = None
    # (B,) long, each row's prompt tokens: where a window over generated tokens starts counting
    # (generated_window.py). Set by every prefill; None in states built by hand.
    prompt_len: torch.Tensor | None = None


def join_rows(parts: Sequence[BatchState]) -> BatchState:
    """States of rows decoded apart (rows prefilled alone; a running batch and the rows that join
    it) in one batch, left-padded to the longest as a batch prefill is; each keeps its `rows`."""
    length = max(state.slot_valid.shape[1] for state in parts)

    def left_padded(tensor: torch.Tensor) -> torch.Tensor:  # (rows, heads, slots, head_dim)
        return torch.nn.functional.pad(tensor, (0, 0, length - tensor.shape[2], 0))

    joined = parts[0]
    for index, layer in _attention_layers(joined.cache):
        layer.keys = torch.cat([left_padded(state.cache.layers[index].keys) for state in parts])
        layer.values = torch.cat([left_padded(state.cache.layers[index].values) for state in parts])
    join_linear_states(joined.cache, [state.cache for state in parts])
    joined.slot_valid = torch.cat(
        [torch.nn.functional.pad(state.slot_valid, (length - state.slot_valid.shape[1], 0), value=False) for state in parts]
    )
    joined.past_len = torch.cat([state.past_len for state in parts])
    joined.rope_delta = torch.cat([state.rope_delta.reshape(-1) for state in parts])
    joined.prompt_len = joined_prompt_lengths(parts)
    joined.rows = [row for state in parts for row in state.rows]
    return joined


def joined_prompt_lengths(parts: Sequence) -> torch.Tensor | None:
    """The prompt lengths of every part's rows in order (None if a part has none)."""
    lengths = [part.prompt_len for part in parts]
    return None if any(held is None for held in lengths) else torch.cat(lengths)


def join_linear_states(joined, caches: Sequence[object]) -> None:
    """Each linear-attention layer of `joined` (the first of `caches`) takes the conv and
    recurrent states of every cache's rows, in order."""
    for index, layer in _linear_layers(joined):
        layer.conv_states[0] = torch.cat([cache.layers[index].conv_states[0] for cache in caches])
        layer.recurrent_states[0] = torch.cat([cache.layers[index].recurrent_states[0] for cache in caches])


def first_nodes(nodes: Sequence[int], count: int) -> bool:
    """Whether kept `nodes` (`count` of them, ascending: a path from the root) are the tree's
    first ones, 0 to count - 1, whose entries stay where the forward wrote them: then the last is
    count - 1. One look a row, not two lists built."""
    return not count or nodes[-1] == count - 1


def keep_nodes(state: BatchState, kept_nodes: Sequence[Sequence[int]], device: torch.device) -> None:
    """Keep, per row, the cache entries of `kept_nodes` (tree node indices) and drop the rest.

    The tree forward appended its nodes' slots to every row. They are replaced by `m` slots (m = the
    longest kept list): row b's kept entries, then padding. Accepted chains are prefixes of
    the new slots, so usually this is a slice and copies nothing.
    """
    old_len = state.slot_valid.shape[1]
    counts = [len(nodes) for nodes in kept_nodes]
    kept_count = torch.tensor(counts)
    longest = max(counts)
    if all(first_nodes(nodes, count) for nodes, count in zip(kept_nodes, counts)):
        _edit_cache(state, lambda slots: slots[:, :, : old_len + longest])
    else:
        index = torch.tensor([list(nodes) + [0] * (longest - len(nodes)) for nodes in kept_nodes])
        gather_kept(state, old_len, index.to(device))
    new_valid = torch.arange(longest)[None, :] < kept_count[:, None]
    state.slot_valid = torch.cat([state.slot_valid, new_valid], dim=1)
    state.past_len = state.past_len + kept_count
    if state.slot_valid.shape[0] > 1 and (~state.slot_valid).sum() * 2 > state.slot_valid.numel():
        compact(state, device)


def gather_kept(state: BatchState, old_len: int, index: torch.Tensor) -> None:
    """Keep the first `old_len` slots and, after them, the new slots at `index` (B, M)."""
    _edit_cache(state, lambda slots: torch.cat([slots[:, :, :old_len], _gather_slots(slots[:, :, old_len:], index)], dim=2))


def compact(state: BatchState, device: torch.device) -> None:
    """Squeeze out padding slots: every row's real slots move to the right end, in order."""
    valid = state.slot_valid
    new_len = int(valid.sum(-1).max())
    # A stable sort puts padding first and real slots in their original order last.
    order = torch.sort(valid.to(torch.int8), dim=-1, stable=True).indices[:, -new_len:]
    device_order = order.to(device)
    _edit_cache(state, lambda slots: _gather_slots(slots, device_order))
    state.slot_valid = torch.gather(valid, 1, order)


def keep_rows(state: BatchState, keep: Sequence[int], device: torch.device) -> None:
    """Drop finished rows from the batch (positions in the current batch to keep)."""
    index = torch.tensor(list(keep), dtype=torch.long)
    device_index = index.to(device)
    valid = state.slot_valid[index]
    trim = int((~valid).all(0).long().cumprod(0).sum())  # leading all-padding columns
    _edit_cache(state, lambda slots: slots.index_select(0, device_index)[:, :, trim:])
    for _, layer in _linear_layers(state.cache):
        layer.conv_states[0] = layer.conv_states[0].index_select(0, device_index)
        layer.recurrent_states[0] = layer.recurrent_states[0].index_select(0, device_index)
    state.slot_valid = valid[:, trim:]
    state.past_len = state.past_len[index]
    state.rope_delta = state.rope_delta[index]
    state.prompt_len = None if state.prompt_len is None else state.prompt_len[index]
    state.rows = [state.rows[i] for i in keep]


def commit_linear_states(state: BatchState, paths: Sequence[Sequence[int]]) -> None:
    """Each linear-attention layer's conv and recurrent states after each row's accepted path
    (tree node indices from the root down), rebuilt from the tree forward's records."""
    records, state.linear_records = state.linear_records, None
    lengths = torch.tensor([len(path) for path in paths], dtype=torch.long)
    if not int(lengths.max()):
        return  # nothing kept (as `hsd profile` puts a measured forward back): the states as they were
    index = torch.tensor([list(path) + [0] * (int(lengths.max()) - len(path)) for path in paths], dtype=torch.long)
    for layer_index, record in records.items():
        layer = state.cache.layers[layer_index]
        layer.recurrent_states[0], layer.conv_states[0] = path_states(
            record, layer.recurrent_states[0], layer.conv_states[0], index, lengths
        )


def _attention_layers(cache) -> list[tuple[int, object]]:
    """(index, layer) of the cache's layers that keep key and value slots."""
    from transformers.cache_utils import DynamicLayer

    return [(index, layer) for index, layer in enumerate(cache.layers) if isinstance(layer, DynamicLayer)]


def _linear_layers(cache) -> list[tuple[int, object]]:
    """(index, layer) of the cache's layers that keep a linear-attention layer's states."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    return [(index, layer) for index, layer in enumerate(cache.layers) if isinstance(layer, LinearAttentionCacheLayerMixin)]


def _gather_slots(slots: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Per row b, the slots index[b] (B, M) of a (B, heads, slots, head_dim) cache tensor."""
    return slots.gather(2, index[:, None, :, None].expand(-1, slots.shape[1], -1, slots.shape[-1]))


def _edit_cache(state: BatchState, edit: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Replace every attention layer's keys and values (B, heads, slots, head_dim) with `edit` of them."""
    for _, layer in _attention_layers(state.cache):
        layer.keys = edit(layer.keys)
        layer.values = edit(layer.values)


# ----------------------------------------------------------------------------------------------
# The transformers versions whose cache layout this module knows

# This module edits DynamicCache's per-layer tensors directly (above), which transformers does not
# promise to keep stable: it is tested with these versions only.
SUPPORTED_TRANSFORMERS = ">=5.23,<5.24"


class UnsupportedTransformersError(RuntimeError):
    """The installed transformers keeps its KV cache in a layout this module does not know."""


def cache_layout_problem(config=None) -> str | None:
    """How the installed transformers' KV cache differs from the layout this module edits, or
    None: a DynamicCache (made for `config` if given) of plain DynamicLayer objects whose `keys`
    and `values` tensors (batch, heads, slots, head_dim) grow along dim 2, and whose length is
    read back from those tensors after they are edited."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError as exc:
        return f"transformers.cache_utils has no DynamicCache or DynamicLayer ({exc})"
    cache = DynamicCache()
    first, second = torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 1, 4)
    for step in (first, second):
        cache.update(step, step, 0)
    layers = getattr(cache, "layers", None)
    if not layers or type(layers[0]) is not DynamicLayer:
        return "DynamicCache does not keep its entries in a list of DynamicLayer objects (`.layers`)"
    layer = layers[0]
    expected = torch.cat([first, second], dim=2)
    for name in ("keys", "values"):
        held = getattr(layer, name, None)
        if not torch.is_tensor(held) or held.shape != expected.shape or not torch.equal(held, expected):
            return f"DynamicLayer.{name} is not the (batch, heads, slots, head_dim) tensor of the entries so far"
    layer.keys, layer.values = layer.keys[:, :, :2], layer.values[:, :, :2]
    if cache.get_seq_length() != 2:
        return "DynamicCache does not read its length from the layers' key tensors"
    if config is None:
        return None
    kinds = {type(layer).__name__ for layer in DynamicCache(config=config).layers}
    known = {DynamicLayer.__name__, "LinearAttentionLayer"}
    if not kinds <= known or DynamicLayer.__name__ not in kinds:
        return (
            f"the model's cache layers are {sorted(kinds)}, not plain {DynamicLayer.__name__}s and LinearAttentionLayers "
            "(sliding-window attention is not supported)"
        )
    return linear_state_problem() if "LinearAttentionLayer" in kinds else None


def linear_state_problem() -> str | None:
    """How a LinearAttentionLayer differs from what the linear-state edits above assume, or None:
    its conv and recurrent states are tensors (batch first) at `conv_states[0]` and
    `recurrent_states[0]`, which it reads back after they are replaced."""
    from transformers.cache_utils import LinearAttentionLayer

    layer = LinearAttentionLayer()
    conv, recurrent = torch.zeros(2, 3, 4), torch.zeros(2, 1, 3, 3)
    layer.update_conv_state(conv, conv_kernel_size=4)
    layer.update_recurrent_state(recurrent)
    states = getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)
    if not all(isinstance(held, dict) and torch.is_tensor(held.get(0)) for held in states):
        return "LinearAttentionLayer does not keep its states as tensors at conv_states[0] and recurrent_states[0]"
    layer.conv_states[0] = torch.ones(1, 3, 4)
    if not torch.equal(layer.update_conv_state(torch.zeros(1, 3, 1))[..., :4], torch.ones(1, 3, 4)):
        return "LinearAttentionLayer does not read back a replaced conv state"
    return None


def check_cache_layout(config=None) -> None:
    """Raise UnsupportedTransformersError (one line, naming the supported versions) if the
    installed transformers' cache layout is not the known one."""
    import transformers

    problem = cache_layout_problem(config)
    if problem is not None:
        raise UnsupportedTransformersError(
            f"hsd's decoder does not know the KV cache of the installed transformers {transformers.__version__}: "
            f"{problem}; it is tested with transformers{SUPPORTED_TRANSFORMERS} (pip install 'transformers{SUPPORTED_TRANSFORMERS}')"
        )
