import torch

from hsd_cli.decoding.tree import TokenTree, batch_trees
from hsd_cli.decoding.verify import (
    NearLossless,
    SamplingConfig,
    StepOutcome,
    StepOutcomes,
    accept_paths,
    first_tokens,
    greedy_picks,
    keyed_gumbel,
    keyed_sample,
    processed_probs,
    relax_path,
    sample_and_match,
    sample_tokens,
    verify_trees,
)

#        0 (root 10)
#      /    \
#   1 (11)  2 (12)
#    |        |
#   3 (13)  4 (14)
#             |
#           5 (15)
TREE = TokenTree((10, 11, 12, 13, 14, 15), (-1, 0, 0, 1, 2, 4))


def test_greedy_walk_follows_matching_children_and_returns_bonus():
    batch = batch_trees([TREE])
    picked = torch.tensor([[12, 99, 14, 99, 15, 42]])
    (outcome,) = accept_paths(batch, picked)
    assert outcome.path == [0, 2, 4, 5]
    assert outcome.bonus == 42
    assert outcome.accepted == 3


def test_walk_stops_at_root_when_no_child_matches():
    batch = batch_trees([TREE])
    (outcome,) = accept_paths(batch, torch.tensor([[77, 11, 14, 0, 15, 0]]))
    assert outcome.path == [0] and outcome.bonus == 77


def test_padding_nodes_are_never_accepted():
    short = TokenTree.chain(1, [2])
    batch = batch_trees([short, TREE], pad_token=0)  # short is padded with token 0 nodes
    picked = torch.tensor([[2, 0, 0, 0, 0, 0], [11, 13, 0, 5, 0, 0]])
    short_outcome, tree_outcome = accept_paths(batch, picked)
    assert short_outcome.path == [0, 1] and short_outcome.bonus == 0
    assert tree_outcome.path == [0, 1, 3] and tree_outcome.bonus == 5


def test_every_rows_path_and_bonus_come_back_in_row_order():
    """Rows of different trees and path lengths read back together (a plain row, a chain that
    holds, a tree that takes its second branch, a chain that fails at once)."""
    trees = [TokenTree.chain(4, []), TokenTree.chain(1, [2, 3]), TREE, TokenTree.chain(6, [7])]
    batch = batch_trees(trees, pad_token=0)
    picked = torch.tensor([
        [30, 0, 0, 0, 0, 0],
        [2, 3, 31, 0, 0, 0],
        [12, 0, 14, 0, 0, 32],  # 0 -> 2 -> 4 (token 14) -> 5 (token 15 != 0): path [0, 2, 4]
        [33, 7, 0, 0, 0, 0],
    ])
    outcomes = accept_paths(batch, picked)
    assert [(o.path, o.bonus) for o in outcomes] == [([0], 30), ([0, 1, 2], 31), ([0, 2, 4], 0), ([0], 33)]


def test_top_k_and_top_p_processing():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top_k = processed_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    torch.testing.assert_close(top_k, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    top_p = processed_probs(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(top_p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    top_p_more = processed_probs(logits, SamplingConfig(temperature=1.0, top_p=0.81))
    assert (top_p_more[0, :3] > 0).all() and top_p_more[0, 3] == 0


def test_keyed_draws_depend_only_on_seed_row_and_position():
    assert torch.equal(keyed_gumbel(3, 0, 17, 50), keyed_gumbel(3, 0, 17, 50))
    assert keyed_gumbel(3, 0, 17, 50).dtype == torch.float32
    assert not torch.equal(keyed_gumbel(3, 0, 17, 50), keyed_gumbel(3, 0, 18, 50))
    assert not torch.equal(keyed_gumbel(3, 0, 17, 50), keyed_gumbel(4, 0, 17, 50))
    assert not torch.equal(keyed_gumbel(3, 0, 17, 50), keyed_gumbel(3, 1, 17, 50))  # rows draw independently


def test_gumbel_max_draws_follow_the_distribution():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    draws = torch.stack([sample_tokens(probs, keyed_gumbel(0, 0, t, 4)) for t in range(4000)])
    frequencies = torch.bincount(draws, minlength=4).double() / len(draws)
    assert (frequencies - probs.double()).abs().max() < 0.03
    masked = torch.tensor([0.0, 0.5, 0.5, 0.0])
    assert all(sample_tokens(masked, keyed_gumbel(0, 0, t, 4)).item() in (1, 2) for t in range(200))


def test_sampling_walk_draws_each_node_at_its_row_and_output_position():
    sampling = SamplingConfig(temperature=1.0, seed=5)
    # Logits that make the draw at the root token 12 in row 1 and 11 in row 0, and after that any token.
    logits = torch.randn(2, len(TREE), 50, generator=torch.Generator().manual_seed(0))
    logits[0, 0, 11] = logits[1, 0, 12] = 50.0
    trees = batch_trees([TREE, TREE])
    rows, emitted = [3, 6], [7, 9]
    for b, outcome in enumerate(verify_trees(trees, logits.flatten(0, 1), rows, emitted, [sampling, sampling])):
        assert outcome.path[:2] == [0, 1 + b]
        for depth, node in enumerate(outcome.path):
            drawn = keyed_sample(logits[b, node], sampling, rows[b], emitted[b] + depth)
            child = [c for c, p in enumerate(TREE.parents) if p == node and TREE.tokens[c] == drawn]
            assert child == outcome.path[depth + 1 : depth + 2]
        assert outcome.bonus == keyed_sample(logits[b, outcome.path[-1]], sampling, rows[b], emitted[b] + outcome.accepted)
    prefill = logits[:, 0]
    assert first_tokens(prefill, [3, 6], [sampling, sampling]) == [11, 12]
    assert first_tokens(prefill, [0, 1], [SamplingConfig()] * 2) == prefill.argmax(-1).tolist()


def test_greedy_picks_are_torch_argmax_ties_included():
    # generate picks with torch.argmax: the first of tied maxima; so must the host's argmax.
    logits = torch.randn(3, 4, 1000, generator=torch.Generator().manual_seed(1))
    logits[0, 1, [7, 400, 999]] = 60.0
    logits[2, :, :] = 0.0
    with torch.inference_mode():
        inference_logits = logits.clone()
    for tensor in (logits, logits[:, 1:3], inference_logits, logits.transpose(0, 1)):
        assert torch.equal(greedy_picks(tensor), tensor.argmax(-1))
    assert greedy_picks(logits)[0, 1] == 7 and greedy_picks(logits)[2].tolist() == [0, 0, 0, 0]


def test_each_row_reads_its_own_nodes_logits_where_rows_are_padded():
    # The target gives logits for the valid nodes only, row by row: (N, V). A short tree beside
    # a long one must read its own nodes', greedy and sampling alike, as it would alone.
    short = TokenTree((20, 21, 22), (-1, 0, 1))
    trees = batch_trees([short, TREE])
    logits = torch.randn(len(short) + len(TREE), 50, generator=torch.Generator().manual_seed(2))
    logits[0, 21] = logits[1, 22] = 40.0  # the short row accepts both its draft tokens
    logits[3, 11] = logits[4, 13] = 40.0  # the long row accepts 11 then 13
    for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0, seed=1)):
        together = list(verify_trees(trees, logits, [0, 1], [5, 5], [sampling, sampling]))
        alone = [
            list(verify_trees(batch_trees([tree]), part, [row], [5], [sampling]))[0]
            for row, (tree, part) in enumerate(zip((short, TREE), logits.split([len(short), len(TREE)])))
        ]
        assert together == alone and [o.path for o in together] == [[0, 1, 2], [0, 1, 3]]


def test_rows_of_one_batch_pick_by_their_own_sampling():
    # A makers' retry samples at its attempt's temperature beside greedy rows: each row's walk is
    # the one it takes alone under its own rule, and the greedy row's is the argmax walk.
    trees = batch_trees([TREE, TREE])
    logits = torch.randn(2 * len(TREE), 50, generator=torch.Generator().manual_seed(3))
    mixed = [SamplingConfig(), SamplingConfig(temperature=1.0, seed=4)]
    together = list(verify_trees(trees, logits, [0, 1], [5, 5], mixed))
    alone = [
        list(verify_trees(batch_trees([TREE]), part, [row], [5], [sampling]))[0]
        for row, (sampling, part) in enumerate(zip(mixed, logits.split(len(TREE))))
    ]
    assert together == alone
    assert together[0].bonus == int(logits[together[0].path[-1]].argmax())
    prefill = logits[[0, len(TREE)]]
    assert first_tokens(prefill, [0, 1], mixed) == [int(prefill[0].argmax()), keyed_sample(prefill[1], mixed[1], 1, 0)]


def near_lossless_logits(second_share: float) -> torch.Tensor:
    # At the root the argmax is token 1; token 2 (the draft) has `second_share` of its probability.
    logits = torch.full((2, 4), -30.0)
    logits[0, 1] = 0.0
    logits[0, 2] = float(torch.log(torch.tensor(second_share)))
    logits[1, 3] = 0.0
    return logits


ANYWHERE = NearLossless(0.75, lambda output, draft, pick: True)
NOWHERE = NearLossless(0.75, lambda output, draft, pick: False)


def relaxed_walk(tokens, parents, logits, rule, output=(0,)):
    """The exact walk of a one-row tree, then the near-lossless walk from it (as the loop does)."""
    (exact,) = verify_trees(batch_trees([TokenTree(tuple(tokens), tuple(parents))]), logits, [0], [len(output)], [SamplingConfig()])
    return relax_path(exact, tokens, parents, logits, list(output), rule)


def test_near_lossless_accepts_close_draft_tokens_only_where_the_rule_lets_it():
    tokens, parents = [0, 2], [-1, 0]
    assert relaxed_walk(tokens, parents, near_lossless_logits(0.8), ANYWHERE) == StepOutcome([0, 1], 3, relaxed=1)
    assert relaxed_walk(tokens, parents, near_lossless_logits(0.5), ANYWHERE) == StepOutcome([0], 1)
    assert relaxed_walk(tokens, parents, near_lossless_logits(0.8), NOWHERE) == StepOutcome([0], 1)


def test_the_near_lossless_rule_is_asked_with_the_output_down_to_the_node_and_walks_on_exactly():
    # Root 0 -> 5 (the pick) -> 2 (close: 0.8 of the pick, token 1) -> 7 (the pick after 2); the
    # target picks 4 after 7. The rule is asked once, at node 1, about 2 standing for 1.
    tokens, parents = [0, 5, 2, 7], [-1, 0, 1, 2]
    logits = torch.full((4, 10), -30.0)
    logits[0, 5] = logits[2, 7] = logits[3, 4] = 0.0
    logits[1, 1], logits[1, 2] = 0.0, float(torch.log(torch.tensor(0.8)))
    asked = []

    def may_relax(output, draft, pick):
        asked.append((list(output), draft, pick))
        return True

    outcome = relaxed_walk(tokens, parents, logits, NearLossless(0.75, may_relax), output=(3, 0))
    assert outcome == StepOutcome([0, 1, 2, 3], 4, relaxed=1)
    assert asked == [([3, 0, 5], 2, 1)]


def test_near_lossless_takes_the_closest_child_the_rule_allows():
    # Two draft children of the root, 0.9 and 0.8 of the pick: the closer is refused, the other taken.
    tokens, parents = [0, 2, 3], [-1, 0, 0]
    logits = torch.full((3, 6), -30.0)
    logits[0, 1] = 0.0
    logits[0, 2], logits[0, 3] = float(torch.log(torch.tensor(0.9))), float(torch.log(torch.tensor(0.8)))
    logits[2, 5] = 0.0
    not_two = NearLossless(0.75, lambda output, draft, pick: draft != 2)
    assert relaxed_walk(tokens, parents, logits, not_two) == StepOutcome([0, 2], 5, relaxed=1)
    assert relaxed_walk(tokens, parents, logits, ANYWHERE).path == [0, 1]


def test_greedy_outcomes_are_the_walk_from_each_root_down_the_children_that_carry_the_picks():
    # Logits that mostly pick a child's token, so walks go deep as well as ending at the root, in
    # chains, tries and padded rows; `sample_and_match`'s walk, with the argmax, is the reference.
    import random

    rng = random.Random(3)
    for _ in range(200):
        trees = []
        for _ in range(rng.randint(1, 5)):
            size = rng.randint(1, 12)
            parents = [-1] + [rng.choice([node - 1, node - 1, rng.randrange(node)]) for node in range(1, size)]
            tokens = [rng.randrange(6)]
            for node in range(1, size):  # a node's children carry distinct tokens, as in tries and chains
                taken = {tokens[kid] for kid in range(1, node) if parents[kid] == parents[node]}
                tokens.append(rng.choice([token for token in range(12) if token not in taken]))
            trees.append(TokenTree(tuple(tokens), tuple(parents)))
        batch = batch_trees(trees)
        node_picks = []
        for tree in trees:
            for node in range(len(tree)):
                children = [tree.tokens[kid] for kid in range(len(tree)) if tree.parents[kid] == node]
                node_picks.append(rng.choice(children) if children and rng.random() < 0.8 else rng.randrange(12))
        logits = torch.nn.functional.one_hot(torch.tensor(node_picks), 12).float()
        rows, walks = len(trees), []
        for row, (tree, tree_logits) in enumerate(zip(trees, logits.split([len(tree) for tree in trees]))):
            walks.append(sample_and_match(tree.tokens, tree.parents, tree_logits, SamplingConfig(), row, 3))
        outcomes = verify_trees(batch, logits, list(range(rows)), [3] * rows, [SamplingConfig()] * rows)
        assert list(outcomes) == walks
        assert outcomes.tokens == [[tree.tokens[node] for node in walk.path[1:]] + [walk.bonus] for tree, walk in zip(trees, walks)]


def test_a_mismatch_far_up_a_deep_path_stops_the_walk_there():
    # Paths are found by pointer jumping (log2 of the depth in rounds): a node deep down whose
    # own token and most ancestors' match must still be refused where one far above does not.
    for depth in (1, 2, 3, 8, 31, 32, 33, 40, 70):
        chain = TokenTree.chain(0, list(range(1, depth + 1)))
        # A trie: the chain again below the root's second child, its first child a dead end.
        trie = TokenTree((0, 50, *range(1, depth + 1)), (-1, 0, 0, *range(2, depth + 1)))
        for broken in range(1, depth + 1):
            picks = list(range(1, depth + 1)) + [7]  # node k picks k + 1: every child matches...
            picks[broken - 1] = 99  # ...except node `broken`, whose parent picks another token
            batch = batch_trees([chain, trie, TokenTree.chain(5, [])])
            picked = torch.zeros(batch.valid.shape, dtype=torch.long)
            picked[0, : depth + 1] = torch.tensor(picks)
            picked[1, 0], picked[1, 2:] = picks[0], torch.tensor(picks[1:])
            picked[2, 0] = 6
            outcomes = accept_paths(batch, picked)
            assert outcomes.paths[0] == list(range(broken)) and outcomes.tokens[0] == [*range(1, broken), 99]
            assert outcomes.paths[1] == [0, *range(2, broken + 1)] and outcomes.tokens[1] == [*range(1, broken), 99]
            assert outcomes.paths[2] == [0] and outcomes.tokens[2] == [6]


def test_outcomes_walked_row_by_row_read_each_rows_tokens_and_iterate_as_step_outcomes():
    walks = [StepOutcome([0, 2, 4], 42, relaxed=1), StepOutcome([0], 7)]
    outcomes = StepOutcomes.of(walks, [list(TREE.tokens), [5, 6]])
    assert outcomes.paths == [[0, 2, 4], [0]] and outcomes.tokens == [[12, 14, 42], [7]] and outcomes.relaxed == [1, 0]
    assert list(outcomes) == walks and len(outcomes) == 2
    assert list(StepOutcomes([[0, 1]], [[11, 3]])) == [StepOutcome([0, 1], 3)], "no relaxed counts: none relaxed"
