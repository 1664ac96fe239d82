"""The KV store written in place (kv_store.py): what each edit writes and moves, and that every
tree node's logits stay the model's own through commits that move kept nodes, a row leaving the
middle of the batch and a row joining into the place it freed."""

import pytest
import torch

from hsd_cli.bench.kv_counting import TrafficCounter
from hsd_cli.decoding.hf_target import HFTarget
from hsd_cli.decoding.hf_target.cache import BatchState
from hsd_cli.decoding.hf_target import kv_store
from hsd_cli.decoding.hf_target.kv_store import KVStore, StoreConfig, store_mask
from hsd_cli.decoding.tree import batch_trees

from .test_cache_logits import PARENTS, PROMPTS, path_tokens, step_tree
from .test_exactness import SAME_LOGITS, full_forward_logits

CPU = torch.device("cpu")
HEADS, DIM = 2, 3


def filled_store(lengths: list[int]) -> KVStore:
    """A one-layer store whose row r holds entries 100 r + slot (every head and dim), in place r."""
    store = KVStore({0: (HEADS, DIM)}, torch.float32, CPU)
    store.reserve(len(lengths), max(lengths) + kv_store.MIN_SLOTS)
    store.lengths = torch.tensor(lengths)
    for row, length in enumerate(lengths):
        entries = (100.0 * row + torch.arange(length, dtype=torch.float32))[None, :, None].expand(HEADS, -1, DIM)
        store.keys[0][row, :, :length] = entries
        store.values[0][row, :, :length] = -entries
    return store


def entries(store: KVStore, row: int) -> list[float]:
    return store.keys[0][row, 0, : int(store.lengths[row]), 0].tolist()


def node_entries(store: KVStore, width: int) -> torch.Tensor:
    """A forward's keys (node k of row r worth 1000 + 10 r + k; its values are their negatives)."""
    nodes = 1000.0 + 10.0 * torch.arange(store.rows)[:, None] + torch.arange(width)[None, :]
    return nodes[:, None, :, None].expand(-1, HEADS, -1, DIM).contiguous()


def forward_nodes(store: KVStore, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    new = node_entries(store, width)
    store.open(width)
    return store.append(0, new, -new)


def test_a_forward_writes_its_nodes_after_each_rows_entries_and_attention_sees_views():
    store = filled_store([3, 5])
    new = node_entries(store, 2)
    negated = -new
    with TrafficCounter(CPU) as counter:
        store.open(2)
        keys, values = store.append(0, new, negated)
    assert keys.shape == (2, HEADS, 5 + 2, DIM) and keys.untyped_storage().data_ptr() == store.keys[0].untyped_storage().data_ptr()
    assert keys[0, 0, :5, 0].tolist() == [0, 1, 2, 1000, 1001] and keys[1, 0, :, 0].tolist() == [100, 101, 102, 103, 104, 1010, 1011]
    assert torch.equal(values, -keys)
    # The nodes written (keys and values, 2 rows of 2), nothing allocated, nothing of the context.
    assert counter.allocated == 0 and counter.written == 2 * 2 * 2 * HEADS * DIM * 4


def test_a_commit_moves_the_kept_nodes_only_where_they_are_not_the_trees_first():
    store = filled_store([3, 5])
    forward_nodes(store, 6)
    with TrafficCounter(CPU) as counter:
        store.keep_nodes([[0, 1], [0, 2, 5]])
    assert entries(store, 0) == [0, 1, 2, 1000, 1001]
    assert entries(store, 1) == [100, 101, 102, 103, 104, 1010, 1012, 1015]
    moved = 3 * HEADS * DIM * 4  # one row's path, keys and values, read into a temporary and written
    assert (counter.allocated, counter.written) == (2 * moved, 2 * 2 * moved), "a path's length, not the context"
    forward_nodes(store, 6)
    with TrafficCounter(CPU) as counter:
        store.keep_nodes([[0], [0, 1, 2]])
    assert counter.written == 0 and entries(store, 1)[-3:] == [1010, 1011, 1012]


def test_rows_moving_paths_of_different_lengths_beside_rows_that_keep_nothing_or_their_first_nodes():
    # The moves of every moving row are laid out at once, padded to the longest path: each row
    # must get its own path's entries, in order, and nothing of the padding.
    store = filled_store([2, 4, 3, 1])
    forward_nodes(store, 7)
    gained = store.keep_nodes([[0, 3, 6], [], [0, 1, 2], [0, 2]])
    assert gained.tolist() == [3, 0, 3, 2] and store.lengths.tolist() == [5, 4, 6, 3]
    assert entries(store, 0) == [0, 1, 1000, 1003, 1006]
    assert entries(store, 1) == [100, 101, 102, 103]
    assert entries(store, 2) == [200, 201, 202, 1020, 1021, 1022]
    assert entries(store, 3) == [300, 1030, 1032]
    assert torch.equal(store.values[0][0, :, :5], -store.keys[0][0, :, :5])


def test_a_row_leaving_frees_its_place_for_the_last_row_and_a_joining_row_takes_the_next():
    store = filled_store([3, 4, 5, 6])
    with TrafficCounter(CPU) as counter:
        order = store.keep_rows([0, 2, 3])
    assert order == [0, 3, 2], "the last row fills the freed place, the others stay"
    assert [entries(store, place) for place in range(3)] == [[0, 1, 2], [300, 301, 302, 303, 304, 305], [200, 201, 202, 203, 204]]
    assert counter.written == 2 * 2 * 6 * HEADS * DIM * 4, "one row moved"
    joining = filled_store([2])
    places = store.places
    with TrafficCounter(CPU) as counter:
        store.join(joining)
    assert store.places == places and entries(store, 3) == [0, 1] and entries(store, 0) == [0, 1, 2]
    assert counter.written == 2 * 2 * HEADS * DIM * 4, "the joining row's entries only"
    # A row copied into several places (as `hsd profile` makes rows); a store grown: places
    # doubled, slots to the power of two that holds what is needed where that is more.
    store.keep_rows([1, 1])
    assert entries(store, 0) == entries(store, 1) == [300, 301, 302, 303, 304, 305]
    slots = store.slots
    store.reserve(5, 3 * slots)
    assert (store.places, store.slots) == (8, 4 * slots) and entries(store, 1) == [300, 301, 302, 303, 304, 305]


def prefilled(lengths: list[int]) -> BatchState:
    """A prefill's state: rows of `lengths` entries (row r's worth 100 r + position) left-padded."""
    from transformers import DynamicCache

    longest = max(lengths)
    valid = torch.arange(longest)[None, :] >= torch.tensor([longest - n for n in lengths])[:, None]
    entries = torch.stack([100.0 * row + torch.arange(longest) - (longest - n) for row, n in enumerate(lengths)])
    entries = entries[:, None, :, None].expand(-1, HEADS, -1, DIM).contiguous()
    cache = DynamicCache()
    cache.update(entries, -entries, 0)
    return BatchState(cache, valid, torch.tensor(lengths), torch.zeros(len(lengths), dtype=torch.long), list(range(len(lengths))))


def test_a_prefill_without_padding_is_taken_over_and_a_padded_one_written_from_slot_0():
    alone = prefilled([4])
    with TrafficCounter(CPU) as counter:
        state = kv_store.stored(alone, StoreConfig())
    assert counter.written == 0 and state.store.keys[0] is alone.cache.layers[0].keys
    assert entries(state.store, 0) == [0, 1, 2, 3]
    padded = kv_store.stored(prefilled([2, 4]), StoreConfig())
    assert [entries(padded.store, row) for row in (0, 1)] == [[0, 1], [100, 101, 102, 103]]
    assert padded.store.slots >= 4 + kv_store.MIN_SLOTS, "room for the first forwards"
    joined = kv_store.join_stored([state, padded])
    assert joined.rows == [0, 0, 1] and [entries(joined.store, row) for row in range(3)] == [[0, 1, 2, 3], [0, 1], [100, 101, 102, 103]]
    assert joined.store.slots >= 4 + kv_store.MIN_SLOTS


def test_a_budget_is_allocated_at_the_first_growth_and_never_doubled_past():
    store = KVStore({0: (HEADS, DIM)}, torch.float32, CPU, budget=100)
    store.reserve(2, 10)
    assert (store.places, store.slots) == (2, 100)
    store.reserve(2, 90)
    assert store.slots == 100
    store.reserve(2, 150)  # a row longer than the budget: growing again
    assert store.slots == 256
    unbudgeted = KVStore({0: (HEADS, DIM)}, torch.float32, CPU)
    unbudgeted.reserve(2, 10)
    assert unbudgeted.slots == 16, "the next power of two"
    unbudgeted.reserve(2, 17)
    assert unbudgeted.slots == 32


def test_the_mask_opens_each_rows_entries_and_its_nodes_ancestors_only():
    lengths = torch.tensor([1, 3])
    visibility = torch.tensor([[[True, False], [True, True]], [[True, False], [False, True]]])
    mask = store_mask(lengths, visibility, torch.float32, CPU)
    low = torch.finfo(torch.float32).min
    expected = torch.tensor([
        [[0, 0, low, low, low], [0, 0, 0, low, low]],  # row 0: 1 entry, its 2 nodes, then row 1's longer slots
        [[0, 0, 0, 0, low], [0, 0, 0, low, 0]],
    ])[:, None]
    assert torch.equal(mask, expected)


@pytest.fixture
def store_target(tiny_target):
    return HFTarget(tiny_target.model, tiny_target.processor, tiny_target.adapter, kv_store=StoreConfig())


def largest_logit_error(target, images, prompts, kept_steps, leave_after=None, join=None) -> float:
    """Run trees over rows of `images`/`prompts`, committing `kept_steps`; after step
    `leave_after` the middle row leaves and `join` (image, prompt) joins. The largest error of any
    node's logits against the model's own forward over the row's prompt, commits and path."""
    state, _ = target.prefill_each([target.inputs([image], [prompt]) for image, prompt in zip(images, prompts)])
    rows = {row: (images[row], prompts[row], []) for row in range(len(images))}
    error = 0.0
    for step, kept in enumerate(kept_steps):
        trees = [step_tree(step, row) for row in state.rows]
        batch = batch_trees(trees)
        logits = target.forward_tree(state, batch.tokens, batch.depths, batch.ancestors).reshape(len(trees), batch.width, -1)
        for position, (row, tree) in enumerate(zip(state.rows, trees)):
            image, prompt, committed = rows[row]
            for node in range(len(tree)):
                expected = full_forward_logits(target, image, committed + path_tokens(tree, node), prompt)
                error = max(error, (logits[position, node] - expected).abs().max().item())
        target.commit(state, batch.width, [kept[row % len(kept)] for row in state.rows])
        for row, tree in zip(state.rows, trees):
            rows[row][2].extend(tree.tokens[node] for node in kept[row % len(kept)])
        if step == leave_after:
            target.keep_rows(state, [position for position, row in enumerate(state.rows) if row != 1])
            joining, _ = target.prefill(target.inputs([join[0]], [join[1]]))
            joining.rows = [len(rows)]
            rows[len(rows)] = (*join, [])
            state = target.join([state, joining])
    return error


def test_logits_through_moved_nodes_a_row_leaving_and_a_row_joining_its_place(store_target, make_image, monkeypatch):
    images = [make_image(1, 56, 56), make_image(2, 112, 84), make_image(3, 84, 112)]
    prompts = [*PROMPTS, "Read the page."]
    # Paths off the first branch (moved), the tree's first nodes (not moved), of different lengths.
    kept = [[[0, 2, 5], [0], [0, 2, 5, 6]], [[0, 1, 3], [0, 1, 4]], [[0, 1], [0]]]
    join = (make_image(4, 56, 112), "Transcribe.")
    assert largest_logit_error(store_target, images, prompts, kept, leave_after=0, join=join) < SAME_LOGITS
    # A commit that keeps the node after each kept one must be caught.
    keep_nodes = KVStore.keep_nodes
    monkeypatch.setattr(KVStore, "keep_nodes", lambda store, nodes: keep_nodes(store, [[min(n + 1, len(PARENTS) - 1) for n in row] for row in nodes]))
    assert largest_logit_error(store_target, images, prompts, kept, leave_after=0, join=join) > 100 * SAME_LOGITS
