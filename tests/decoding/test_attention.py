"""hsd's attention (hf_target/attention.py): tree forwards fold the query-head groups into the
query length instead of repeating keys and values; everything else is transformers' SDPA, so
`generate` keeps its bits."""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForImageTextToText
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hsd_cli.decoding.hf_target import HFTarget
from hsd_cli.decoding.hf_target import attention
from hsd_cli.decoding.hf_target.attention import HSD_SDPA, folds, hsd_sdpa_forward, tree_forward

from .test_exactness import BRANCHING, PROMPT, SAME_LOGITS, tree_logits

PROMPTS = [PROMPT, "Transcribe every word of this page, please."]  # different lengths: a padded batch


def attention_inputs(per_head_mask: bool):
    generator = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, queries, slots, dim = 2, 6, 2, 5, 11, 8
    query = torch.randn(batch, queries, heads, dim, generator=generator).transpose(1, 2)  # as the models give it
    key, value = (torch.randn(batch, kv_heads, slots, dim, generator=generator) for _ in range(2))
    mask = torch.rand(batch, heads if per_head_mask else 1, queries, slots, generator=generator) > 0.4
    mask[..., -queries:] |= torch.eye(queries, dtype=torch.bool)
    return SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True), query, key, value, mask


@pytest.mark.parametrize("per_head_mask", [False, True])
def test_folded_attention_is_the_repeated_heads_attention(per_head_mask):
    module, query, key, value, mask = attention_inputs(per_head_mask)
    repeated, _ = sdpa_attention_forward(module, query, key, value, mask)
    with tree_forward():
        folded, _ = hsd_sdpa_forward(module, query, key, value, mask)
    assert folded.shape == repeated.shape
    assert (folded - repeated).abs().max().item() < 1e-6
    outside, _ = hsd_sdpa_forward(module, query, key, value, mask)  # not a tree forward: SDPA's own
    assert torch.equal(outside, repeated)


def test_a_fold_whose_mask_outweighs_the_repeated_cache_is_not_made():
    module, query, key, value, mask = attention_inputs(False)
    assert folds(query, key, mask, 3)
    long_queries = torch.zeros(2, 6, 2000, 8)
    assert not folds(long_queries, key, torch.ones(2, 1, 2000, 11, dtype=torch.bool), 3)
    assert not folds(query, key, None, 3) and not folds(query, key, mask, 1)


def sdpa_twin(target: HFTarget, directory) -> HFTarget:
    """The same weights loaded as transformers loads them (its SDPA, not hsd's)."""
    target.model.save_pretrained(directory)
    model = AutoModelForImageTextToText.from_pretrained(directory, dtype=torch.float32).eval()
    assert model.config.get_text_config()._attn_implementation != HSD_SDPA
    return HFTarget(model, target.processor, target.adapter)


@pytest.fixture(scope="module")
def sdpa_target(tiny_target, tmp_path_factory):
    return sdpa_twin(tiny_target, tmp_path_factory.mktemp("sdpa"))


def test_text_attention_is_hsds_where_it_was_sdpa(tiny_target, sdpa_target):
    before = sdpa_target.model.config.get_text_config()._attn_implementation
    assert tiny_target.model.config.get_text_config()._attn_implementation == (HSD_SDPA if before == "sdpa" else before)


def test_generate_keeps_sdpas_bits(tiny_target, sdpa_target, make_image):
    """A padded batch's generate (its prefill has a mask over many queries) gives the same tokens
    and logits, bit for bit, with hsd's attention as with transformers' SDPA."""
    outputs = []
    for target in (tiny_target, sdpa_target):
        inputs = target.inputs([make_image(0), make_image(1)], PROMPTS)
        outputs.append(target.model.generate(
            **inputs, max_new_tokens=16, do_sample=False, output_logits=True, return_dict_in_generate=True,
        ))
    ours, theirs = outputs
    assert torch.equal(ours.sequences, theirs.sequences)
    assert torch.equal(torch.stack(ours.logits), torch.stack(theirs.logits))


def test_tree_forwards_fold_head_groups_and_keep_sdpas_logits(tiny_target, sdpa_target, page_image, monkeypatch):
    folded, masks = [], []
    fold, fold_mask = attention.fold_queries, attention.fold_mask
    monkeypatch.setattr(attention, "fold_queries", lambda *args: folded.append(args[1]) or fold(*args))
    monkeypatch.setattr(attention, "fold_mask", lambda *args: masks.append(args[1]) or fold_mask(*args))
    ours = tree_logits(tiny_target, page_image, BRANCHING)
    text = tiny_target.model.config.get_text_config()
    groups = text.num_attention_heads // (getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
    assert bool(folded) == (text._attn_implementation == HSD_SDPA and groups > 1)
    if folded:  # every layer folded its queries, the one mask they share was folded once
        assert len(folded) == text.num_hidden_layers - len(tiny_target.linear_layers) and len(masks) == 1
    theirs = tree_logits(sdpa_target, page_image, BRANCHING)
    assert (ours - theirs).abs().max().item() < SAME_LOGITS
