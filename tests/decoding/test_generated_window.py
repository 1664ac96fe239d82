"""Unlimited-OCR's window over generated tokens (generated_window.py): every tree node's logits,
long after the window has started leaving tokens out, must equal the model's own (its cache told
where the prompt ends, as `generate` tells it); a target whose masks leave the window out must fail
that; and the mask helpers hide exactly the generated tokens older than the window."""

import pytest
import torch
from transformers import UnlimitedOcrTextConfig

from hsd_cli.decoding.hf_target import HFTarget, StoreConfig, load_target
from hsd_cli.decoding.hf_target.generated_window import generated_window, hide_outside_window, window_hides
from hsd_cli.decoding.tree import TokenTree, batch_trees
from hsd_cli.models.tiny_families import build_tiny_random
from hsd_cli.models.tiny_families.unlimited_ocr import WINDOW

from .test_exactness import BRANCHING, PROMPT, SAME_LOGITS, full_forward_all_logits, full_forward_logits, path_to

CHAIN = 3 * WINDOW + 5  # committed tokens: the window has left out most of them


@pytest.fixture(scope="module", params=[None, StoreConfig()], ids=["cache", "kv_store"])
def window_target(request, tmp_path_factory):
    model_dir = tmp_path_factory.getbasetemp() / "unlimited_ocr_window"
    if not model_dir.exists():
        build_tiny_random("unlimited_ocr", model_dir)
    return load_target(str(model_dir), device="cpu", dtype="float32", kv_store=request.param)


class NoWindowTarget(HFTarget):
    """Masks as for a model without the window: every generated token stays in sight."""

    def _windowed(self, state, mask, depths):
        return mask

    def _window_hides(self, state, depths):
        return False


def chain_then_tree_logits(target, image):
    """Prefill, a chain of CHAIN tokens in one forward (committed), then BRANCHING: the chain's
    and the tree's logits, (CHAIN, V) and (nodes, V)."""
    chain = [200 + 7 * i % 500 for i in range(CHAIN)]
    state, _ = target.prefill(target.inputs([image], [PROMPT]))
    link = batch_trees([TokenTree(tuple(chain), tuple(range(-1, CHAIN - 1)))])
    chain_logits = target.forward_tree(state, link.tokens, link.depths, link.ancestors)
    target.commit(state, link.width, [list(range(CHAIN))])
    tree = batch_trees([BRANCHING])
    return chain, chain_logits, target.forward_tree(state, tree.tokens, tree.depths, tree.ancestors)


@pytest.mark.slow
def test_tree_logits_past_the_window_equal_the_models_own(window_target, page_image):
    assert window_target.window == WINDOW
    chain, chain_logits, tree_logits = chain_then_tree_logits(window_target, page_image)
    expected_chain = full_forward_all_logits(window_target, page_image, chain)[-CHAIN:]
    assert (chain_logits - expected_chain).abs().max().item() < SAME_LOGITS
    expected = torch.stack([full_forward_logits(window_target, page_image, chain + path_to(BRANCHING, n)) for n in range(len(BRANCHING))])
    assert (tree_logits - expected).abs().max().item() < SAME_LOGITS


@pytest.mark.slow
def test_masks_without_the_window_are_detected(window_target, page_image):
    wrong = NoWindowTarget(window_target.model, window_target.processor, window_target.adapter, kv_store=window_target.kv_store)
    chain, chain_logits, tree_logits = chain_then_tree_logits(wrong, page_image)
    expected = torch.stack([full_forward_logits(wrong, page_image, chain + path_to(BRANCHING, n)) for n in range(len(BRANCHING))])
    assert (tree_logits - expected).abs().max().item() > 100 * SAME_LOGITS


def test_the_window_comes_from_reference_sliding_layers_only():
    assert generated_window(UnlimitedOcrTextConfig(sliding_window=8, num_hidden_layers=2)) == 8
    mixed = UnlimitedOcrTextConfig(sliding_window=8, num_hidden_layers=2, layer_types=["reference_sliding_attention", "full_attention"])
    with pytest.raises(ValueError, match="some layers only"):
        generated_window(mixed)
    assert generated_window(UnlimitedOcrTextConfig(num_hidden_layers=2, layer_types=["full_attention"] * 2)) is None


def test_a_node_loses_exactly_the_generated_tokens_older_than_the_window():
    # A row of 3 prompt tokens and 6 generated ones (text indices 0..8), two nodes at 9 and 10.
    prompt_len, window = torch.tensor([3]), 4
    columns = torch.arange(11)[None, :]
    nodes = torch.tensor([[9, 10]])
    mask = torch.zeros(1, 1, 2, 11)
    hidden = hide_outside_window(mask, columns, nodes, prompt_len, window)[0, 0] < 0
    # Node 9 sees the prompt and 6..9; node 10 the prompt and 7..10.
    assert hidden[0].nonzero().flatten().tolist() == [3, 4, 5]
    assert hidden[1].nonzero().flatten().tolist() == [3, 4, 5, 6]
    assert window_hides(nodes, prompt_len, window)
    assert not window_hides(torch.tensor([[6]]), prompt_len, window)  # 6 - 4 < 3: all in sight
