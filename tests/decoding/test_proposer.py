import pytest

from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer, ProposerConfig, TextDraftProposer, normalise
from hsd_cli.decoding.tree import tree_layout
from hsd_cli.decoding.trie import Continuation, build_trie, node_source


def children_of(tree, node):
    return [tree.tokens[i] for i, p in enumerate(tree.parents) if p == node]


def path_to(tree, node):
    """The tokens below the root down to `node`."""
    tokens = []
    while node > 0:
        tokens.append(tree.tokens[node])
        node = tree.parents[node]
    return tokens[::-1]


def sources_of(tree, continuations):
    """Every node's draft position, as a proposer looks up the one its step accepted."""
    return [node_source(continuations, path_to(tree, node)) for node in range(len(tree))]


def test_unique_match_proposes_rest_of_draft_as_capped_chain():
    draft = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    proposer = DraftProposer([draft], ProposerConfig(chain_max=4))
    tree = proposer.propose([50, 2, 3, 4])  # "2 3 4" occurs once; 50 does not matter
    assert tree.tokens == (4, 5, 6, 7, 8)
    assert tree.parents == (-1, 0, 1, 2, 3)


def test_no_occurrence_is_a_plain_step():
    proposer = DraftProposer([[1, 2, 3]])
    assert proposer.propose([9, 9, 42]).tokens == (42,)
    assert NoDraftProposer().propose([1, 2]).tokens == (2,)


def test_match_at_the_last_draft_token_is_useless():
    proposer = DraftProposer([[1, 2, 3]])
    assert proposer.propose([1, 2, 3]).tokens == (3,)


def test_several_matches_build_trie_ranked_by_context_and_window_grows():
    # "5 6" is followed by 7 in one place and 8 in another; token 6 also follows 9.
    drafts = [[1, 5, 6, 7, 7], [2, 5, 6, 8, 8], [9, 6, 3]]
    proposer = DraftProposer(drafts, ProposerConfig(window_min=2, window_max=5))
    tree = proposer.propose([5, 6])
    assert sorted(children_of(tree, 0)) == [3, 7, 8]
    # The two occurrences matching "5 6" rank before the one matching only "6".
    assert tree.tokens[1] in (7, 8) and tree.tokens[-1] == 3
    proposer.observe([7, 7])
    assert proposer.window == 4
    proposer.propose([1, 5, 6])  # now unique: "1 5 6"
    proposer.observe([])
    assert proposer.window == 2


def test_trie_respects_depth_and_budget_and_parents_precede_children():
    draft = [0] + list(range(100, 140)) + [0] + list(range(200, 240)) + [0] + list(range(300, 340))
    config = ProposerConfig(trie_depth=15, trie_budget=20)
    tree = DraftProposer([draft], config).propose([77, 0])
    assert len(tree) == 21  # root + budget
    assert max(tree_layout(tree.parents).depths) <= 15
    assert all(p < i for i, p in enumerate(tree.parents) if i)
    assert sorted(children_of(tree, 0)) == [100, 200, 300]


def test_best_first_flattening_goes_deep_on_the_best_continuation():
    continuations = [Continuation([1, 2, 3, 4], 1, (0, 10)), Continuation([5, 6, 7, 8], 9, (1, 20))]
    tree = build_trie(0, continuations, budget=5)
    assert tree.tokens == (0, 5, 6, 7, 8, 1)
    assert sources_of(tree, continuations) == [None, (1, 20), (1, 21), (1, 22), (1, 23), (0, 10)]


def test_resynchronises_after_a_substitution_in_the_draft():
    truth = list(range(10, 40))
    draft = truth.copy()
    draft[12] = 99  # the drafter got one token wrong
    proposer = DraftProposer([draft], ProposerConfig(chain_max=50))
    tree = proposer.propose(truth[:3])
    assert tree.tokens[1:] == tuple(draft[3:])
    proposer.observe(truth[3:12])  # accepted up to the substitution; target emits truth[12]
    tree = proposer.propose(truth[:13])
    # truth[12] is nowhere in the draft, yet the draft after the bad token is proposed.
    assert tree.tokens[0] == truth[12]
    node, path = 0, []
    for token in truth[13:]:
        kids = [i for i, p in enumerate(tree.parents) if p == node and tree.tokens[i] == token]
        if not kids:
            break
        node = kids[0]
        path.append(token)
    assert path == truth[13:]


def test_normalise_keeps_letters_digits_cjk_and_maps_back():
    text = "**A-1** 漢字, かな!"
    norm, index = normalise(text)
    assert norm == "A1漢字かな"
    assert [text[i] for i in index] == list(norm)


def char_codec():
    return (lambda s: [ord(c) for c in s]), (lambda tokens: "".join(chr(t) for t in tokens))


def test_text_proposer_matches_across_markup_and_retokenizes_the_rest():
    encode, decode = char_codec()
    proposer = TextDraftProposer(["**Hello**, wonderful world: the end"], encode, decode, min_chars=4)
    tree = proposer.propose(encode("Hello, wonderf"))
    assert decode(tree.tokens[1:]) == "ul world: the end"


def test_text_proposer_continues_at_next_word_after_output_whitespace():
    encode, decode = char_codec()
    proposer = TextDraftProposer(["| alpha | beta gamma |"], encode, decode, min_chars=4)
    tree = proposer.propose(encode("alpha\n"))
    assert decode(tree.tokens[1:]) == "beta gamma |"


def test_text_proposer_several_matches_make_a_trie_and_none_a_plain_step():
    encode, decode = char_codec()
    proposer = TextDraftProposer(["one two three", "one two four"], encode, decode, min_chars=4)
    tree = proposer.propose(encode("one two "))
    assert sorted(children_of(tree, 0)) == [ord("f"), ord("t")]
    assert len(proposer.propose(encode("zzzzzz"))) == 1


def test_start_forgets_the_previous_sequence():
    proposer = DraftProposer([[1, 5, 6, 7, 7], [2, 5, 6, 8, 8]], ProposerConfig(window_min=2, window_max=5))
    proposer.propose([5, 6])
    proposer.observe([7, 7])
    assert proposer.window == 4
    proposer.start()
    assert proposer.window == 2


def test_trie_keeps_only_the_best_matching_occurrences():
    # Token 0 occurs 31 times; only the occurrence after 9 matches more context ("9 0"), and
    # no occurrence matches the whole 3-token window, so a trie is built.
    draft = [p for i in range(30) for p in (50 + i, 0, 100 + i)] + [8, 9, 0, 777]
    tree = DraftProposer([draft], ProposerConfig(trie_continuations=4, trie_budget=40)).propose([7, 9, 0])
    assert tree.tokens[1] == 777  # ranked first
    assert len(children_of(tree, 0)) == 4


def test_drafts_added_while_decoding_are_proposed_from_the_next_step():
    proposer = DraftProposer([])
    assert proposer.propose([7, 2, 3, 4]).tokens == (4,), "nothing to propose yet"
    proposer.add_drafts([[1, 2, 3, 4, 5, 6], [9]])  # a one-token draft proposes nothing and is left out
    assert proposer.propose([7, 2, 3, 4]).tokens == (4, 5, 6)
    proposer.add_drafts([[0, 3, 4, 8]])  # now "3 4" continues two ways: a trie of both
    assert sorted(children_of(proposer.propose([7, 9, 3, 4]), 0)) == [5, 8]


def test_text_drafts_added_as_tokens_are_matched_as_their_text():
    vocab = {i: ch for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz ")}
    encode = lambda text: [next(i for i, c in vocab.items() if c == ch) for ch in text]  # noqa: E731
    decode = lambda tokens: "".join(vocab[t] for t in tokens)  # noqa: E731
    proposer = TextDraftProposer([], encode, decode, ProposerConfig(chain_max=6))
    context = encode("the quick brown")
    assert proposer.propose(context).tokens == (context[-1],)
    proposer.add_drafts([encode("the quick brown fox")])
    assert decode(proposer.propose(context).tokens[1:]) == " fox"


def test_trie_takes_nodes_by_score_then_sharing_and_keeps_the_best_continuations_source():
    continuations = [
        Continuation([1, 2, 3], 5, (0, 10)),
        Continuation([1, 2, 4], 5, (1, 20)),
        Continuation([1, 5], 7, (2, 30)),
        Continuation([6], 5, (0, 40)),
    ]
    tree = build_trie(9, continuations, budget=10)
    sources = sources_of(tree, continuations)
    # 1 (best score, 7) -> 5 (7); then 2 (score 5, shared by two) before 6 (5, alone); 3 and 4 last
    assert tree.tokens == (9, 1, 5, 2, 6, 3, 4)
    assert tree.parents == (-1, 0, 1, 1, 0, 3, 3)
    assert tree.evidence == 7
    assert sources == [None, (2, 30), (2, 31), (0, 11), (0, 40), (0, 12), (1, 22)]
    cut = build_trie(9, continuations, budget=3)
    assert cut.tokens == (9, 1, 5, 2) and sources_of(cut, continuations) == sources[:4]
    assert build_trie(9, [], budget=10).tokens == (9,)


def test_the_output_so_far_is_a_draft_too():
    # No draft holds "1 2" twice; the output has written "1 2 3 9" and now "1 2" again.
    proposer = DraftProposer([[7, 8]])
    assert proposer.propose([1, 2, 3, 9, 1, 2]).tokens == (2, 3, 9, 1, 2)
    assert DraftProposer([[7, 8]], ProposerConfig(own_output=False)).propose([1, 2, 3, 9, 1, 2]).tokens == (2,)


def test_the_output_is_looked_up_as_it_grows_and_never_past_its_end():
    proposer = DraftProposer([[7, 8]])
    assert proposer.propose([5, 6]).tokens == (6,), "nothing repeats yet"
    assert proposer.propose([5, 6, 5]).tokens == (5, 6, 5), "the output up to its last token, no further"
    assert proposer.propose([5, 6, 5, 6]).tokens == (6, 5, 6)


def test_output_and_drafts_continue_one_context_in_a_trie():
    proposer = DraftProposer([[4, 1, 2, 8, 8]], ProposerConfig(window_min=2))
    assert sorted(children_of(proposer.propose([1, 2, 3, 9, 1, 2]), 0)) == [3, 8]


def test_start_forgets_the_previous_sequences_output_but_keeps_the_drafts():
    proposer = DraftProposer([[4, 5, 6]])
    assert proposer.propose([1, 2, 3, 1, 2]).tokens == (2, 3, 1, 2)
    assert proposer.propose([1, 2, 3, 1, 2, 3, 42]).tokens == (42,)
    proposer.start()
    assert proposer.propose([9, 1, 2]).tokens == (2,), "the last sequence's output is no draft of this one"
    assert proposer.propose([9, 1, 2, 4, 5]).tokens == (5, 6)


def best_first_one_node_at_a_time(root, continuations, budget):
    """`build_trie`'s order spelt out: a heap of (-score, -continuations through the node, serial)
    popped one node at a time, with a node's children grouped when it is taken."""
    import heapq

    tokens, parents, frontier, serial = [root], [-1], [], 0

    def push_children(through, depth, index):
        nonlocal serial
        children = {}
        for item in through:
            if depth < len(item.tokens):
                children.setdefault(item.tokens[depth], []).append(item)
        for token, sharing in children.items():
            heapq.heappush(frontier, (-sharing[0].score, -len(sharing), serial, index, token, sharing, depth + 1))
            serial += 1

    push_children(sorted(continuations, key=lambda c: -c.score), 0, 0)
    while frontier and len(tokens) <= budget:
        _, _, _, parent, token, sharing, depth = heapq.heappop(frontier)
        tokens.append(token)
        parents.append(parent)
        push_children(sharing, depth, len(tokens) - 1)
    return tuple(tokens), tuple(parents)


@pytest.mark.parametrize(
    "tokens, longest, budget_max",
    [
        # Few distinct tokens: continuations share prefixes, end at every depth and tie on scores,
        # so every way `build_trie` takes several nodes at once is met.
        (4, 8, 20),
        # Many, long: continuations rarely share a first token, and the best ones often outlast
        # the budget (taken in one block of turns, a resynchronising pair's trie).
        (40, 40, 41),
    ],
)
def test_trie_is_the_best_first_heaps_node_for_node_on_random_continuations(tokens, longest, budget_max):
    import random

    rng = random.Random(7)
    for _ in range(3000):
        continuations = [
            Continuation(rng.choice([list, tuple])(rng.randrange(tokens) for _ in range(rng.randint(0, longest))), rng.choice([1, 1, 2, 5]), (0, 0))
            for _ in range(rng.randint(0, 6))
        ]  # token lists and tuples alike
        budget = rng.randint(0, budget_max)
        tree = build_trie(9, continuations, budget)
        assert (tree.tokens, tree.parents) == best_first_one_node_at_a_time(9, continuations, budget), (continuations, budget)
