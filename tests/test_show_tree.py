"""show-tree: the drawn tree has the allocation's structure (who branches where) and the leaves' outcomes."""

import numpy as np

from toy import make_tree
from trace_jax.show_tree import children, plot_tree, tree_text


def test_tree_text_shows_anchors_values_and_outcomes(tmp_path):
    # prompt 0: root 0 (3 turns, won) expanded twice after turn 0 and once after turn 1; root 1 (2 turns, lost);
    # prompt 1: root 2 alone
    success = np.array([[0.6, 0.7, 0.8, 0.9], [0.6, 0.2, 0.1, -1], [0.3, 0.4, -1, -1],
                        [0.6, 0.7, 0.5, 0.4], [0.6, 0.7, 0.3, -1], [0.6, 0.7, 0.8, 0.2]], np.float32)
    tree = make_tree(prompt=[0, 0, 1, 0, 0, 0], num_turns=[3, 2, 1, 3, 2, 3], reward=[1, 0, 0, 0, 1, 0],
                     parent=[-1, -1, -1, 0, 0, 0], branch_turn=[-1, -1, -1, 0, 0, 1], success=success)
    assert children(tree, 0)[(0, 1)] == [(0, 2), (3, 2), (4, 2)]
    assert children(tree, 0)[(0, 2)] == [(0, 3), (5, 3)]
    text = tree_text(tree, 0)
    assert text.splitlines()[0].endswith("2 root rollouts, 5 leaves, 2 succeeded")
    assert "turn 0  V~=0.70  expanded x2" in text and "turn 1  V~=0.80  expanded x1" in text
    assert "turn 2  V~=0.20  -> leaf of slot 5: reward 0" in text
    assert "turn 1  V~=0.30  -> leaf of slot 4: reward 1" in text
    assert text.count("-> leaf") == 5
    assert plot_tree(tree, 0, tmp_path / "t.png").stat().st_size > 0
