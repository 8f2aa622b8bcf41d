"""Advantage estimators against the published formulas on hand-computed groups and trees."""

from __future__ import annotations

import numpy as np
import pytest

from bpo_algos.advantages import bpo_advantages, grpo_advantages, rloo_advantages
from bpo_algos.policy.base import Action, Context
from bpo_algos.tree import Edge, Node, RolloutTree


def test_grpo_hand_computed():
    returns = [1.0, 0.0, 0.0, 1.0]
    # mean 0.5, sample std = sqrt(1/3)
    expected = np.array([0.5, -0.5, -0.5, 0.5]) / (np.sqrt(1 / 3) + 1e-6)
    np.testing.assert_allclose(grpo_advantages(returns), expected)
    np.testing.assert_allclose(grpo_advantages(returns, scale="none"), [0.5, -0.5, -0.5, 0.5])
    np.testing.assert_allclose(grpo_advantages([0.3, 0.3, 0.3]), [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="scale"):
        grpo_advantages(returns, scale="batch")


def test_rloo_hand_computed():
    np.testing.assert_allclose(rloo_advantages([1.0, 0.0, 0.5]), [1.0 - 0.25, 0.0 - 0.75, 0.5 - 0.5])
    np.testing.assert_allclose(rloo_advantages([2.0, 4.0]), [-2.0, 2.0])
    # mean-zero, and RLOO = N/(N-1) * (R - mean)
    r = np.array([0.1, 0.7, 0.4, 0.9])
    np.testing.assert_allclose(rloo_advantages(r), 4 / 3 * (r - r.mean()))


def _node(obs="s"):
    return Node(context=Context(0, obs, ("a", "b")), info={})


def _edge(parent, reward, done=False):
    child = _node()
    edge = Edge(parent, child, Action("a", (0,), (0.0,)), reward, done, False, {})
    child.parent = edge
    parent.children.append(edge)
    return edge


def test_bpo_advantages_hand_built_tree():
    """root (K0=2) -> backbone 1: r=0.1, then branch (K=2) at its child: leaves 1.0 and 0.0;
    backbone 2: r=0, then one more step with reward 0.5 (no branch)."""
    root = _node()
    root.branch_factor = 2
    e1 = _edge(root, 0.1)
    e2 = _edge(root, 0.0)
    b = e1.child
    b.branch_factor = 2
    x1 = _edge(b, 1.0, done=True)
    x2 = _edge(b, 0.0, done=True)
    y = _edge(e2.child, 0.5, done=True)
    tree = RolloutTree(0, root)
    tree.finalize()
    assert (e1.weight, e2.weight, x1.weight, x2.weight, y.weight) == (0.5, 0.5, 0.25, 0.25, 0.5)
    assert e1.q == pytest.approx(0.1 + 0.5) and e2.q == pytest.approx(0.5) and y.q == pytest.approx(0.5)
    bpo_advantages(tree)
    # root children: RLOO among the K0 backbones
    assert e1.advantage == pytest.approx(0.6 - 0.5)
    assert e2.advantage == pytest.approx(0.5 - 0.6)
    # inner branch: siblings of each other
    assert x1.advantage == pytest.approx(1.0 - 0.0) and x2.advantage == pytest.approx(0.0 - 1.0)
    # a backbone step below the root group: reward collected since the root + Q - sibling value
    assert y.advantage == pytest.approx(0.0 + 0.5 - 0.6)
    assert tree.mean_return() == pytest.approx(0.55)
