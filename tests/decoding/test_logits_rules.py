"""Logits rules (penalties, n-gram bans) inside verification: every tree node's logits are
processed with its own path's tokens, and speculation still emits what plain decoding with the
same rule emits (transformers' `generate`, with its own processors where it has them)."""

from contextlib import contextmanager, nullcontext
from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

from hsd_cli.decoding import loop
from hsd_cli.decoding.logits_rules import (
    LogitsRules, apply_rules_, banned_ngram_tokens, processed_logits, rules_on_trees, suffix_matches,
)
from hsd_cli.decoding.loop import DecodeConfig, DecodeRequest, decode_batch
from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer
from hsd_cli.decoding.tree import TokenTree
from hsd_cli.decoding.verify import SamplingConfig

from .test_exactness import PROMPT, edit

# -- the pure function on hand-written arrays -----------------------------------------------------

# Root (the output's last token), then two siblings carrying 4 and 5, then a child of the first carrying 5.
SIBLINGS = TokenTree((3, 4, 5, 5), (-1, 0, 0, 1))


def logits_of(rows, vocab=8):
    return torch.arange(rows * vocab, dtype=torch.float32).reshape(rows, vocab) - 10.0


def test_repetition_penalty_reads_each_nodes_path_and_the_prompt():
    scores = processed_logits(logits_of(4), SIBLINGS.tokens, SIBLINGS.parents, [1], [2, 3], LogitsRules(repetition_penalty=2.0))
    raw = logits_of(4)
    penalised = torch.where(raw < 0, raw * 2.0, raw / 2.0)
    seen = [{1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 5}, {1, 2, 3, 4, 5}]
    for node, tokens in enumerate(seen):
        for token in range(8):
            expected = penalised[node, token] if token in tokens else raw[node, token]
            assert scores[node, token] == expected, (node, token)
    # The siblings: 4 is penalised at the node carrying it, not at its sibling.
    assert scores[1, 4] != raw[1, 4] and scores[2, 4] == raw[2, 4]


def test_repetition_penalty_equals_transformers_processor_bit_for_bit():
    rng = np.random.default_rng(0)
    raw = torch.from_numpy(rng.normal(0, 5, (4, 50)).astype(np.float32))
    prompt, output = [7, 7, 9, 11], [12, 3, 40]
    scores = processed_logits(raw, SIBLINGS.tokens, SIBLINGS.parents, prompt, output, LogitsRules(repetition_penalty=1.1))
    paths = [[], [4], [5], [4, 5]]
    for node, path in enumerate(paths):
        ids = torch.tensor([prompt + output + path])
        expected = RepetitionPenaltyLogitsProcessor(1.1)(ids, raw[node : node + 1].clone())
        assert torch.equal(scores[node : node + 1], expected)


def test_presence_and_frequency_count_the_output_and_each_path_not_the_prompt():
    rules = LogitsRules(presence_penalty=1.0, frequency_penalty=0.25)
    scores = processed_logits(logits_of(4), SIBLINGS.tokens, SIBLINGS.parents, [6], [2, 2, 3], rules)
    raw = logits_of(4)
    counts = [{2: 2, 3: 1}, {2: 2, 3: 1, 4: 1}, {2: 2, 3: 1, 5: 1}, {2: 2, 3: 1, 4: 1, 5: 1}]
    for node, count in enumerate(counts):
        for token in range(8):
            c = count.get(token, 0)
            expected = raw[node, token] - 0.25 * c - (1.0 if c else 0.0)
            assert scores[node, token] == pytest.approx(float(expected), abs=0), (node, token)
    assert scores[0, 6] == raw[0, 6], "the prompt's tokens are not the output's"


def test_a_path_that_repeats_a_token_counts_it_twice():
    chain = TokenTree.chain(2, [2, 2])
    scores = processed_logits(logits_of(3), chain.tokens, chain.parents, [], [2], LogitsRules(frequency_penalty=1.0))
    assert (logits_of(3)[:, 2] - scores[:, 2]).tolist() == [1.0, 2.0, 3.0]


def test_ngram_ban_differs_between_siblings():
    # Output 5 6 5, bigrams banned: after 5 comes 6 (already seen). Node a appends 6: "5 6 5 6",
    # its prefix 6 was followed by 5; node b appends 7: nothing after 7 yet.
    tree = TokenTree((5, 6, 7), (-1, 0, 0))
    banned = banned_ngram_tokens(tree.tokens, tree.parents, np.array([5, 6, 5]), LogitsRules(no_repeat_ngram=2))
    assert [b.tolist() for b in banned] == [[6], [5], []]
    scores = processed_logits(logits_of(3), tree.tokens, tree.parents, [], [5, 6, 5], LogitsRules(no_repeat_ngram=2, ngram_over_prompt=False))
    assert scores[0, 6] == scores[1, 5] == float("-inf") and torch.isfinite(scores[2]).all()


def test_ngram_ban_window_and_allowed_ids():
    history = np.array([1, 2, 3, 9, 9, 9, 9, 1, 2])
    tree = TokenTree((2,), (-1,))
    whole = LogitsRules(no_repeat_ngram=3)
    assert banned_ngram_tokens(tree.tokens, tree.parents, history, whole)[0].tolist() == [3]
    # Within the last 6 tokens "9 9 9 1 2" holds no "1 2 x".
    assert banned_ngram_tokens(tree.tokens, tree.parents, history, replace(whole, ngram_window=6))[0].tolist() == []
    assert banned_ngram_tokens(tree.tokens, tree.parents, history, replace(whole, ngram_window=9))[0].tolist() == [3]
    assert banned_ngram_tokens(tree.tokens, tree.parents, history, replace(whole, ngram_allowed=(3,)))[0].tolist() == []


def test_suffix_matches():
    assert suffix_matches(np.array([1, 2, 1, 2]), 5).tolist() == [0, 0, 2, 0, 4]
    assert suffix_matches(np.array([1, 2, 1, 2]), 1).tolist() == [0, 0, 1, 0, 1]


def deepseek_banned(history, n, window, allowed):
    """DeepSeek-OCR's NoRepeatNGramLogitsProcessor, restated: the n-grams starting in the last
    `window` tokens whose first n - 1 tokens are the history's last n - 1."""
    if len(history) < n:
        return set()
    prefix = tuple(history[-(n - 1):])
    start, end = max(0, len(history) - window), len(history) - n + 1
    return {history[i + n - 1] for i in range(start, end) if tuple(history[i : i + n - 1]) == prefix} - set(allowed)


def random_tree(rng, size, vocab):
    parents = [-1] + [int(rng.integers(0, node)) for node in range(1, size)]
    return TokenTree(tuple(int(t) for t in rng.integers(0, vocab, size)), tuple(parents))


def node_history(tree, node):
    path = []
    while node > 0:
        path.append(tree.tokens[node])
        node = tree.parents[node]
    return path[::-1]


@pytest.mark.parametrize("seed", range(20))
def test_every_node_equals_plain_processing_of_its_own_history(seed):
    """Random trees over a 4-token vocabulary (n-grams repeat often): each node's processed logits
    equal a root alone with the node's whole history as output (plain decoding's one position),
    and the bans equal transformers' processor and DeepSeek's restated one."""
    rng = np.random.default_rng(seed)
    vocab = 4
    tree = random_tree(rng, 12, vocab)
    prompt = [int(t) for t in rng.integers(0, vocab, 5)]
    output = [int(t) for t in rng.integers(0, vocab, 30)] + [tree.tokens[0]]
    raw = torch.from_numpy(rng.normal(0, 3, (len(tree), vocab)).astype(np.float32))
    n = int(rng.integers(1, 5))
    for rules in [
        LogitsRules(repetition_penalty=1.1, presence_penalty=1.0, frequency_penalty=0.05, no_repeat_ngram=n),
        LogitsRules(no_repeat_ngram=n + 1, ngram_window=n + 6, ngram_allowed=(1,), ngram_over_prompt=False),
    ]:
        scores = processed_logits(raw, tree.tokens, tree.parents, prompt, output, rules)
        for node in range(len(tree)):
            history = output + node_history(tree, node)
            alone = processed_logits(raw[node : node + 1], (history[-1],), (-1,), prompt, history, rules)
            assert torch.equal(scores[node : node + 1], alone), (rules, node)
            banned = set(torch.nonzero(torch.isinf(scores[node])).flatten().tolist())
            if rules.ngram_over_prompt:
                ids = torch.tensor([prompt + history])
                reference = NoRepeatNGramLogitsProcessor(rules.no_repeat_ngram)(ids, torch.zeros(1, vocab))
                assert banned == set(torch.nonzero(torch.isinf(reference[0])).flatten().tolist())
            else:
                assert banned == deepseek_banned(history, rules.no_repeat_ngram, rules.ngram_window, rules.ngram_allowed)


def test_rules_off_is_no_rule():
    rules = LogitsRules()
    assert not rules.active and not rules.reads_prompt
    assert DecodeConfig().rules == rules
    with pytest.raises(ValueError):
        LogitsRules(no_repeat_ngram=20, ngram_window=10)


# -- speculative == plain, on every tiny family -------------------------------------------------

LENGTH = 200  # past MinerU's 100-gram, on a looping model
# The bigram bonus (`looping`): strong enough for clean loops that the n-gram bans cut, weak
# enough that the penalties reorder the top tokens.
STRENGTH = {"glm_repetition": 10.0, "mineru_penalties": 10.0}


@contextmanager
def looping(target, strength=20.0, cycle=7, first=100):
    """The family's tiny model plus a bigram bonus: the token after t gets `strength` more where
    it is f(t) (a map into `cycle` ids), so greedy output soon loops and every n-gram ban and
    penalty bites. A function of each position's own token, it changes a tree forward and a
    plain forward alike."""

    def bonus(module, args, kwargs, out):
        ids = kwargs.get("input_ids", args[0] if args else None)
        logits = out.logits
        ids = ids[:, -logits.shape[1]:]
        assert ids.shape == logits.shape[:2], "every position's logits"
        favoured = first + (ids - first + 1) % cycle  # first, first + 1, ..., first + cycle - 1, first, ...
        out.logits = logits.scatter_add(-1, favoured[..., None], torch.full_like(logits[..., :1], strength))
        return out

    handle = target.model.register_forward_hook(bonus, with_kwargs=True)
    # Every tree node's logits, padding nodes' too, so that they line up with the input ids.
    target._output_layer_only_at = lambda valid: nullcontext()
    try:
        yield target
    finally:
        handle.remove()
        del target._output_layer_only_at


def table_cell_ids(target):
    vocabulary = target.tokenizer.get_vocab()
    return tuple(vocabulary[token] for token in ("<td>", "</td>") if token in vocabulary)


def makers_rules(target):
    return {
        "glm_repetition": LogitsRules(repetition_penalty=1.1),
        "mineru_penalties": LogitsRules(presence_penalty=1.0, frequency_penalty=0.05),
        "deepseek_ngram": LogitsRules(no_repeat_ngram=20, ngram_window=50, ngram_allowed=table_cell_ids(target), ngram_over_prompt=False),
        "mineru_ngram": LogitsRules(no_repeat_ngram=100, ngram_over_prompt=False),
        "transformers_ngram": LogitsRules(no_repeat_ngram=3),  # transformers' own processor, over the prompt too
    }


def speculative(target, image, drafts, rules, sampling=SamplingConfig()):
    config = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False, rules=rules, sampling=sampling)
    return decode_batch(target, [DecodeRequest(image, PROMPT, DraftProposer(drafts) if drafts else NoDraftProposer())], config)[0]


@pytest.mark.parametrize("rule", ["glm_repetition", "mineru_penalties", "deepseek_ngram", "mineru_ngram", "transformers_ngram"])
def test_speculation_with_a_rule_equals_generate_with_it(tiny_target, page_image, rule):
    rules = makers_rules(tiny_target)[rule]
    with looping(tiny_target, STRENGTH.get(rule, 20.0)) as target:
        unruled = target.generate_plainly(page_image, PROMPT, LENGTH)
        plain = target.generate_plainly(page_image, PROMPT, LENGTH, rules=rules)
        assert plain != unruled, "the rule must change the output to mean anything"
        # Drafts of the ruled output, edited, and the unruled one: tries whose siblings have different histories.
        result = speculative(target, page_image, [edit(plain, 3, substitute=0.05), unruled], rules)
    assert result.tokens == plain
    assert result.stats.accepted > LENGTH // 3


def test_plain_loop_with_a_rule_equals_generate(tiny_target, page_image):
    rules = LogitsRules(repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.05, no_repeat_ngram=4)
    with looping(tiny_target, 10.0) as target:
        assert speculative(target, page_image, [], rules).tokens == target.generate_plainly(page_image, PROMPT, LENGTH, rules=rules)


@pytest.mark.parametrize("separate_prefill", [False, True])
def test_batched_rows_each_read_their_own_prompt_and_output(tiny_target, make_image, separate_prefill):
    """Rows of different prompt lengths (left-padded when prefilled together): each row's rules
    read its own prompt, padding left out, as `generate` on that row alone does."""
    rules = LogitsRules(repetition_penalty=1.1, presence_penalty=0.5, no_repeat_ngram=3)
    cases = [(make_image(1, 56, 56), "Read."), (make_image(2, 84, 112), "Transcribe every word of this page, please.")]
    config = DecodeConfig(max_new_tokens=80, repetition_guard=False, rules=rules)
    with looping(tiny_target, 10.0) as target:
        references = [target.generate_plainly(image, prompt, 80, rules=rules) for image, prompt in cases]
        requests = [DecodeRequest(image, prompt, DraftProposer([edit(ref, i, substitute=0.1)])) for i, ((image, prompt), ref) in enumerate(zip(cases, references))]
        results = decode_batch(target, requests, config, separate_prefill=separate_prefill)
    assert [r.tokens for r in results] == references


def test_rows_of_one_batch_each_decode_by_their_requests_rules(tiny_target, page_image):
    """A two-step model's blocks of different kinds share forwards, each by its makers' rules for
    its kind (and one by the batch's): every row is `generate` with its own rules."""
    makers = makers_rules(tiny_target)
    per_row = [makers["mineru_penalties"], makers["mineru_ngram"], None]
    batch_rules = makers["glm_repetition"]
    config = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False, rules=batch_rules)
    with looping(tiny_target, 10.0) as target:
        references = [target.generate_plainly(page_image, PROMPT, LENGTH, rules=rules or batch_rules) for rules in per_row]
        assert len({tuple(reference) for reference in references}) == 3, "each rule changes the output"
        requests = [DecodeRequest(page_image, PROMPT, DraftProposer([edit(reference, i, substitute=0.05)]), rules=rules)
                    for i, (reference, rules) in enumerate(zip(references, per_row))]
        results = decode_batch(target, requests, config)
    assert [result.tokens for result in results] == references


@pytest.mark.parametrize("rule", [None, "mineru_penalties", "deepseek_ngram"])
def test_seeded_sampling_with_a_rule_equals_plain_sampling(tiny_target, page_image, rule):
    rules = makers_rules(tiny_target)[rule] if rule else LogitsRules()
    sampling = SamplingConfig(temperature=0.1, seed=5)
    with looping(tiny_target, strength=4.0) as target:
        plain = target.generate_plainly(page_image, PROMPT, LENGTH, rules=rules, sampling=sampling)
        result = speculative(target, page_image, [edit(plain, 4, substitute=0.05)], rules, sampling)
        other_seed = speculative(target, page_image, [], rules, replace(sampling, seed=6))
    assert result.tokens == plain
    assert result.stats.accepted > LENGTH // 3
    assert other_seed.tokens != plain, "the seed draws"


def rules_with_the_roots_history(trees, logits, histories, rules):
    """The bug the tests must catch: every node processed with the root's history (its path ignored)."""
    with torch.inference_mode():
        for part, (prompt, output), row_rules in zip(logits.split([len(tree) for tree in trees]), histories, rules):
            for node in range(len(part)):
                apply_rules_(part[node : node + 1], (0,), (-1,), prompt, output, row_rules)
    return logits


# The bans: on a looping output every penalised token is in the output already, so a path's tokens
# change a penalty by a frequency step at most; a ban's n-gram runs into the path.
@pytest.mark.parametrize("rule", ["deepseek_ngram", "transformers_ngram"])
def test_negative_control_the_roots_history_for_every_node_is_caught(tiny_target, page_image, rule, monkeypatch):
    rules = makers_rules(tiny_target)[rule]
    with looping(tiny_target, STRENGTH.get(rule, 20.0)) as target:
        plain = target.generate_plainly(page_image, PROMPT, LENGTH, rules=rules)
        monkeypatch.setattr(loop, "rules_on_trees", rules_with_the_roots_history)
        wrong = speculative(target, page_image, [plain], rules)
    assert wrong.tokens != plain


def test_rules_on_trees_processes_rows_in_place_row_by_row_each_by_its_rules():
    trees = [SIBLINGS, TokenTree((2,), (-1,)), TokenTree((3,), (-1,))]
    histories = [([1], [2, 3]), ([], [7, 2]), ([], [3, 3])]
    rules = LogitsRules(repetition_penalty=2.0, no_repeat_ngram=2, ngram_over_prompt=False)
    other = LogitsRules(presence_penalty=1.0, frequency_penalty=0.05)
    logits = logits_of(6)
    expected = torch.cat([
        processed_logits(logits[:4], SIBLINGS.tokens, SIBLINGS.parents, [1], [2, 3], rules),
        processed_logits(logits[4:5], (2,), (-1,), [], [7, 2], other),
        logits[5:],  # no rules: as the model gave them
    ])
    assert torch.equal(rules_on_trees(trees, logits.clone(), histories, [rules, other, LogitsRules()]), expected)
