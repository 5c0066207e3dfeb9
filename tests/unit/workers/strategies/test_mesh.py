"""Placement rules of the ("pp", "dp", "tp") mesh."""

from __future__ import annotations

import pytest

from workers.strategies.mesh import check_tp_placement


@pytest.mark.parametrize(
    "nodes,tp",
    [([0, 0, 1, 1], 2), ([0, 0, 0, 0], 4), ([0, 1, 2, 3], 1), ([0, 0, 0, 0, 1, 1, 1, 1], 4)],
)
def test_tp_groups_inside_one_node_pass(nodes, tp):
    check_tp_placement(nodes, tp=tp)


@pytest.mark.parametrize(
    "nodes,tp,bad",
    [([0, 1, 1, 1], 2, "0..1"), ([0, 0, 0, 1], 4, "0..3"), ([0, 0, 1, 0, 1, 1], 3, "0..2")],
)
def test_tp_group_spanning_nodes_is_refused(nodes, tp, bad):
    with pytest.raises(ValueError, match=rf"parallelism.tp \({tp}\) group of world ranks {bad}"):
        check_tp_placement(nodes, tp=tp)
