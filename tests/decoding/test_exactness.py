"""Speculative decoding must emit exactly what plain decoding of the same model emits."""

import random
from dataclasses import replace

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from hsd_cli.decoding.hf_target import cache
from hsd_cli.decoding.hf_target import HFTarget
from hsd_cli.decoding.loop import DecodeConfig, DecodeRequest, decode_batch
from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer, ProposerConfig
from hsd_cli.decoding.tree import TokenTree, batch_trees
from hsd_cli.decoding.verify import SamplingConfig, keyed_sample

PROMPT = "Transcribe the text."
LENGTH = 128
GREEDY = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False)


def generate_greedy(target, image, prompt, length=LENGTH):
    inputs = target.inputs([image], [prompt])
    out = target.model.generate(**inputs, max_new_tokens=length, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.fixture(scope="module")
def reference(tiny_target, page_image):
    return generate_greedy(tiny_target, page_image, PROMPT)


def speculative(target, image, drafts, config=GREEDY, proposer_config=ProposerConfig(), prompt=PROMPT):
    proposer = DraftProposer(drafts, proposer_config) if drafts else NoDraftProposer()
    return decode_batch(target, [DecodeRequest(image, prompt, proposer)], config)[0]


def edit(tokens, seed, substitute=0.0, insert=0.0, delete=0.0):
    rng, out = random.Random(seed), []
    for token in tokens:
        roll = rng.random()
        if roll < delete:
            continue
        if roll < delete + insert:
            out.append(rng.randrange(10, 1000))
        out.append(rng.randrange(10, 1000) if rng.random() < substitute else token)
    return out


def test_reference_is_long_and_not_a_loop(reference):
    assert len(reference) == LENGTH and len(set(reference)) > LENGTH // 4


def test_perfect_draft(tiny_target, page_image, reference):
    result = speculative(tiny_target, page_image, [reference])
    assert result.tokens == reference
    assert result.stats.tau > 5 and result.stats.new_tokens == LENGTH


@pytest.mark.parametrize(
    "edits", [dict(substitute=0.1), dict(insert=0.1), dict(delete=0.1), dict(substitute=0.1, insert=0.1, delete=0.1)]
)
def test_edited_drafts(tiny_target, page_image, reference, edits):
    result = speculative(tiny_target, page_image, [edit(reference, 1, **edits)])
    assert result.tokens == reference
    assert result.stats.accepted > LENGTH // 3  # the drafts did get used


def test_empty_and_unrelated_drafts(tiny_target, page_image, reference):
    assert speculative(tiny_target, page_image, []).tokens == reference
    unrelated = speculative(tiny_target, page_image, [list(range(900, 1000))])
    assert unrelated.tokens == reference


class RecordingProposer:
    def __init__(self, inner):
        self.inner, self.trees = inner, []

    def start(self):
        self.inner.start()

    def propose(self, context):
        self.trees.append(self.inner.propose(context))
        return self.trees[-1]

    def observe(self, accepted):
        self.inner.observe(accepted)


def widest_node(tree):
    return max(tree.parents.count(node) for node in range(len(tree)))


def test_wide_trees(tiny_target, page_image, reference):
    # Many drafts that each share short pieces of the reference make wide tries.
    pieces = [reference[i : i + 6] + edit(reference[i + 6 : i + 12], i, substitute=0.5) for i in range(0, LENGTH - 12, 3)]
    proposer = RecordingProposer(DraftProposer(pieces, ProposerConfig(trie_budget=64)))
    result = decode_batch(tiny_target, [DecodeRequest(page_image, PROMPT, proposer)], GREEDY)[0]
    assert result.tokens == reference
    assert max(widest_node(tree) for tree in proposer.trees) >= 4


def test_eos_and_budget_stop_like_generate(tiny_target, page_image, reference):
    stop = reference[40]
    config = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False, stop_token_ids=(stop,))
    result = speculative(tiny_target, page_image, [reference], config=config)
    assert result.tokens == reference[: reference.index(stop) + 1] and result.stop_reason == "eos"
    short = speculative(tiny_target, page_image, [reference], config=DecodeConfig(max_new_tokens=37, repetition_guard=False))
    assert short.tokens == reference[:37] and short.stop_reason == "budget"


def test_the_repetition_guard_stops_where_generate_with_it_stops(tmp_path, page_image):
    """`--baseline` can run transformers' generate with hsd's guard as a stopping criterion: both
    stop on the same token, also when the loop closes inside one accepted chunk of a draft. A
    model whose output head is zeroed repeats one token (every logit ties; argmax takes the first)."""
    from hsd_cli.decoding.hf_target import load_target
    from hsd_cli.decoding.repetition import REPETITION_SPAN
    from hsd_cli.models.tiny_families import build_tiny_random

    target = load_target(str(build_tiny_random("qwen2_5_vl", tmp_path / "tiny")), device="cpu", dtype="float32")
    with torch.no_grad():
        target.model.get_output_embeddings().weight.zero_()
    budget = REPETITION_SPAN + 40
    config = DecodeConfig(max_new_tokens=budget, repetition_guard=True)
    result = speculative(target, page_image, [[0] * budget], config=config)
    assert result.stop_reason == "repetition" and result.stats.forwards < len(result.tokens)
    assert result.tokens == [0] * REPETITION_SPAN == target.generate_plainly(page_image, PROMPT, budget, repetition_guard=True)
    assert len(target.generate_plainly(page_image, PROMPT, budget)) == budget, "without the guard, the budget"
    # A request whose drafts repeat the token 1,000 times: both let 1,000 + 3 through and stop on the next.
    from hsd_cli.decoding.repetition import STRUCTURE_MARGIN_UNITS, structure_allowance

    allowance, budget = structure_allowance([[5] + [0] * 1000]), 1100
    config = DecodeConfig(max_new_tokens=budget, repetition_guard=True)
    request = DecodeRequest(page_image, PROMPT, DraftProposer([[0] * budget]), allowance=allowance)
    held = decode_batch(target, [request], config)[0]
    stop = 1000 + STRUCTURE_MARGIN_UNITS + 1
    assert held.stop_reason == "repetition" and held.loop.start == 0 and held.loop.stop == stop
    assert held.tokens == [0] * stop == target.generate_plainly(page_image, PROMPT, budget, True, allowance)


def test_batched_sequences_of_different_lengths(tiny_target, make_image):
    cases = [
        (make_image(1, 56, 56), "Read."),
        (make_image(2, 112, 84), "Transcribe every word of this page, please."),
        (make_image(3, 84, 112), "Transcribe the text."),
    ]
    references = [generate_greedy(tiny_target, image, prompt, 120) for image, prompt in cases]
    requests = [
        DecodeRequest(image, prompt, DraftProposer([edit(ref, i, substitute=0.05 * i)]))
        for i, ((image, prompt), ref) in enumerate(zip(cases, references))
    ]
    config = DecodeConfig(max_new_tokens=120, repetition_guard=False)
    results = decode_batch(tiny_target, requests, config)
    for result, ref in zip(results, references):
        assert result.tokens == ref
    # Rows accept different amounts, so they finish at different steps and leave the batch early.
    assert len({r.stats.forwards for r in results}) > 1


@pytest.mark.parametrize("separate_prefill", [False, True])
def test_a_row_that_ends_drafts_the_row_it_feeds(tiny_target, make_image, separate_prefill):
    """Packed decoding: a page row starts with no drafts; a row reading the same page (with a
    perfect draft, so it ends early) hands it its output, and a crop of another size rides along.
    Rows prefilled apart and joined decode exactly as rows prefilled together."""
    page, crop = make_image(4, 112, 112), make_image(5, 56, 84)
    page_reference = generate_greedy(tiny_target, page, PROMPT, 120)
    crop_reference = generate_greedy(tiny_target, crop, "Read.", 120)
    page_proposer = DraftProposer([])
    requests = [
        DecodeRequest(page, PROMPT, page_proposer),
        DecodeRequest(page, PROMPT, DraftProposer([page_reference]), feeds=0),
        DecodeRequest(crop, "Read.", DraftProposer([edit(crop_reference, 7, substitute=0.1)])),
    ]
    config = DecodeConfig(max_new_tokens=120, repetition_guard=False)
    results = decode_batch(tiny_target, requests, config, separate_prefill=separate_prefill)
    assert [r.tokens for r in results] == [page_reference, page_reference, crop_reference]
    assert page_proposer.drafts == [page_reference], "the ended row's output, as a draft"
    assert results[0].stats.forwards < 60, "the page row accepted the fed draft"


class AlwaysCompactingTarget(HFTarget):
    """Squeezes padding out of the cache after every step, as it does when padding piles up."""

    def commit(self, state, width, kept_nodes):
        super().commit(state, width, kept_nodes)
        cache.compact(state, self.device)


def test_batched_text_only_prompts_and_cache_compaction(tiny_target):
    prompts = ["Hi.", "Write a long and careful transcription of nothing at all, please."]
    references = []
    for prompt in prompts:
        inputs = tiny_target.inputs([None], [prompt])
        out = tiny_target.model.generate(**inputs, max_new_tokens=60, do_sample=False)
        references.append(out[0, inputs["input_ids"].shape[1] :].tolist())
    target = AlwaysCompactingTarget(tiny_target.model, tiny_target.processor, tiny_target.adapter)
    requests = [DecodeRequest(None, p, DraftProposer([edit(r, 7, substitute=0.2)])) for p, r in zip(prompts, references)]
    results = decode_batch(target, requests, DecodeConfig(max_new_tokens=60, repetition_guard=False))
    assert [r.tokens for r in results] == references


def test_the_text_leaves_out_special_tokens_but_the_familys_markup(tiny_target):
    """An output's text drops stop and control tokens; markup the family writes with special
    tokens of its vocabulary (DeepSeek-OCR's grounding tags, its table cells) stays in it."""
    tokenizer = tiny_target.tokenizer
    markup = "".join(t for t in tiny_target.adapter.text_special_tokens if t in tokenizer.get_vocab())
    text = f"{markup}Some words."
    control = [token for token in tokenizer.all_special_ids if tokenizer.convert_ids_to_tokens(token) not in markup]
    assert tiny_target.decode(control + tiny_target.encode(text) + tiny_target.stop_token_ids) == text
    if tiny_target.model_type == "deepseek_ocr2":
        assert markup == "<|ref|><|/ref|><|det|><|/det|><td></td>"


# -- logits -------------------------------------------------------------------------------------

BRANCHING = TokenTree((0, 101, 102, 103, 104, 105, 106), (-1, 0, 0, 1, 1, 2, 5))


def tree_logits(target, image, tree):
    state, _ = target.prefill(target.inputs([image], [PROMPT]))
    trees = batch_trees([tree])
    return target.forward_tree(state, trees.tokens, trees.depths, trees.ancestors)


def full_forward_logits(target, image, tokens, prompt=PROMPT):
    """No cache, no custom mask or positions: the model's own forward over prompt + tokens; the
    logits of the last position."""
    return full_forward_all_logits(target, image, tokens, prompt)[-1]


def full_forward_all_logits(target, image, tokens, prompt=PROMPT):
    """The model's own forward over prompt + tokens: the logits of every position, in fp32."""
    inputs = target.inputs([image], [prompt])
    prompt_as_prefill = prompt_cache(target.model, inputs["input_ids"].shape[1])
    extra = torch.tensor([tokens])
    inputs["input_ids"] = torch.cat([inputs["input_ids"], extra], 1)
    inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(extra)], 1)
    for per_token in ("mm_token_type_ids", "image_embeds_position_mask"):  # the added tokens are text
        if per_token in inputs:
            inputs[per_token] = torch.cat([inputs[per_token], torch.zeros_like(extra)], 1)
    with torch.inference_mode():
        return target.model(**inputs, **prompt_as_prefill).logits[0].float()


def prompt_cache(model, prompt_length):
    """The forward's own cache, told where the prompt ends where its layers count a window of
    generated tokens from there (Unlimited-OCR's, as `generate` tells them in its prefill): the
    tokens after the prompt are then attended as generated ones. Other models: their default."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    counting = [layer for layer in cache.layers if hasattr(layer, "set_prefill_length")]
    for layer in counting:
        layer.set_prefill_length(prompt_length)
    return {"past_key_values": cache} if counting else {}


def path_to(tree, node):
    path = []
    while node >= 0:
        path.append(tree.tokens[node])
        node = tree.parents[node]
    return path[::-1]


@pytest.fixture(scope="module")
def expected_node_logits(tiny_target, page_image):
    return torch.stack([full_forward_logits(tiny_target, page_image, path_to(BRANCHING, n)) for n in range(len(BRANCHING))])


# fp32 logits of about 10 summed in another order (the tree forward's matmuls have other shapes, and
# CPUs block them differently) differ by tens of ulps: up to 2.6e-5 seen on an AMD EPYC, 0 on others.
# A wrong mask or position moves them by 0.7 or more in every family.
SAME_LOGITS = 1e-4


def test_tree_forward_logits_equal_plain_forward(tiny_target, page_image, expected_node_logits):
    logits = tree_logits(tiny_target, page_image, BRANCHING)
    assert (logits - expected_node_logits).abs().max().item() < SAME_LOGITS


class ShiftedPositionsTarget(HFTarget):
    """Tree nodes one position too far, as a wrong rope delta puts them."""

    def _tree_positions(self, state, depths):
        return super()._tree_positions(state, depths) + 1


class CausalMaskTarget(HFTarget):
    """A plain causal mask over the tree nodes instead of each node's ancestors."""

    def _tree_visibility(self, ancestors):
        width = ancestors.shape[-1]
        return torch.tril(torch.ones(width, width, dtype=torch.bool)).expand(ancestors.shape[0], -1, -1)


@pytest.mark.parametrize("wrong_target", [ShiftedPositionsTarget, CausalMaskTarget])
def test_wrong_positions_or_mask_are_detected(tiny_target, page_image, expected_node_logits, wrong_target):
    target = wrong_target(tiny_target.model, tiny_target.processor, tiny_target.adapter, kv_store=tiny_target.kv_store)
    logits = tree_logits(target, page_image, BRANCHING)
    assert (logits - expected_node_logits).abs().max().item() > 100 * SAME_LOGITS


def test_rope_delta_is_not_zero_so_the_control_means_something(tiny_target, page_image):
    if tiny_target.model_type in (
        "hunyuan_vl", "idefics3", "lighton_ocr", "qianfan_ocr", "got_ocr2", "kosmos-2.5", "deepseek_ocr2",
        "mistral3", "granite_docling", "granite4_vision", "minicpm_ocr", "minicpmv4_6", "unlimited_ocr",
    ):
        pytest.skip("text tokens keep their sequence positions in this family: the delta is 0 by design")
    state, _ = tiny_target.prefill(tiny_target.inputs([page_image], [PROMPT]))
    assert state.rope_delta.abs().sum() > 0


# -- sampling -----------------------------------------------------------------------------------


class KeyedSampler(LogitsProcessor):
    """Plain sampling inside `generate`: draw with the keyed generator, return a one-hot score."""

    def __init__(self, sampling, prompt_length):
        self.sampling, self.prompt_length = sampling, prompt_length

    def __call__(self, input_ids, scores):
        position = input_ids.shape[1] - self.prompt_length
        chosen = torch.tensor([keyed_sample(row_scores, self.sampling, row, position) for row, row_scores in enumerate(scores)])
        return torch.full_like(scores, float("-inf")).scatter(1, chosen[:, None], 0.0)


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.8, seed=3), SamplingConfig(temperature=1.0, top_k=20, top_p=0.9, seed=11)])
def test_speculative_sampling_equals_plain_sampling(tiny_target, page_image, sampling):
    inputs = tiny_target.inputs([page_image], [PROMPT])
    prompt_length = inputs["input_ids"].shape[1]
    out = tiny_target.model.generate(
        **inputs, max_new_tokens=LENGTH, do_sample=False, logits_processor=LogitsProcessorList([KeyedSampler(sampling, prompt_length)])
    )
    plain = out[0, prompt_length:].tolist()
    config = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False, sampling=sampling)
    result = speculative(tiny_target, page_image, [edit(plain, 2, substitute=0.05)], config=config)
    assert result.tokens == plain
    assert result.stats.accepted > LENGTH // 3
    short = DecodeConfig(max_new_tokens=40, repetition_guard=False, sampling=replace(sampling, seed=sampling.seed + 1))
    assert speculative(tiny_target, page_image, [], config=short).tokens != plain[:40]
