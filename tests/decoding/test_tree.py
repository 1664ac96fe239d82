import numpy as np
import pytest
import torch

from hsd_cli.decoding.tree import (
    ROW_BUCKETS, WIDTH_BUCKETS, TokenTree, ancestor_bits, batch_trees, bit_rows, bucket, positions, step_shape, tree_layout,
)


def test_chain_layout_is_lower_triangular():
    tree = TokenTree.chain(7, [8, 9, 10])
    layout = tree_layout(tree.parents)
    assert tree.parents == (-1, 0, 1, 2)
    np.testing.assert_array_equal(layout.ancestors, np.tril(np.ones((4, 4), dtype=bool)))
    np.testing.assert_array_equal(layout.depths, [0, 1, 2, 3])


def test_branching_tree_layout():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    parents = [-1, 0, 0, 1, 1, 2]
    layout = tree_layout(parents)
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 0, 1, 0, 0, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(layout.ancestors, expected)
    np.testing.assert_array_equal(layout.depths, [0, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(positions(layout, 100), [100, 101, 101, 102, 102, 102])


@pytest.mark.parametrize("parents", [(0, 0), (-1, 1), (-1, 0, 3, 1), (-1, -1)])
def test_invalid_parents_are_rejected(parents):
    with pytest.raises(ValueError):
        TokenTree(tuple(range(len(parents))), parents)


def test_batch_pads_and_padding_nodes_see_only_themselves():
    small = TokenTree.chain(5, [6])
    wide = TokenTree((1, 2, 3, 4), (-1, 0, 0, 1))
    batch = batch_trees([small, wide], pad_token=0)
    assert batch.width == 4
    assert batch.tokens.tolist() == [[5, 6, 0, 0], [1, 2, 3, 4]]
    assert batch.valid.tolist() == [[True, True, False, False], [True] * 4]
    assert batch.depths.tolist() == [[0, 1, 0, 0], [0, 1, 1, 2]]
    assert batch.parents.tolist() == [[-1, 0, -1, -1], [-1, 0, 0, 1]]
    assert torch.equal(batch.ancestors[0, 2], torch.tensor([False, False, True, False]))
    assert torch.equal(batch.ancestors[1, 3], torch.tensor([True, True, False, True]))


def test_ancestor_bits_hold_each_node_and_its_ancestors():
    #   0 -> 1 -> 3, 0 -> 2 -> 4 -> 5
    assert ancestor_bits((-1, 0, 0, 1, 2, 4)) == [0b1, 0b11, 0b101, 0b1011, 0b10101, 0b110101]
    assert ancestor_bits((-1,)) == [1]


@pytest.mark.parametrize("width", [1, 3, 64, 70])
def test_bit_rows_put_bit_j_in_column_j(width):
    bits = [0, 1, 1 << (width - 1), (1 << width) - 1, 0b101 & ((1 << width) - 1)]
    rows = bit_rows(bits, width)
    assert rows.dtype == bool and rows.shape == (5, width)
    expected = [[bool(value >> column & 1) for column in range(width)] for value in bits]
    assert rows.tolist() == expected


def test_a_batch_of_plain_steps_chains_and_tries_lays_out_each_row_as_its_own_tree():
    trees = [
        TokenTree.chain(9, []),
        TokenTree((1, 2, 3, 4, 5, 6), (-1, 0, 0, 1, 2, 4)),
        TokenTree.chain(7, [8, 9]),
        TokenTree((3, 4, 5), (-1, 0, 0)),
    ]
    batch = batch_trees(trees, pad_token=0)
    for row, tree in enumerate(trees):
        size = len(tree)
        layout = tree_layout(tree.parents)
        np.testing.assert_array_equal(batch.ancestors[row, :size, :size].numpy(), layout.ancestors)
        np.testing.assert_array_equal(batch.depths[row, :size].numpy(), layout.depths)
        assert batch.tokens[row, :size].tolist() == list(tree.tokens)
        assert batch.parents[row].tolist() == list(tree.parents) + [-1] * (6 - size)
        np.testing.assert_array_equal(batch.ancestors[row, size:].numpy(), np.eye(6, dtype=bool)[size:])
        assert batch.depths[row, size:].tolist() == [0] * (6 - size)
    assert batch.depths[1].tolist() == [0, 1, 1, 2, 2, 3]
    assert batch.ancestors[1, 5].tolist() == [True, False, True, False, True, True]
    for row, tree in enumerate(trees):  # a tree batched alone is its row of the batch, unpadded
        alone, size = batch_trees([tree]), len(tree)
        assert alone.width == size and alone.valid.all()
        for name in ("tokens", "parents", "depths", "valid"):
            assert getattr(alone, name)[0].tolist() == getattr(batch, name)[row, :size].tolist()
        assert torch.equal(alone.ancestors[0], batch.ancestors[row, :size, :size])


def test_step_shapes_fall_in_a_few_fixed_buckets():
    assert [bucket(size, WIDTH_BUCKETS) for size in (1, 2, 3, 5, 17, 33, 41, 64, 65, 130)] == [1, 2, 4, 8, 32, 48, 48, 64, 128, 192]
    assert step_shape(3, [1, 5, 2]) == (4, 8) and step_shape(256, [1] * 256) == (256, 1) and step_shape(300, [41]) == (512, 48)
    shapes = {step_shape(rows, [width]) for rows in range(1, 513) for width in range(1, 65)}
    assert shapes == {(rows, width) for rows in ROW_BUCKETS for width in WIDTH_BUCKETS}
    assert all(r >= rows and w >= width for rows in (1, 7, 300, 700) for width in (1, 9, 70) for r, w in [step_shape(rows, [width])])


def test_trees_padded_to_a_given_width_keep_their_layout():
    trees = [TokenTree((5, 6, 7), (-1, 0, 0)), TokenTree.chain(1, [2])]
    widest, padded = batch_trees(trees), batch_trees(trees, width=8)
    assert padded.width == 8 and padded.valid.sum(1).tolist() == [3, 2]
    for name in ("tokens", "parents", "depths", "valid"):
        assert torch.equal(getattr(padded, name)[:, :3], getattr(widest, name))
    assert torch.equal(padded.ancestors[:, :3, :3], widest.ancestors)
    # A padding node sees only itself, at depth 0, with no parent; one tree alone is padded too.
    assert torch.equal(padded.ancestors[:, 3:, :], torch.eye(8, dtype=torch.bool)[3:].expand(2, 5, 8))
    assert (padded.depths[:, 3:] == 0).all() and (padded.parents[:, 3:] == -1).all()
    alone = batch_trees(trees[:1], width=4)
    assert alone.width == 4 and alone.valid.tolist() == [[True, True, True, False]]


def test_a_batch_whose_every_row_branches_lays_out_each_row_as_its_own_tree():
    trees = [TokenTree((1, 2, 3, 4, 5, 6), (-1, 0, 0, 1, 2, 4)), TokenTree((3, 4, 5), (-1, 0, 0)), TokenTree((7, 8, 9, 1), (-1, 0, 1, 0))]
    batch = batch_trees(trees)
    for row, tree in enumerate(trees):
        size, layout = len(tree), tree_layout(tree.parents)
        np.testing.assert_array_equal(batch.ancestors[row, :size, :size].numpy(), layout.ancestors)
        np.testing.assert_array_equal(batch.depths[row, :size].numpy(), layout.depths)
        np.testing.assert_array_equal(batch.ancestors[row, size:].numpy(), np.eye(6, dtype=bool)[size:])
        assert batch.depths[row, size:].tolist() == [0] * (6 - size)


def test_random_rows_of_every_width_lay_out_as_each_tree_alone():
    # Branching rows are laid out by pointer jumping over bits, a 64-bit word per 64 nodes:
    # trees of up to 130 nodes, deep chains among them, against each tree's own layout.
    import random

    rng = random.Random(5)
    for _ in range(40):
        trees = []
        for _ in range(rng.randint(1, 6)):
            size = rng.choice([1, 2, 5, 40, 64, 65, 130])
            parents = [-1] + [rng.choice([node - 1, node - 1, node - 1, rng.randrange(node)]) for node in range(1, size)]
            trees.append(TokenTree(tuple(range(size)), tuple(parents)))
        batch, width = batch_trees(trees), max(len(tree) for tree in trees)
        for row, tree in enumerate(trees):
            size, layout = len(tree), tree_layout(tree.parents)
            np.testing.assert_array_equal(batch.ancestors[row, :size, :size].numpy(), layout.ancestors)
            np.testing.assert_array_equal(batch.depths[row, :size].numpy(), layout.depths)
            np.testing.assert_array_equal(batch.ancestors[row, size:].numpy(), np.eye(width, dtype=bool)[size:])
            assert not batch.ancestors[row, :size, size:].any() and batch.depths[row, size:].tolist() == [0] * (width - size)


def test_trees_built_unchecked_equal_the_checked_ones():
    assert TokenTree.chain(4, [5, 6], evidence=2) == TokenTree((4, 5, 6), (-1, 0, 1), 2)
    assert TokenTree.built([1, 2, 3], range(-1, 2)) == TokenTree((1, 2, 3), (-1, 0, 1))
    assert TokenTree((1, 2, 3), (-1, 0, 0), 5).first(2) == TokenTree((1, 2), (-1, 0), 5)
