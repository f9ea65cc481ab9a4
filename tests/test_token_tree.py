import numpy as np
import pytest

from edgespec.runtime.tree import TokenTree


def test_a_chain_is_a_tree_whose_nodes_follow_each_other():
    tree = TokenTree.chain([5, 6, 7])
    assert tree.is_chain and tree.depth == (1, 2, 3)
    assert tree.path_tokens(2) == [5, 6, 7]
    assert np.array_equal(tree.ancestor_mask(), np.tril(np.ones((3, 3), dtype=bool)))
    assert tree.positions(10).tolist() == [10, 11, 12]


def test_siblings_share_a_position_and_never_see_each_other():
    #        root
    #       /    \
    #     a(0)   b(1)
    #     /  \      \
    #   c(2) d(3)   e(4)
    tree = TokenTree((10, 11, 12, 13, 14), (-1, -1, 0, 0, 1))
    assert not tree.is_chain
    assert tree.depth == (1, 1, 2, 2, 2) and tree.max_depth == 2
    assert tree.positions(4).tolist() == [4, 4, 5, 5, 5]
    assert tree.children(-1) == [0, 1] and tree.children(0) == [2, 3]
    assert tree.path(3) == [0, 3] and tree.path(4) == [1, 4] and tree.path(-1) == []
    mask = tree.ancestor_mask()
    assert mask[3].tolist() == [True, False, False, True, False]
    assert mask[4].tolist() == [False, True, False, False, True]
    assert not mask[0, 1] and not mask[2, 3]


@pytest.mark.parametrize("parents", [(-1, 1), (0,), (-1, -2)])
def test_a_parent_must_come_before_its_child(parents):
    with pytest.raises(ValueError, match="parent"):
        TokenTree(tuple(range(len(parents))), parents)


def test_one_parent_per_token():
    with pytest.raises(ValueError, match="one parent per token"):
        TokenTree((1, 2), (-1,))
