"""What `hsd bench kv-traffic` counts (kv_traffic.py is its command, which imports this only when
it runs: the parent of `hsd convert` imports the benches' CLI and must not load torch): the bytes a decoding step's KV cache allocates and writes, with the
cache in transformers' DynamicCache as cache.py edits it, and in the in-place KVStore
(kv_store.py), for a model of a given KV shape (Qwen2.5-VL-7B's by default: 28 layers, 4
key-value heads of 128 dims, bf16) at several row counts and context lengths.

torch's allocator counters are CUDA's only, so every aten op is counted as it runs
(`TrafficCounter`), on the meta device: tensors with shapes and no memory, so that 32 rows of
6,000 tokens of a 7B's cache (11 GB) cost nothing here. The two caches are driven as the target
drives them (each layer's `update` with a step's new keys and values, then the commit), without
the model: the model's own projections and attention are the same for both and not counted.

A tree forward's attention is counted apart (`attention_traffic`): transformers' SDPA repeats
each row's keys and values over the query heads of a group before its kernel, hsd's folds the
groups into the query length (decoding/hf_target/attention.py); the copies are counted as above,
the kernel's reads as a fused kernel makes them (`FusedAttentionCounter`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from hsd_cli.decoding.hf_target.cache import BatchState, join_rows, keep_nodes, keep_rows
from hsd_cli.decoding.hf_target.kv_store import StoreConfig, commit_stored, join_stored, keep_stored_rows, stored

META = torch.device("meta")


class TrafficCounter(TorchDispatchMode):
    """Counts, per aten op on `device`, the bytes it allocates (a new tensor, written whole) and
    the bytes it writes (new tensors and in-place writes: a scatter's or index copy's source, a
    copy's destination), of floating-point tensors: the cache's entries, not the index and length
    bookkeeping beside them (a few bytes a row). Views allocate and write nothing, `_unsafe_view`
    (a reshape's view of the copy it just made, with no alias in its schema) included."""

    def __init__(self, device: torch.device = META) -> None:
        super().__init__()
        self.device = device
        self.allocated = 0
        self.written = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket.__name__ == "_unsafe_view":
            return out
        values = out if isinstance(out, (tuple, list)) else (out,)
        for returned, value in zip(func._schema.returns, values):
            if not isinstance(value, torch.Tensor) or value.device != self.device or not value.is_floating_point():
                continue
            if returned.alias_info is None:
                self.allocated += _nbytes(value)
                self.written += _nbytes(value)
            elif returned.alias_info.is_write:
                self.written += _written_in_place(func.overloadpacket.__name__, args, kwargs, value)
        return out


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _written_in_place(name: str, args: tuple, kwargs: dict, target: torch.Tensor) -> int:
    """Bytes an in-place op writes into `target`: what it scatters or copies in, else all of it."""
    if name in ("scatter_", "scatter_add_"):
        index = kwargs.get("index", args[2])
        return index.numel() * target.element_size()
    if name in ("index_copy_", "index_put_"):
        source = kwargs.get("source", kwargs.get("values", args[-1] if name == "index_put_" else args[3]))
        return source.numel() * target.element_size()
    return _nbytes(target)


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.bfloat16

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype.itemsize


QWEN25_VL_7B = KVShape(layers=28, kv_heads=4, head_dim=128)


@dataclass(frozen=True)
class Traffic:
    """Bytes a cache allocated and wrote: in the first step after the prefill (where the store
    makes room for the forwards to come), per step after it (mean of the steps run), for a row
    leaving the middle of the batch, and for a row of the context's length joining it."""

    rows: int
    context: int
    first_step_written: int
    step_allocated: float
    step_written: float
    leave_written: int
    join_written: int


def _prefilled(shape: KVShape, lengths: list[int]) -> BatchState:
    """Rows of `lengths` entries, left-padded in a DynamicCache, as a prefill leaves them."""
    from transformers import DynamicCache

    cache, longest = DynamicCache(), max(lengths)
    for layer in range(shape.layers):
        entries = torch.zeros((len(lengths), shape.kv_heads, longest, shape.head_dim), dtype=shape.dtype, device=META)
        cache.update(entries, entries, layer)
    valid = torch.arange(longest)[None, :] >= torch.tensor([longest - n for n in lengths])[:, None]
    return BatchState(cache, valid, torch.tensor(lengths), torch.zeros(len(lengths), dtype=torch.long), list(range(len(lengths))))


def _kept(rows: int, step: int) -> list[list[int]]:
    """Each row's accepted path of 4 nodes: the tree's first nodes for half the rows, a path off
    its first branch for the other half (both caches then move or gather entries)."""
    return [[0, 1, 2, 3] if (row + step) % 2 else [0, 2, 5, 9] for row in range(rows)]


def _step(shape: KVShape, state, nodes: int, kept: list[list[int]], store: bool) -> None:
    """One step's cache work: every layer's update with `nodes` new entries a row, the commit."""
    rows = len(kept)
    new = torch.zeros((rows, shape.kv_heads, nodes, shape.head_dim), dtype=shape.dtype, device=META)
    if store:
        state.store.open(nodes)
    for layer in range(shape.layers):
        state.cache.update(new, new, layer)
    if store:
        commit_stored(state, kept)
    else:
        keep_nodes(state, kept, META)


def measure(shape: KVShape, rows: int, context: int, *, store: bool, nodes: int = 16, steps: int = 4) -> Traffic:
    """The bytes of a first step and `steps` more of `rows` rows (contexts of about `context`
    tokens, slightly ragged), then of the middle row leaving and a row of `context` tokens
    joining (its prefill's cache made into the batch's: with the store, its own store first)."""
    lengths = [context - 7 * row for row in range(rows)]
    state = _prefilled(shape, lengths)
    if store:
        state = stored(state, StoreConfig())
    with TrafficCounter() as first:
        _step(shape, state, nodes, _kept(rows, steps), store)
    allocated = written = 0
    for step in range(steps):
        with TrafficCounter() as counter:
            _step(shape, state, nodes, _kept(rows, step), store)
        allocated, written = allocated + counter.allocated, written + counter.written
    keep = [row for row in range(rows) if row != rows // 2]  # at 1 row, the row leaves
    with TrafficCounter() as leaving:
        if store:
            keep_stored_rows(state, keep)
        else:
            keep_rows(state, keep, META)
    joining = _prefilled(shape, [context])
    with TrafficCounter() as join:
        if store:
            join_stored([state, stored(joining, StoreConfig())])
        else:
            join_rows([state, joining])
    return Traffic(rows, context, first.written, allocated / steps, written / steps, leaving.written, join.written)


# -- attention's reads ---------------------------------------------------------------------------


class FusedAttentionCounter(TorchFunctionMode):
    """Counts the bytes one attention call moves as a fused GPU kernel (flash, memory-efficient)
    runs it: SDPA reads its queries, keys, values and mask once and writes its output (on the
    meta device it is not run: torch would decompose it into the math kernel's matmuls). The
    copies made before it (transformers' `repeat_kv`, the fold's repeated mask) are counted by the
    TrafficCounter beside it: each is written, then read by SDPA."""

    def __init__(self) -> None:
        super().__init__()
        self.kernel_read = 0
        self.kernel_written = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        query, key, value = args[:3]
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        self.kernel_read += sum(_nbytes(t) for t in (query, key, value, mask) if t is not None)
        out = torch.empty((*query.shape[:-1], value.shape[-1]), dtype=query.dtype, device=query.device)
        self.kernel_written += _nbytes(out)
        return out


@dataclass(frozen=True)
class AttentionTraffic:
    """Bytes a step's attention moves over all layers: copies written before the kernel (each
    read again by it), and the kernel's reads; `folded`: hsd's attention (attention.py), else
    transformers' SDPA."""

    rows: int
    context: int
    folded: bool
    copied: int
    kernel_read: int

    @property
    def moved(self) -> int:
        """Bytes read and written: the copies' writes and the kernel's reads (which include them)."""
        return self.copied + self.kernel_read


def attention_traffic(shape: KVShape, rows: int, context: int, *, folded: bool, nodes: int = 16, query_heads: int = 28) -> AttentionTraffic:
    """One tree forward's attention over `rows` rows of `context` cached tokens and `nodes` nodes,
    each layer given the store's view and an additive mask as HFTarget gives them, run through
    transformers' SDPA attention or hsd's (in a tree forward)."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from hsd_cli.decoding.hf_target.attention import hsd_sdpa_forward, tree_forward

    module = SimpleNamespace(num_key_value_groups=query_heads // shape.kv_heads, is_causal=True)
    slots = context + nodes
    query = torch.zeros((rows, nodes, query_heads, shape.head_dim), dtype=shape.dtype, device=META).transpose(1, 2)
    keys = torch.zeros((rows, shape.kv_heads, slots, shape.head_dim), dtype=shape.dtype, device=META)
    mask = torch.zeros((rows, 1, nodes, slots), dtype=shape.dtype, device=META)
    copies, kernel = TrafficCounter(), FusedAttentionCounter()
    with copies, kernel, tree_forward():  # one forward: every layer given the same mask
        for _ in range(shape.layers):
            if folded:
                hsd_sdpa_forward(module, query, keys, keys, mask)
            else:
                sdpa_attention_forward(module, query, keys, keys, mask)
    # The output's reshape back to (rows, nodes, heads, dim) is the same copy on both paths.
    return AttentionTraffic(rows, context, folded, copies.written, kernel.kernel_read)
