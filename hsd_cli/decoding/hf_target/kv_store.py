"""A KV cache written in place: per attention layer, one (places, heads, slots, head_dim) tensor
of keys and one of values, allocated for the rows in flight and reused step after step.

Row b of the batch lives at place b and holds its entries at slots [0, length_b), with no padding.
A tree forward writes each row's nodes right after its entries and attention sees the rows as
views of the store (`[:rows, :, :longest + nodes]`), a ragged additive mask hiding each row's
slots past its own entries and nodes. A commit moves a row's kept nodes down onto its first node
slots (nothing where the accepted path is the tree's first nodes, at most a path's length else);
a finished row's place is filled by the last rows of the batch (no other row moves) and a joining
row is written into the places after them. So a step writes what it adds, not the context.

Why whole rows grown by doubling rather than fixed-size pages: SDPA (and eager attention) take
one strided tensor per layer; pages would have to be gathered into one every step, the copy this
store removes. Doubling reallocates a row count or a slot count that no longer fits (amortised:
at most one more copy of each entry over a row's life), at the cost of up to half the capacity
unused.

The store knows attention layers only; any other layer of the cache (a hybrid model's
linear-attention states) stays the layer transformers made: joined as cache.py joins it,
reordered with the rows through its own `reorder_cache`, committed by the hybrid code.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from .cache import BatchState, first_nodes, join_linear_states, joined_prompt_lengths
from .delta_tree import NodeRecord

# Room a new store leaves at least past its longest row: the first forwards' nodes fit in it.
MIN_SLOTS = 64


@dataclass(frozen=True)
class StoreConfig:
    """How the KV store takes memory. `slots`: each place's entries where the caller knows a
    row's longest (serving budgets a row at its prompt plus max_new_tokens): the store allocates
    them when it first needs room and never doubles past them, so it holds what the budget
    planned. None: rows' room grows by doubling, up to twice the longest row's entries."""

    slots: int | None = None


def _room(needed: int, held: int, budget: int | None = None) -> int:
    """Capacity that holds `needed`: `held` if it does, else the budget where it fits, else the
    next power of two, at least double `held` (amortised growth: an entry is copied about once
    more over a row's life, and a new store has room for many forwards)."""
    if needed <= held:
        return held
    return budget if budget is not None and needed <= budget else max(1 << (needed - 1).bit_length(), 2 * held)


class KVStore:
    """Keys and values of the attention layers (by layer index) for the rows in flight."""

    def __init__(self, shapes: dict[int, tuple[int, int]], dtype: torch.dtype, device: torch.device, budget: int | None = None) -> None:
        self.shapes = shapes  # layer index -> (key-value heads, head_dim)
        self.budget = budget  # slots to allocate at once (StoreConfig.slots)
        self.dtype, self.device = dtype, device
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.lengths = torch.zeros(0, dtype=torch.long)  # (rows,) entries per row, on the host
        self.places, self.slots = 0, 0
        self.width = 0  # nodes of the forward in flight, written after each row's entries
        self._node_slots: torch.Tensor | None = None  # (rows, width) where they are written
        self._seen = 0  # slots the forward's views show: the longest row's entries and nodes

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def longest(self) -> int:
        return int(self.lengths.max()) if self.rows else 0

    def aligned(self) -> bool:
        """Whether every row holds as many entries (a view then shows no slot past a row's own)."""
        return bool((self.lengths == self.lengths[0]).all())

    def reserve(self, places: int, slots: int) -> None:
        """Room for `places` rows of `slots` entries; a store that has less is reallocated larger
        (doubling) and its rows copied over."""
        new_places, new_slots = _room(places, self.places), _room(slots, self.slots, self.budget)
        if (new_places, new_slots) == (self.places, self.slots):
            return
        used, longest = self.rows, self.longest
        for index, (heads, head_dim) in self.shapes.items():
            for held in (self.keys, self.values):
                grown = torch.zeros((new_places, heads, new_slots, head_dim), dtype=self.dtype, device=self.device)
                if used and longest:
                    grown[:used, :, :longest] = held[index][:used, :, :longest]
                held[index] = grown
        self.places, self.slots = new_places, new_slots

    # -- a forward ------------------------------------------------------------------------------

    def open(self, width: int) -> None:
        """Before a forward of `width` nodes per row: room for them after every row's entries."""
        self.reserve(self.rows, self.longest + width)
        self.width, self._seen = width, self.longest + width
        self._node_slots = (self.lengths[:, None] + torch.arange(width)[None, :]).to(self.device)

    def append(self, index: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a forward's (rows, heads, width, head_dim) keys and values after each row's
        entries; return views of every row's slots up to the longest row's entries and nodes."""
        rows, heads, width, head_dim = keys.shape
        if self._node_slots is None or (rows, width) != tuple(self._node_slots.shape):
            raise RuntimeError(f"the store was opened for {self.rows} rows of {self.width} nodes, not {rows} of {width}")
        where = self._node_slots[:, None, :, None].expand(rows, heads, width, head_dim)
        self.keys[index][:rows].scatter_(2, where, keys)
        self.values[index][:rows].scatter_(2, where, values)
        return self.keys[index][:rows, :, : self._seen], self.values[index][:rows, :, : self._seen]

    # -- between forwards -----------------------------------------------------------------------

    def keep_nodes(self, kept_nodes: Sequence[Sequence[int]]) -> torch.Tensor:
        """Keep, per row, the entries of `kept_nodes` (tree node indices, ascending: a path)
        after its entries; moves only the rows whose kept nodes are not the tree's first.
        Returns the entries each row gained, (rows,)."""
        counts = [len(nodes) for nodes in kept_nodes]
        moving = [row for row, (nodes, count) in enumerate(zip(kept_nodes, counts)) if not first_nodes(nodes, count)]
        if moving:
            sources, targets = _moves([kept_nodes[row] for row in moving], [counts[row] for row in moving])
            start = self.lengths[moving][:, None]
            sources, targets = (start + sources).to(self.device), (start + targets).to(self.device)
            places = torch.tensor(moving)[:, None].expand_as(sources).to(self.device)
            for held in (*self.keys.values(), *self.values.values()):
                # Advanced indices on places and slots: (moving, longest, heads, head_dim), a path's length a row.
                held[places, :, targets] = held[places, :, sources]
        gained = torch.tensor(counts, dtype=torch.long)
        self.lengths = self.lengths + gained
        self.width, self._node_slots = 0, None
        return gained

    def keep_rows(self, keep: Sequence[int]) -> list[int]:
        """Keep the rows at positions `keep`; return their new order (old positions, place by
        place). Rows that stay below the new row count keep their places; the others move into
        the places freed. A repeated position gets a copy of the row in each place."""
        order = _filled_holes(list(keep))
        self.reserve(len(order), self.slots)
        moves = [(place, row) for place, row in enumerate(order) if place != row]
        if moves:
            targets = torch.tensor([place for place, _ in moves], device=self.device)
            sources = torch.tensor([row for _, row in moves], device=self.device)
            longest = int(self.lengths[[row for _, row in moves]].max())
            for held in (*self.keys.values(), *self.values.values()):
                held[:, :, :longest].index_copy_(0, targets, held[sources, :, :longest])
        self.lengths = self.lengths[order]
        return order

    def join(self, other: KVStore) -> None:
        """Write the rows of `other` into the places after this store's rows."""
        rows, longest = self.rows, other.longest
        self.reserve(rows + other.rows, max(self.slots, longest))
        for index in self.shapes:
            self.keys[index][rows : rows + other.rows, :, :longest] = other.keys[index][: other.rows, :, :longest]
            self.values[index][rows : rows + other.rows, :, :longest] = other.values[index][: other.rows, :, :longest]
        self.lengths = torch.cat([self.lengths, other.lengths])

    def write_prefill(self, index: int, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> None:
        """Write a left-padded prefill's (rows, heads, slots, head_dim) entries of one layer,
        row b's last `lengths[b]` slots, at the start of row b's place."""
        for row, length in enumerate(lengths.tolist()):
            self.keys[index][row, :, :length] = keys[row, :, keys.shape[2] - length :]
            self.values[index][row, :, :length] = values[row, :, values.shape[2] - length :]


def _moves(kept_nodes: Sequence[Sequence[int]], counts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, longest) node indices to copy from and to, per row its kept nodes onto the first
    node slots; padding entries copy a row's own first node slot onto itself. Laid out for all
    rows at once (a step's paths off their first branch can be every row's)."""
    counts_array = np.array(counts)
    kept = np.arange(max(counts)) < counts_array[:, None]
    sources = np.zeros(kept.shape, dtype=np.int64)
    sources[kept] = np.fromiter(itertools.chain.from_iterable(kept_nodes), dtype=np.int64)
    targets = np.where(kept, np.arange(kept.shape[1]), 0)
    return torch.from_numpy(sources), torch.from_numpy(targets)


def _filled_holes(keep: list[int]) -> list[int]:
    """The order of the kept rows in their places: each kept row below len(keep) stays, the
    others fill the places left free, lowest first. Repeated or unordered positions: as given."""
    if len(set(keep)) != len(keep) or keep != sorted(keep):
        return keep
    count = len(keep)
    staying = {row for row in keep if row < count}
    movers = iter(row for row in keep if row >= count)
    return [place if place in staying else next(movers) for place in range(count)]


# ----------------------------------------------------------------------------------------------
# transformers' side: the cache the model sees


@cache
def _store_layer_class() -> type:
    from transformers.cache_utils import CacheLayerMixin

    class StoreLayer(CacheLayerMixin):
        """One attention layer of a KVStore, as transformers' attention calls it: `update` writes
        in place and returns views."""

        is_sliding = False

        def __init__(self, store: KVStore, index: int) -> None:
            super().__init__()
            self.store, self.index, self.is_initialized = store, index, True

        def lazy_initialization(self, key_states, value_states) -> None:
            """Nothing: the store is allocated before the forward."""

        def update(self, key_states, value_states, *args, **kwargs):
            return self.store.append(self.index, key_states, value_states)

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.store.longest + query_length, 0

        def get_seq_length(self) -> int:
            return self.store.longest

        def get_max_length(self) -> int:
            return -1

    return StoreLayer


def store_cache(store: KVStore, layers: Sequence[object]):
    """A transformers `Cache` whose attention layers write into `store`; `layers` (the prefill's
    cache layers) give the others, kept as they are."""
    from transformers.cache_utils import Cache

    layer = _store_layer_class()
    return Cache(layers=[layer(store, index) if index in store.shapes else kept for index, kept in enumerate(layers)])


@dataclass
class StoreState:
    """Rows being decoded with their cache in a KVStore: `HFTarget`'s batch state with the store on."""

    cache: object  # the transformers Cache the model is given
    store: KVStore
    past_len: torch.Tensor  # (B,) long, real tokens per row (= next text position)
    rope_delta: torch.Tensor  # (B,) long
    rows: list[int]  # the caller's index of each row still in the batch
    # A hybrid model's tree forward: what its linear-attention layers' commit rebuilds their
    # states from (cache.py's `commit_linear_states`), as BatchState keeps it.
    linear_records: dict[int, NodeRecord] | None = None
    prompt_len: torch.Tensor | None = None  # (B,) long, as BatchState keeps it


def stored(state: BatchState, config: StoreConfig) -> StoreState:
    """A prefill's state with its attention layers' entries in a new store (padding left out)
    and its other layers kept. Rows without padding (a row prefilled alone, as pages and crops
    are) are a store as they are: their tensors are taken over, not copied, and a join copies
    them once into the running store."""
    from transformers.cache_utils import DynamicLayer

    layers = state.cache.layers
    attention = {index: layer for index, layer in enumerate(layers) if type(layer) is DynamicLayer}
    first = next(iter(attention.values())).keys
    shapes = {i: (layer.keys.shape[1], layer.keys.shape[3]) for i, layer in attention.items()}
    store = KVStore(shapes, first.dtype, first.device, config.slots)
    lengths = state.slot_valid.sum(-1)
    if not all(bool(valid[valid.shape[0] - n :].all()) for valid, n in zip(state.slot_valid, lengths.tolist())):
        raise ValueError("a prefill's rows must be left-padded: real slots last")
    if bool(state.slot_valid.all()):
        for index, layer in attention.items():
            store.keys[index], store.values[index] = layer.keys, layer.values
        store.places, store.slots = state.slot_valid.shape
    else:
        store.reserve(len(lengths), int(lengths.max()) + MIN_SLOTS)
        for index, layer in attention.items():
            store.write_prefill(index, layer.keys, layer.values, lengths)
    store.lengths = lengths.clone()
    return StoreState(store_cache(store, layers), store, state.past_len, state.rope_delta, state.rows, prompt_len=state.prompt_len)


# The store's tensors are made in inference mode (prefill, forward), so the edits below run in it too.
@torch.inference_mode()
def join_stored(parts: Sequence[StoreState]) -> StoreState:
    """The rows of `parts` in one batch: the first part's store takes the others' rows."""
    joined = parts[0]
    # Room for every joining row and the next forwards' nodes at once: one reallocation at most.
    joined.store.reserve(sum(part.store.rows for part in parts), max(part.store.longest for part in parts) + MIN_SLOTS)
    for part in parts[1:]:
        joined.store.join(part.store)
    join_linear_states(joined.cache, [part.cache for part in parts])
    joined.past_len = torch.cat([part.past_len for part in parts])
    joined.rope_delta = torch.cat([part.rope_delta.reshape(-1) for part in parts])
    joined.prompt_len = joined_prompt_lengths(parts)
    joined.rows = [row for part in parts for row in part.rows]
    return joined


@torch.inference_mode()
def commit_stored(state: StoreState, kept_nodes: Sequence[Sequence[int]]) -> None:
    """Keep, per row, the entries of `kept_nodes` (tree node indices); drop the rest."""
    state.past_len = state.past_len + state.store.keep_nodes(kept_nodes)


@torch.inference_mode()
def keep_stored_rows(state: StoreState, keep: Sequence[int]) -> None:
    """Drop finished rows; the rows kept may take another order (`state.rows` gives it)."""
    order = state.store.keep_rows(keep)
    index = torch.tensor(order, dtype=torch.long)
    for position, layer in enumerate(state.cache.layers):
        if position not in state.store.shapes:
            layer.reorder_cache(index)
    state.past_len = state.past_len[index]
    state.rope_delta = state.rope_delta[index]
    state.prompt_len = None if state.prompt_len is None else state.prompt_len[index]
    state.rows = [state.rows[i] for i in order]


def store_mask(lengths: torch.Tensor, visibility: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(B, 1, K, longest + K) additive mask over the store's views: 0 where a node sees one of its
    row's entries (slots below `lengths`, (B,)) or a tree node it may (`visibility`, (B, K, K),
    at slots lengths[b] + k), the dtype's lowest elsewhere (other rows' slots past this row's)."""
    rows, width = visibility.shape[0], visibility.shape[1]
    seen = int(lengths.max()) + width
    offset = torch.arange(seen, device=device)[None, :] - lengths.to(device)[:, None]  # (B, seen): slot - length
    cached = offset < 0
    tree_slot = (offset >= 0) & (offset < width)
    node_sees = visibility.to(device).gather(2, offset.clamp(0, width - 1)[:, None, :].expand(rows, width, seen))
    visible = cached[:, None, :] | (tree_slot[:, None, :] & node_sees)
    zero, lowest = torch.zeros((), dtype=dtype, device=device), torch.finfo(dtype).min
    return torch.where(visible, zero, lowest)[:, None]
