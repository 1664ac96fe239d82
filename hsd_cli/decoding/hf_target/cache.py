"""The KV cache of a batch of rows being decoded: transformers' DynamicCache, edited in place.

The only module that knows the cache's layout: a prefill's rows joined into one left-padded batch,
a verified tree's kept nodes kept and the rest dropped, padding squeezed out, finished rows
dropped; and which transformers versions keep the layout these edits assume.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class BatchState:
    """Cache and bookkeeping for the rows being decoded. Slots of the cache can be padding."""

    cache: object
    slot_valid: torch.Tensor  # (B, L) bool, which cache slots hold real tokens
    past_len: torch.Tensor  # (B,) long, real tokens in the cache per row (= next text position)
    rope_delta: torch.Tensor  # (B,) long
    rows: list[int]  # the caller's index of each row still in the batch


def join_rows(parts: Sequence[BatchState]) -> BatchState:
    """States of rows decoded apart (rows prefilled alone; a running batch and the rows that join
    it) in one batch, left-padded to the longest as a batch prefill is; each keeps its `rows`."""
    length = max(state.slot_valid.shape[1] for state in parts)

    def left_padded(tensor: torch.Tensor) -> torch.Tensor:  # (rows, heads, slots, head_dim)
        return torch.nn.functional.pad(tensor, (0, 0, length - tensor.shape[2], 0))

    joined = parts[0]
    for index, layer in enumerate(joined.cache.layers):
        layer.keys = torch.cat([left_padded(state.cache.layers[index].keys) for state in parts])
        layer.values = torch.cat([left_padded(state.cache.layers[index].values) for state in parts])
    joined.slot_valid = torch.cat(
        [torch.nn.functional.pad(state.slot_valid, (length - state.slot_valid.shape[1], 0), value=False) for state in parts]
    )
    joined.past_len = torch.cat([state.past_len for state in parts])
    joined.rope_delta = torch.cat([state.rope_delta.reshape(-1) for state in parts])
    joined.rows = [row for state in parts for row in state.rows]
    return joined


def keep_nodes(state: BatchState, kept_nodes: Sequence[Sequence[int]], device: torch.device) -> None:
    """Keep, per row, the cache entries of `kept_nodes` (tree node indices) and drop the rest.

    The tree forward appended its nodes' slots to every row. They are replaced by `m` slots (m = the
    longest kept list): row b's kept entries, then padding. Accepted chains are prefixes of
    the new slots, so usually this is a slice and copies nothing.
    """
    old_len = state.slot_valid.shape[1]
    kept_count = torch.tensor([len(nodes) for nodes in kept_nodes])
    longest = int(kept_count.max())
    if all(list(nodes) == list(range(len(nodes))) for nodes in kept_nodes):
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
    state.slot_valid = valid[:, trim:]
    state.past_len = state.past_len[index]
    state.rope_delta = state.rope_delta[index]
    state.rows = [state.rows[i] for i in keep]


def _gather_slots(slots: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Per row b, the slots index[b] (B, M) of a (B, heads, slots, head_dim) cache tensor."""
    return slots.gather(2, index[:, None, :, None].expand(-1, slots.shape[1], -1, slots.shape[-1]))


def _edit_cache(state: BatchState, edit: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Replace every layer's keys and values (B, heads, slots, head_dim) with `edit` of them."""
    for layer in state.cache.layers:
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
    if config is not None:
        kinds = sorted({type(layer).__name__ for layer in DynamicCache(config=config).layers})
        if kinds != [DynamicLayer.__name__]:
            return f"the model's cache layers are {kinds}, not plain {DynamicLayer.__name__}s (sliding-window attention is not supported)"
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
