"""Verification sized by the load (sizing.py): what a step verifies follows the price of a forward and
the acceptance learned so far, and never changes what is decoded."""

import random

import pytest

from hsd_cli.decoding.loop import DecodeConfig, DecodeRequest, decode_batch, decode_stream
from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer
from hsd_cli.decoding.sizing import CONTEXT_STEP, LoadSizer, ReadSizers, deepest, depth_outcomes
from hsd_cli.decoding.tree import TokenTree

from .test_continuous_batching import NamedScriptTarget
from .test_loop import ScriptedTarget

CHAIN = TokenTree.chain(5, [6, 7, 8, 9], evidence=4)
# root 0 -> 1 -> 3 -> 5, and 0 -> 2 -> 4: two branches, best first
TRIE = TokenTree((5, 6, 16, 7, 17, 8), (-1, 0, 0, 1, 2, 3), evidence=6)


def flat(rows, width, context):
    return 1.0


def per_token(rows, width, context):
    """Compute-bound from the first token: every node costs as much as a plain row."""
    return rows * width


def half_node(rows, width, context):
    """Every draft node costs half a plain row."""
    return rows * (1 + (width - 1) / 2)


def quarter_node(rows, width, context):
    """Every draft node costs a quarter of a plain row: a fresh sizer (reach 1/2 a depth) tries a node."""
    return rows * (1 + (width - 1) / 4)


def saturating(rows, width, context):
    """Memory-bound up to 8 tokens a forward, then compute-bound (a GPU's shape, in small)."""
    return max(1.0, rows * width / 8)


def test_depth_outcomes_count_only_the_depths_the_path_was_offered():
    assert depth_outcomes(CHAIN.parents, [0, 1, 2]) == [(1, True), (2, True), (3, False)]
    assert depth_outcomes(CHAIN.parents, [0, 1, 2, 3, 4]) == [(1, True), (2, True), (3, True), (4, True)]
    assert depth_outcomes(TRIE.parents, [0, 2, 4]) == [(1, True), (2, True)]  # node 4 has no child
    assert depth_outcomes(TRIE.parents, [0]) == [(1, False)]
    assert depth_outcomes(TokenTree.chain(5, []).parents, [0]) == []


def test_deepest_follows_the_first_nodes():
    assert deepest(CHAIN.parents) == [0, 1, 2, 3, 4]
    assert deepest(TRIE.parents) == [0, 1, 1, 2, 2, 3]


def test_first_nodes_are_a_tree():
    assert TRIE.first(3) == TokenTree((5, 6, 16), (-1, 0, 0), evidence=6)
    assert TRIE.first(99) is TRIE
    assert CHAIN.first(1) == TokenTree.chain(5, [], evidence=4)


def teach(sizer, kind, tree, accepted_depth, steps):
    path = [0]
    for _ in range(accepted_depth):
        path.append(next(i for i, p in enumerate(tree.parents) if p == path[-1]))
    for _ in range(steps):
        sizer.observe(kind, tree, path)


def test_one_row_on_a_flat_price_verifies_the_whole_tree():
    assert LoadSizer(flat).width(["k"], [CHAIN], [10]) == len(CHAIN)


def test_a_price_per_token_never_pays_for_a_draft():
    """At a plain row's price a node would have to be accepted more than always."""
    sizer = LoadSizer(per_token)
    teach(sizer, "k", CHAIN, 4, 50)
    assert sizer.width(["k"], [CHAIN], [10]) == 1


def test_drafts_are_verified_where_they_hold_and_not_where_they_fail():
    failing, holding = LoadSizer(half_node), LoadSizer(half_node)
    teach(failing, "k", CHAIN, 0, 20)
    teach(holding, "k", CHAIN, 4, 50)
    assert failing.width(["k"], [CHAIN], [10]) == 1
    assert holding.width(["k"], [CHAIN], [10]) == len(CHAIN)


def test_more_rows_verify_fewer_nodes_on_a_saturating_price():
    sizer = LoadSizer(saturating)
    teach(sizer, "k", CHAIN, 2, 30)  # two of four draft tokens accepted, every time
    widths = [sizer.width(["k"] * rows, [CHAIN] * rows, [10] * rows) for rows in (1, 2, 4, 8, 16)]
    assert widths[0] == len(CHAIN), "one row: verifying is free"
    assert widths == sorted(widths, reverse=True) and widths[-1] < widths[0]
    assert widths[-1] == 1, "16 rows of 1 node already fill the 8 free tokens twice"


def test_read_sizers_per_read_price_the_full_batch_and_shared_ones_the_rows_in_flight():
    per_read = ReadSizers(saturating, rows=16)
    first, second = per_read.sizer(100), per_read.sizer(200)
    assert first is not second and (first.batch_rows, first.prompt_tokens, second.prompt_tokens) == (16, 100, 200)
    teach(first, "k", CHAIN, 2, 30)
    assert first.width(["k"], [CHAIN], [10]) == 1, "one row priced as 16: the tree does not pay"
    assert second.width(["k"], [CHAIN], [10]) == 1, "nothing learned: the even prior does not pay either"
    shared = ReadSizers(saturating, rows=16, shared=True)
    one = shared.sizer(100)
    assert shared.sizer(200) is one and (one.batch_rows, one.prompt_tokens) == (None, 100)
    teach(one, "k", CHAIN, 2, 30)
    assert one.width(["k"], [CHAIN], [10]) == len(CHAIN), "one row in flight: verifying is free"
    alone = ReadSizers(saturating, rows=1, shared=True)
    assert alone.sizer(100) is not alone.sizer(100) and alone.sizer(100).batch_rows is None


def test_acceptance_is_learned_per_evidence_and_kind():
    sizer = LoadSizer(half_node)
    weak = TokenTree.chain(5, [6, 7, 8, 9], evidence=3)
    strong = TokenTree.chain(5, [6, 7, 8, 9], evidence=10)
    teach(sizer, "k", weak, 0, 40)
    teach(sizer, "k", strong, 4, 40)
    assert sizer.width(["k"], [weak], [0]) == 1
    assert sizer.width(["k"], [strong], [0]) == len(strong)
    assert sizer.width(["other"], [strong], [0]) == 1, "another kind starts from an even prior"
    unseen = TokenTree.chain(5, [6, 7, 8, 9], evidence=7)
    pooled = sizer.expected_accepted("k", unseen)
    assert 0 < pooled[-1] < sizer.expected_accepted("k", strong)[-1], "an unseen evidence takes the kind's pooled rate"


def test_a_tries_siblings_are_verified_where_they_cost_nothing():
    trie = TokenTree((5, 6, 7, 8), (-1, 0, 0, 0))  # three guesses at one depth: worth the first one's, as estimated
    assert LoadSizer(flat).width(["k"], [trie], [0]) == len(trie)
    assert LoadSizer(half_node).width(["k"], [trie], [0]) == 1, "where a node costs, the same rate goes to the narrower"


def test_a_price_is_asked_once_per_shape():
    asked = []

    def counting(rows, width, context):
        asked.append((rows, width, context))
        return 1.0

    sizer = LoadSizer(counting, prompt_tokens=100)
    for emitted in (10, 11, 12):
        sizer.width(["k"], [CHAIN], [emitted])
    assert len(asked) == len(set(asked)) == len(CHAIN)
    assert {context for _, _, context in asked} == {128}, "contexts priced to 64 tokens: 100 + 10 -> 128"
    asked.clear()
    reads = ReadSizers(counting, rows=4)
    for read in range(3):  # each read's own sizer, prices shared between them
        reads.sizer(prompt_tokens=100).width(["k"], [CHAIN], [10 + read])
    assert len(asked) == len(set(asked)) == len(CHAIN)


def scripts(count, length, seed):
    rng = random.Random(seed)
    return [[rng.randrange(98) for _ in range(length)] + [99] for _ in range(count)]


def noisy(script, rate, seed):
    rng = random.Random(seed)
    return [rng.randrange(98) if rng.random() < rate else token for token in script]


@pytest.mark.parametrize("price", [flat, half_node, saturating], ids=["flat", "half-node", "saturating"])
def test_sized_steps_decode_what_whole_trees_decode(price):
    texts = scripts(6, 120, seed=1)
    rates = [0.02, 0.5, None, 0.0, 0.1, 0.9]  # share of draft tokens replaced; None: no draft
    drafts = [[] if rate is None else [noisy(text, rate, seed)] for seed, (text, rate) in enumerate(zip(texts, rates))]

    def run(sizer):
        requests = [DecodeRequest(None, str(i), DraftProposer(d) if d else NoDraftProposer()) for i, d in enumerate(drafts)]
        return dict(decode_stream(NamedScriptTarget(texts), requests, DecodeConfig(max_new_tokens=200, repetition_guard=False),
                                  max_rows=3, sizers=lambda index: sizer))

    whole, sized = run(None), run(LoadSizer(price))
    for index, text in enumerate(texts):
        assert sized[index].tokens == whole[index].tokens == text, f"request {index}"
    if price is half_node:
        # A node costs half a plain row: drafts that keep failing are not worth it.
        assert sum(r.stats.proposed for r in sized.values()) < sum(r.stats.proposed for r in whole.values()) / 2
    if price is flat:
        assert [r.stats.forwards for r in sized.values()] == [r.stats.forwards for r in whole.values()]


def test_drafts_that_keep_failing_cost_nothing_once_learned():
    text = scripts(1, 400, seed=5)[0]
    wrong = [noisy(text, 1.0, 6)]  # every draft token wrong: each offered depth fails
    request = DecodeRequest(None, "", DraftProposer(wrong))
    result = decode_batch(ScriptedTarget([text]), [request], DecodeConfig(max_new_tokens=500, repetition_guard=False),
                          sizer=LoadSizer(half_node))[0]
    assert result.tokens == text
    widths = [width for _, width, _ in result.stats.steps]
    assert widths[-100:] == [1] * 100, "after learning, plain steps"


def test_a_draft_that_starts_to_hold_after_failing_is_verified_again():
    """Plain steps still learn: each one's token says whether the draft's first node would have held."""
    text = scripts(1, 700, seed=9)[0]
    draft = noisy(text[:100], 1.0, 10) + text[100:]  # wrong for 100 tokens, then the model's own
    request = DecodeRequest(None, "", DraftProposer([draft]))
    result = decode_batch(ScriptedTarget([text]), [request], DecodeConfig(max_new_tokens=800, repetition_guard=False),
                          sizer=LoadSizer(half_node))[0]
    assert result.tokens == text
    widths = [width for _, width, _ in result.stats.steps]
    assert 1 in widths[:60], "the failing draft stopped being verified"
    assert max(widths[-20:]) > 1, "and was verified again once it held"


def test_a_plain_step_teaches_depth_one_only():
    sizer = LoadSizer(half_node)
    root = TokenTree.chain(5, [])
    for _ in range(10):
        sizer.observe("k", root, [0], CHAIN, next_token=6)  # CHAIN's first node is 6: it would have held
    sizer.observe("k", root, [0], CHAIN, next_token=1)
    sizer.observe("k", root, [0])  # nothing proposed: nothing learned
    counts = sizer._counts["k", CHAIN.evidence]
    assert (counts.tried[1], counts.reached[1]) == (11, 10)
    assert sum(counts.tried[2:]) == 0


def test_a_request_with_a_sizer_of_its_own_is_sized_as_if_read_alone_whatever_was_read_before_it():
    texts = scripts(2, 300, seed=7)
    drafts = [[noisy(texts[0], 1.0, 8)], [texts[1]]]  # the first request's drafts all fail, the second's all hold
    config = DecodeConfig(max_new_tokens=400, repetition_guard=False)

    def requests(indices):
        return [DecodeRequest(None, str(i), DraftProposer(drafts[i])) for i in indices]

    asked = []

    def own_sizer(index):
        asked.append(index)
        return LoadSizer(quarter_node)

    after_failing = dict(decode_stream(NamedScriptTarget(texts), requests([0, 1]), config, max_rows=1, sizers=own_sizer))
    alone = decode_batch(NamedScriptTarget(texts), requests([1]), config, sizer=LoadSizer(quarter_node))[0]
    assert asked == [0, 1], "one sizer per request, asked with its index"
    assert after_failing[1].tokens == alone.tokens == texts[1]
    assert after_failing[1].stats.steps == alone.stats.steps, "the same widths, step for step"
    assert max(width for _, width, _ in alone.stats.steps) > 1


def width_row_by_row(sizer, kinds, trees, emitted):
    """LoadSizer.width as its definition reads: every row's expected gain at every width, summed."""
    rows, widest = len(trees), max(len(tree) for tree in trees)
    context = CONTEXT_STEP * round((sizer.prompt_tokens + sum(emitted) / rows) / CONTEXT_STEP)
    gains = [sizer.expected_accepted(kind, tree) for kind, tree in zip(kinds, trees)]
    priced_rows = sizer.batch_rows or rows
    rates = [(rows + sum(gain[min(width, len(gain)) - 1] for gain in gains)) / rows / sizer.step_cost(priced_rows, width, context)
             for width in range(1, widest + 1)]
    best = 0
    for index, rate in enumerate(rates):
        best = index if rate > rates[best] * (1 + 1e-9) else best
    return best + 1


def test_the_width_of_rows_of_several_kinds_and_evidences_is_the_best_rate_over_their_gains():
    sizer = LoadSizer(lambda rows, width, context: rows * (1 + 0.3 * (width - 1)) + context / 512, prompt_tokens=100)
    weak = TokenTree.chain(5, [6, 7, 8, 9], evidence=3)
    teach(sizer, "k", weak, 1, 10)
    teach(sizer, "k", TRIE, 2, 10)
    teach(sizer, "other", CHAIN, 4, 10)
    rows = [("k", weak), ("k", TRIE), ("other", CHAIN), ("k", TokenTree.chain(1, [])), ("other", TRIE), ("k", CHAIN)]
    for count in range(1, len(rows) + 1):
        kinds, trees = [kind for kind, _ in rows[:count]], [tree for _, tree in rows[:count]]
        emitted = [40 * index for index in range(count)]
        assert sizer.width(kinds, trees, emitted) == width_row_by_row(sizer, kinds, trees, emitted)
        sizer.batch_rows = 64  # priced at a fixed load
        assert sizer.width(kinds, trees, emitted) == width_row_by_row(sizer, kinds, trees, emitted)
        sizer.batch_rows = None
    assert {sizer.width(["k"], [tree], [0]) for tree in (weak, TRIE, CHAIN)} != {1}, "some row verifies its draft"
