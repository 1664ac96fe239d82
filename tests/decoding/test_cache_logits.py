"""After commits that gather accepted nodes out of a tree, after cache compaction and in a
left-padded batch, every tree node's logits must equal the model's own forward over the row's
prompt + committed tokens + the node's path. A commit that keeps the wrong slots must fail this."""

from types import SimpleNamespace

import pytest
import torch

from hsd_cli.decoding.hf_target import cache
from hsd_cli.decoding.hf_target import HFTarget
from hsd_cli.decoding.tree import TokenTree, batch_trees

from .test_exactness import SAME_LOGITS, full_forward_logits

#        0
#      /   \
#     1     2
#    / \    |
#   3   4   5
#           |
#           6
PARENTS = (-1, 0, 0, 1, 1, 2, 5)
# Per step, the nodes each row keeps: off the first branch (a gather, not a slice), of different
# lengths per row (so rows get padding slots), the last step only checks.
KEPT = [[[0, 2, 5], [0]], [[0, 1, 3], [0, 2, 5, 6]], None]
PROMPTS = ["Read.", "Transcribe every word of this page, please."]  # different lengths: left padding


def step_tree(step: int, row: int) -> TokenTree:
    root = 40 + 10 * step + row
    return TokenTree((root, *(100 + 20 * step + 3 * row + node for node in range(1, len(PARENTS)))), PARENTS)


def path_tokens(tree: TokenTree, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(tree.tokens[node])
        node = tree.parents[node]
    return path[::-1]


# The cache edits as they are, wrapped by the tests below.
GATHER_KEPT, COMPACT = cache.gather_kept, cache.compact


class CompactingTarget(HFTarget):
    """Compacts the cache after every commit that leaves padding."""

    def commit(self, state, width, kept_nodes):
        super().commit(state, width, kept_nodes)
        if (~state.slot_valid).any():
            cache.compact(state, self.device)


def counted_cache_edits(monkeypatch, off_by_one: bool = False) -> dict[str, int]:
    """Counts the gathers of accepted nodes and the compactions; `off_by_one` keeps the entry of
    the node after each accepted node (a wrong gather). Reordering the right entries would not be
    wrong: attention does not care where a rotated key sits."""
    counts = {"gathers": 0, "compactions": 0}

    def gather_kept(state, old_len, index):
        counts["gathers"] += 1
        GATHER_KEPT(state, old_len, (index + 1).clamp(max=len(PARENTS) - 1) if off_by_one else index)

    def compact(state, device):
        counts["compactions"] += 1
        assert (~state.slot_valid).any(), "compaction with no padding to squeeze out tests nothing"
        COMPACT(state, device)

    monkeypatch.setattr(cache, "gather_kept", gather_kept)
    monkeypatch.setattr(cache, "compact", compact)
    return counts


def largest_logit_error(target, images) -> float:
    """Run the KEPT steps on a two-row batch; the largest error over every node of every step."""
    state, _ = target.prefill(target.inputs(images, PROMPTS))
    committed = [[], []]
    error = 0.0
    for step, kept in enumerate(KEPT):
        trees = [step_tree(step, row) for row in range(2)]
        batch = batch_trees(trees)
        logits = target.forward_tree(state, batch.tokens, batch.depths, batch.ancestors).reshape(2, batch.width, -1)
        for row, tree in enumerate(trees):
            for node in range(len(tree)):
                expected = full_forward_logits(target, images[row], committed[row] + path_tokens(tree, node), PROMPTS[row])
                error = max(error, (logits[row, node] - expected).abs().max().item())
        if kept is not None:
            target.commit(state, batch.width, kept)
            for row, nodes in enumerate(kept):
                committed[row] += [trees[row].tokens[n] for n in nodes]
    return error


def test_logits_after_gathering_commits_and_compaction_in_a_padded_batch(tiny_target, make_image, monkeypatch):
    images = [make_image(1, 56, 56), make_image(2, 112, 84)]
    target = CompactingTarget(tiny_target.model, tiny_target.processor, tiny_target.adapter)
    right = counted_cache_edits(monkeypatch)
    assert largest_logit_error(target, images) < SAME_LOGITS
    assert right == {"gathers": 2, "compactions": 2}
    wrong = counted_cache_edits(monkeypatch, off_by_one=True)
    assert largest_logit_error(target, images) > 100 * SAME_LOGITS, "a commit that keeps the wrong slots must be caught"
    assert wrong["gathers"] == 2


def test_padding_nodes_get_no_logits_and_the_valid_nodes_their_own(tiny_target, make_image, monkeypatch):
    """Rows of different widths: the output layer runs on the trees' nodes only, and each node's
    logits are the model's own forward's."""
    images = [make_image(1, 56, 56), make_image(2, 112, 84)]
    state, _ = tiny_target.prefill(tiny_target.inputs(images, PROMPTS))
    trees = [step_tree(0, 0).first(3), step_tree(0, 1)]
    batch = batch_trees(trees)
    head = tiny_target.model.get_output_embeddings()
    seen = []
    counting = head.register_forward_hook(lambda module, args, output: seen.append(args[0].shape[:-1].numel()))
    try:
        logits = tiny_target.forward_tree(state, batch.tokens, batch.depths, batch.ancestors, batch.valid)
    finally:
        counting.remove()
    assert logits.shape[0] == 3 + len(PARENTS) and seen == [3 + len(PARENTS)]
    assert not head._forward_pre_hooks, "the output layer is left as it was"
    rows = logits.split([len(tree) for tree in trees])
    error = max(
        (rows[row][node] - full_forward_logits(tiny_target, images[row], path_tokens(tree, node), PROMPTS[row])).abs().max().item()
        for row, tree in enumerate(trees) for node in range(len(tree))
    )
    assert error < SAME_LOGITS
    # A model without an output embeddings module: the whole batch's logits, the valid nodes' kept.
    monkeypatch.setattr(tiny_target.model, "get_output_embeddings", lambda: None)
    state, _ = tiny_target.prefill(tiny_target.inputs(images, PROMPTS))
    unhooked = tiny_target.forward_tree(state, batch.tokens, batch.depths, batch.ancestors, batch.valid)
    assert unhooked.shape == logits.shape and (unhooked - logits).abs().max().item() < SAME_LOGITS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_additive_mask_opens_a_nodes_cached_slots_and_tree_nodes_only(dtype):
    on_cpu = SimpleNamespace(dtype=dtype, device=torch.device("cpu"))
    slot_valid = torch.tensor([[False, True, True], [True, True, False]])  # row 0 left-padded, row 1 a dropped slot
    visibility = torch.tensor([[[True, False], [True, True]], [[True, False], [False, True]]])
    mask = HFTarget._additive_mask(on_cpu, slot_valid, visibility)
    low = torch.finfo(dtype).min
    expected = torch.tensor([
        [[low, 0, 0, 0, low], [low, 0, 0, 0, 0]],
        [[0, 0, low, 0, low], [0, 0, low, low, 0]],
    ], dtype=dtype)[:, None]
    assert mask.dtype == dtype and torch.equal(mask, expected)
