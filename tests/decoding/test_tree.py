import numpy as np
import pytest
import torch

from hsd_cli.decoding.tree import TokenTree, batch_trees, positions, tree_layout


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
