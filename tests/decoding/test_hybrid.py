"""Hybrid models (Gated DeltaNet linear attention beside full attention, Qwen3.5's): the tree form
of the linear layers must equal reading each node's path alone, a tree forward must leave the
cache as it was, and a commit must rebuild the accepted path's states. The family's exactness
tests (tokens and logits against `generate`, sampling, rows joining and leaving) run in the other
files through `tiny_target`; here the maths, and the controls: a target that reads the tree as one
sequence, and one whose commit keeps a rejected node's state, must fail the logits checks. The fast
tier runs a whole decode with edited drafts, the one-sequence control and the footprint of a row on
the tiny model (the family's own exactness suite is in the slow tier)."""

from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

from hsd_cli.decoding.hf_target import HFTarget, load_target
from hsd_cli.decoding.hf_target.delta_tree import (
    NodeRecord, conv_sources, path_states, tree_conv, tree_gated_delta_rule, tree_parents,
)
from hsd_cli.decoding.hf_target.footprint import model_footprint
from hsd_cli.decoding.hf_target.hybrid import UnknownLinearAttentionError, linear_attention_layers
from hsd_cli.decoding.tree import batch_trees, tree_layout
from hsd_cli.models.tiny_families import build_tiny_random

from .test_cache_logits import PARENTS, largest_logit_error
from .test_exactness import (
    BRANCHING, GREEDY, PROMPT, SAME_LOGITS, edit, full_forward_logits, generate_greedy, path_to, speculative, tree_logits,
)

TREE = (-1, 0, 0, 1, 1, 2, 5)
KERNEL, CHANNELS, KEY_HEADS, HEADS, KEY_DIM, VALUE_DIM = 4, 6, 2, 4, 8, 5


def path_of(node: int, parents=TREE) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.fixture
def tree_inputs():
    generator = torch.Generator().manual_seed(0)

    def draw(*shape):
        return torch.randn(*shape, generator=generator)

    layout = tree_layout(TREE)
    ancestors, depths = torch.from_numpy(layout.ancestors)[None], torch.from_numpy(layout.depths)[None]
    width = len(TREE)
    return dict(
        ancestors=ancestors, depths=depths,
        query=draw(1, width, KEY_HEADS, KEY_DIM), key=draw(1, width, KEY_HEADS, KEY_DIM), value=draw(1, width, HEADS, VALUE_DIM),
        g=-torch.rand(1, width, HEADS, generator=generator) * 0.3, beta=torch.rand(1, width, HEADS, generator=generator),
        state=draw(1, HEADS, KEY_DIM, VALUE_DIM), conv_inputs=draw(1, CHANNELS, width), cached=draw(1, CHANNELS, KERNEL),
        weight=draw(CHANNELS, KERNEL),
    )


def sequential(inputs: dict, path: list[int]):
    """transformers' recurrent gated delta rule over one path's tokens, from the cached state."""
    pick = lambda name: inputs[name][:, path]  # noqa: E731
    return torch_recurrent_gated_delta_rule(
        pick("query"), pick("key"), pick("value"), g=pick("g"), beta=pick("beta"),
        initial_state=inputs["state"], output_final_state=True, use_qk_l2norm_in_kernel=True,
    )


def test_every_tree_node_reads_its_own_path_as_the_recurrent_rule_does(tree_inputs):
    out, keys, deltas, decays = tree_gated_delta_rule(*(tree_inputs[n] for n in ("query", "key", "value", "g", "beta", "ancestors", "state")))
    for node in range(len(TREE)):
        expected, _ = sequential(tree_inputs, path_of(node))
        assert (out[0, node] - expected[0, -1]).abs().max().item() < 1e-5
    # The control: the tree read as one sequence (every earlier node an ancestor) is another rule.
    chain = torch.ones(len(TREE), len(TREE), dtype=torch.bool).tril()[None]
    wrong, *_ = tree_gated_delta_rule(*(tree_inputs[n] for n in ("query", "key", "value", "g", "beta")), chain, tree_inputs["state"])
    assert (wrong - out).abs().max().item() > 0.1


@pytest.mark.parametrize("paths", [[[0, 2, 5, 6]], [[0, 1, 4]], [[0]]])
def test_a_commit_rebuilds_the_state_after_the_accepted_path(tree_inputs, paths):
    _, keys, deltas, decays = tree_gated_delta_rule(*(tree_inputs[n] for n in ("query", "key", "value", "g", "beta", "ancestors", "state")))
    record = NodeRecord(tree_inputs["conv_inputs"], keys, deltas, decays)
    state, conv = path_states(record, tree_inputs["state"], tree_inputs["cached"], torch.tensor(paths), torch.tensor([len(paths[0])]))
    _, expected = sequential(tree_inputs, paths[0])
    assert (state - expected).abs().max().item() < 1e-5
    kept_inputs = torch.cat([tree_inputs["cached"], tree_inputs["conv_inputs"][:, :, paths[0]]], dim=-1)
    assert torch.equal(conv, kept_inputs[..., -KERNEL:])


def test_rows_of_different_path_lengths_commit_together(tree_inputs):
    """A batch commits every row's path at once, the shorter ones padded."""
    names = ("query", "key", "value", "g", "beta", "conv_inputs")
    doubled = {n: torch.cat([tree_inputs[n]] * 2) for n in (*names, "ancestors", "state", "cached")}
    _, keys, deltas, decays = tree_gated_delta_rule(*(doubled[n] for n in ("query", "key", "value", "g", "beta", "ancestors", "state")))
    record = NodeRecord(doubled["conv_inputs"], keys, deltas, decays)
    state, conv = path_states(record, doubled["state"], doubled["cached"], torch.tensor([[0, 1, 3], [0, 0, 0]]), torch.tensor([3, 1]))
    for row, path in enumerate([[0, 1, 3], [0]]):
        _, expected = sequential(tree_inputs, path)
        assert (state[row] - expected[0]).abs().max().item() < 1e-5
        assert torch.equal(conv[row], torch.cat([tree_inputs["cached"], tree_inputs["conv_inputs"][:, :, path]], -1)[0, :, -KERNEL:])
    # A row that keeps no node (as `hsd profile` puts a measured forward back) keeps its states.
    state, conv = path_states(record, doubled["state"], doubled["cached"], torch.tensor([[0, 1], [0, 0]]), torch.tensor([2, 0]))
    assert torch.equal(state[1], doubled["state"][1]) and torch.equal(conv[1], doubled["cached"][1])


def test_each_nodes_conv_window_is_its_ancestors_then_the_cached_inputs(tree_inputs):
    parents = tree_parents(tree_inputs["ancestors"], tree_inputs["depths"])
    assert parents.tolist() == [list(TREE)]
    sources = conv_sources(parents, tree_inputs["depths"], KERNEL)
    out = tree_conv(tree_inputs["conv_inputs"], tree_inputs["cached"], sources, tree_inputs["weight"], None)
    for node in range(len(TREE)):
        sequence = torch.cat([tree_inputs["cached"], tree_inputs["conv_inputs"][:, :, path_of(node)]], dim=-1)
        expected = torch.nn.functional.conv1d(sequence, tree_inputs["weight"][:, None], groups=CHANNELS)[:, :, -1]
        assert (out[:, :, node] - expected).abs().max().item() < 1e-5


def test_a_linear_attention_layer_of_another_layout_is_refused():
    class Qwen3NextGatedDeltaNet(torch.nn.Module):  # fuses q, k, v and z into one projection
        in_proj_qkvz = torch.nn.Linear(2, 2)

    with pytest.raises(UnknownLinearAttentionError, match="lacks in_proj_qkv"):
        linear_attention_layers(torch.nn.Sequential(Qwen3NextGatedDeltaNet()))


# -- on the tiny Qwen3.5 and MiniCPM models -------------------------------------------------


# The families over Qwen3.5's hybrid text model: its own, and MiniCPM's (1-D and canvas positions).
@pytest.fixture(scope="module", params=["qwen3_5", "minicpm_ocr", "minicpmv4_6", "minicpmv4_7"])
def hybrid(request, tmp_path_factory):
    family = request.param
    return load_target(str(build_tiny_random(family, tmp_path_factory.mktemp(family))), device="cpu", dtype="float32")


def linear_states(state) -> list[torch.Tensor]:
    return [s.clone() for layer in state.cache.layers if hasattr(layer, "recurrent_states") for s in (layer.conv_states[0], layer.recurrent_states[0])]


class SequentialReadTarget(HFTarget):
    """The linear-attention layers' own forward over a tree: its nodes read as one sequence."""

    def _linear_tree_form(self, ancestors, depths):
        return nullcontext()


class KeepsARejectedNodeTarget(HFTarget):
    """The linear layers keep the state after the tree's last node (test_cache_logits' trees),
    whether it was accepted or not; the attention layers keep the accepted path."""

    def _linear_paths(self, kept_nodes):
        return [path_of(len(PARENTS) - 1, PARENTS)] * len(kept_nodes)


@pytest.mark.slow
def test_a_tree_forward_leaves_the_linear_states_as_they_were(hybrid, page_image):
    state, _ = hybrid.prefill(hybrid.inputs([page_image], ["Read."]))
    before = linear_states(state)
    assert len(hybrid.linear_layers) == 2 and len(before) == 4
    trees = batch_trees([BRANCHING])
    hybrid.forward_tree(state, trees.tokens, trees.depths, trees.ancestors)
    assert all(torch.equal(a, b) for a, b in zip(before, linear_states(state)))
    assert all("forward" not in vars(layer) for layer in hybrid.linear_layers), "the layers' own forward again"


def test_edited_drafts_decode_the_hybrid_to_generates_tokens(hybrid, page_image):
    """Drafts that hold for a while and then break, verified as trees through the linear layers
    and committed step after step: `generate`'s tokens."""
    length = 64
    reference = generate_greedy(hybrid, page_image, PROMPT, length)
    drafts = [edit(reference, 1, substitute=0.1, insert=0.1, delete=0.1)]
    result = speculative(hybrid, page_image, drafts, replace(GREEDY, max_new_tokens=length))
    assert result.tokens == reference
    assert result.stats.accepted > length // 3, "the drafts did get used"


def test_a_rows_cache_is_budgeted_as_attention_keys_and_values_and_fixed_linear_states(hybrid, page_image):
    """The footprint's row: keys and values per token in the attention layers only, and the linear
    layers' states whatever the length (a linear layer budgeted as attention over-budgets)."""
    target = HFTarget(hybrid.model, hybrid.processor, hybrid.adapter, kv_store=None)
    footprint = model_footprint(hybrid.model.config, "float32")
    for prompt in ("Read.", "Transcribe every word of this page, please."):
        state, _ = target.prefill(target.inputs([page_image], [prompt]))
        held = [t for layer in state.cache.layers if hasattr(layer, "keys") for t in (layer.keys, layer.values)]
        cached = sum(t.numel() * t.element_size() for t in held + linear_states(state))
        assert cached == footprint.row_bytes(int(state.past_len[0]))
    text = hybrid.model.config.text_config
    attention = text.layer_types.count("full_attention")
    assert 0 < attention < text.num_hidden_layers
    assert footprint.kv_bytes_per_token == attention * 2 * text.num_key_value_heads * text.head_dim * 4


def test_reading_the_tree_as_one_sequence_fails_the_logits_check(hybrid, page_image):
    expected = torch.stack([full_forward_logits(hybrid, page_image, path_to(BRANCHING, n)) for n in range(len(BRANCHING))])
    assert (tree_logits(hybrid, page_image, BRANCHING) - expected).abs().max().item() < SAME_LOGITS
    wrong = SequentialReadTarget(hybrid.model, hybrid.processor, hybrid.adapter)
    assert (tree_logits(wrong, page_image, BRANCHING) - expected).abs().max().item() > 100 * SAME_LOGITS


@pytest.mark.slow
def test_a_commit_that_keeps_a_rejected_nodes_state_fails_the_logits_check(hybrid, make_image):
    images = [make_image(1, 56, 56), make_image(2, 112, 84)]
    assert largest_logit_error(hybrid, images) < SAME_LOGITS
    wrong = KeepsARejectedNodeTarget(hybrid.model, hybrid.processor, hybrid.adapter)
    assert largest_logit_error(wrong, images) > 100 * SAME_LOGITS
