"""The estimator registry, and GiGPO / Tree-GRPO / anchored baselines against hand-computed
values on small hand-built trees; Tree-GRPO's and GiGPO's collection through the engine."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import bpo_envs  # noqa: F401 - registers the ids
from baselines import RLOO, GiGPO, TreeGRPO
from bpo_algos import BPO, TabularPolicy, make_algorithm, registered_algorithms
from bpo_algos.advantages import (
    AnchorHistory,
    anchored_baselines,
    estimate_advantages,
    get_advantage,
    register_advantage,
    registered_advantages,
)
from bpo_algos.policy.base import Action, Context
from bpo_algos.tree import Edge, Node, RolloutTree


def _node(obs: str) -> Node:
    return Node(context=Context(0, obs, ("a", "b")), info={})


def _edge(parent: Node, reward: float, obs: str = "x", done: bool = False) -> Edge:
    child = _node(obs)
    child.depth = parent.depth + 1
    edge = Edge(parent, child, Action("a", (0,), (0.0,)), reward, done, False, {})
    child.parent = edge
    parent.children.append(edge)
    return edge


def _tree(root: Node, task=0) -> RolloutTree:
    tree = RolloutTree(task, root)
    tree.finalize()
    return tree


def test_registry_lists_builtins_and_takes_a_users_estimator():
    assert {"grpo", "rloo", "bpo", "anchored", "gigpo", "tree-grpo"} <= set(registered_advantages())
    assert {"bpo-anchored", "rloo-anchored", "gigpo", "tree-grpo"} <= set(registered_algorithms())
    assert make_algorithm("rloo-anchored", group_size=3).options.baseline == "anchored"
    assert make_algorithm("bpo-anchored+history").options.baseline == "anchored+history"

    @register_advantage("test-constant", overwrite=True)
    def constant(trees, *, value=1.0):
        for tree in trees:
            for edge in tree.edges():
                edge.advantage = value

    root = _node("s")
    root.branch_factor = 2
    a, b = _edge(root, 1.0, done=True), _edge(root, 0.0, done=True)
    estimate_advantages("test-constant", _tree(root), value=2.5)  # a single tree is a batch of one
    assert a.advantage == b.advantage == 2.5
    assert get_advantage("test-constant") is constant
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("test-constant")(constant)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        estimate_advantages("nope", [])
    with pytest.raises(TypeError, match="RolloutTree"):
        estimate_advantages("rloo", [object()])


def test_baseline_option_is_checked():
    with pytest.raises(ValueError, match="baseline must be one of"):
        BPO(baseline="trajectory")
    with pytest.raises(ValueError, match="baseline must be one of"):
        RLOO(baseline="tree")
    with pytest.raises(TypeError, match="anchor_key"):
        RLOO(baseline="anchored", anchor_key="obs")


def _gigpo_tree() -> tuple[RolloutTree, list[Edge]]:
    """traj 1: s0 -> s1 -> s1 (a repeat) -> end, rewards 0, 0, 1; traj 2: s0 -> s2 -> end, 0, 0."""
    root = _node("s0")
    root.branch_factor = 2
    e1 = _edge(root, 0.0, "s1")
    e2 = _edge(e1.child, 0.0, "s1")
    e3 = _edge(e2.child, 1.0, "end", done=True)
    f1 = _edge(root, 0.0, "s2")
    f2 = _edge(f1.child, 0.0, "end", done=True)
    return _tree(root), [e1, e2, e3, f1, f2]


def test_gigpo_hand_computed_mean_norm():
    tree, (e1, e2, e3, f1, f2) = _gigpo_tree()
    get_advantage("gigpo")([tree], gamma=0.5, step_weight=1.0, scale="none")
    # episode: rows carry returns [1, 1, 1, 0, 0] -> mean 0.6 (verl-agent's mean across steps)
    # step groups: s0 {e1: G=0.25, f1: 0}, s1 {e2: 0.5, e3: 1.0} (a repeat within a trajectory), s2 {f2}
    expected = [0.4 + 0.125, 0.4 - 0.25, 0.4 + 0.25, -0.6 - 0.125, -0.6 + 0.0]
    assert [e.advantage for e in (e1, e2, e3, f1, f2)] == pytest.approx(expected)
    get_advantage("gigpo")([tree], gamma=0.5, step_weight=0.5, scale="none")
    assert e1.advantage == pytest.approx(0.4 + 0.5 * 0.125) and f2.advantage == pytest.approx(-0.6)


def test_gigpo_hand_computed_mean_std_norm():
    tree, (e1, e2, e3, f1, f2) = _gigpo_tree()
    eps = 1e-6
    get_advantage("gigpo")([tree], gamma=0.5, scale="group", eps=eps)
    std_e = math.sqrt(0.3)  # sample std of [1, 1, 1, 0, 0]
    s0 = 0.25 / math.sqrt(2)  # sample std of [0.25, 0]
    s1 = 0.5 / math.sqrt(2)  # of [0.5, 1.0]
    expected = [
        0.4 / (std_e + eps) + 0.125 / (s0 + eps),
        0.4 / (std_e + eps) - 0.25 / (s1 + eps),
        0.4 / (std_e + eps) + 0.25 / (s1 + eps),
        -0.6 / (std_e + eps) - 0.125 / (s0 + eps),
        -0.6 / (std_e + eps),
    ]
    assert [e.advantage for e in (e1, e2, e3, f1, f2)] == pytest.approx(expected)


def test_gigpo_rejects_inner_branches():
    root = _node("s0")
    root.branch_factor = 2
    a = _edge(root, 0.0, "s1")
    _edge(root, 0.0, "s2", done=True)
    a.child.branch_factor = 2
    _edge(a.child, 1.0, done=True)
    _edge(a.child, 0.0, done=True)
    with pytest.raises(ValueError, match="independent trajectories"):
        estimate_advantages("gigpo", _tree(root))


def test_tree_grpo_hand_computed():
    """Forest of task 0: tree A has leaves 1, 0 (below a shared step x) and 0.5 (a root
    expansion); tree B has leaves 0, 1 below a shared step z."""
    ra = _node("s0")
    x = _edge(ra, 0.0, "x")
    x1 = _edge(x.child, 1.0, done=True)
    x2 = _edge(x.child, 0.0, done=True)
    y = _edge(ra, 0.5, done=True)
    rb = _node("s0")
    z = _edge(rb, 0.0, "z")
    z1 = _edge(z.child, 0.0, done=True)
    z2 = _edge(z.child, 1.0, done=True)
    ta, tb = _tree(ra), _tree(rb)
    eps = 1e-6
    estimate_advantages("tree-grpo", [ta, tb], eps=eps)
    # inter: returns [1, 0, 0.5, 0, 1], mean 0.5, sample std 0.5; intra A: mean 0.5, std 0.5;
    # intra B: mean 0.5, std 1/sqrt(2)
    inter = np.array([0.5, -0.5, 0.0, -0.5, 0.5]) / (0.5 + eps)
    intra = np.array([0.5, -0.5, 0.0]) / (0.5 + eps)
    intra_b = np.array([-0.5, 0.5]) / (math.sqrt(0.5) + eps)
    leaf = {"x1": inter[0] + intra[0], "x2": inter[1] + intra[1], "y": inter[2] + intra[2]}
    leaf |= {"z1": inter[3] + intra_b[0], "z2": inter[4] + intra_b[1]}
    assert x1.advantage == pytest.approx(leaf["x1"]) and x2.advantage == pytest.approx(leaf["x2"])
    assert y.advantage == pytest.approx(leaf["y"]) and z2.advantage == pytest.approx(leaf["z2"])
    # a shared step is one sample per leaf below it: weight = leaves below / leaves of the tree
    assert x.weight == pytest.approx(2 / 3) and x.advantage == pytest.approx((leaf["x1"] + leaf["x2"]) / 2)
    assert (x1.weight, y.weight, z.weight, z1.weight) == pytest.approx((1 / 3, 1 / 3, 1.0, 0.5))
    assert z.advantage == pytest.approx((leaf["z1"] + leaf["z2"]) / 2)
    # explicit groups: each tree its own forest -> inter == intra within each
    estimate_advantages("tree-grpo", [ta, tb], groups=[[0], [1]], eps=eps)
    assert x1.advantage == pytest.approx(2 * intra[0])


def _anchor_tree():
    """root "r" (K0=2) -> a -> a1 -> a2 (done) and root -> b -> b1 (done); the nodes after a,
    a1 and b observe "s", so a1, a2 (a1's descendant) and b1 share a key."""
    root = _node("r")
    root.branch_factor = 2
    a = _edge(root, 0.0, "s")
    a1 = _edge(a.child, 0.0, "s")
    a2 = _edge(a1.child, 1.0, "t", done=True)
    b = _edge(root, 0.0, "s")
    b1 = _edge(b.child, 0.4, "t", done=True)
    return _tree(root), (a, a1, a2, b, b1)


def _by_obs(tree, node):
    return (tree.task_id, node.observation)


def test_anchored_sets_exclude_self_and_lineage():
    tree, (a, a1, a2, b, b1) = _anchor_tree()
    base = dict((id(e), v) for e, v in anchored_baselines(tree, _by_obs))
    # a1, a2 and b1 act at nodes observing "s"; a and b at the root "r"
    assert base[id(a1)] == pytest.approx(np.mean([b1.q]))
    assert base[id(a2)] == pytest.approx(b1.q)  # a1 is a2's ancestor: excluded
    assert base[id(b1)] == pytest.approx(np.mean([a1.q, a2.q]))
    assert base[id(a)] == pytest.approx(b.q) and base[id(b)] == pytest.approx(a.q)
    broken = dict((id(e), v) for e, v in anchored_baselines(tree, _by_obs, include_self=True, exclude_lineage=False))
    assert broken[id(a2)] == pytest.approx(np.mean([a1.q, a2.q, b1.q]))


def test_anchored_falls_back_and_stays_within_a_tree():
    tree, (a, a1, a2, b, b1) = _anchor_tree()
    root2 = _node("r")
    root2.branch_factor = 2
    c = _edge(root2, 0.0, "u")
    _edge(c.child, 5.0, "v", done=True)
    d = _edge(root2, 0.0, "w")
    _edge(d.child, 9.0, "v", done=True)
    other = _tree(root2)
    estimate_advantages("anchored", [tree, other], fallback="rloo", anchor_key=_by_obs)
    # c's child step acts at "u", d's at "w": no match in its tree (tree 1's "s" edges are not
    # considered) -> the RLOO advantage
    assert c.child.children[0].advantage == pytest.approx(5.0 - 9.0)
    assert a1.advantage == pytest.approx(a1.q - b1.q)


def test_min_matches_falls_back_on_small_pools():
    tree, (a, a1, a2, b, b1) = _anchor_tree()
    base = dict((id(e), v) for e, v in anchored_baselines(tree, _by_obs, min_matches=2))
    # b1's pool {a1, a2} has two edges; a1's and a2's ({b1}) and the root steps' have one
    assert base[id(b1)] == pytest.approx(np.mean([a1.q, a2.q]))
    assert base[id(a1)] is None and base[id(a2)] is None and base[id(a)] is None
    estimate_advantages("rloo", [tree])
    plain = {id(e): e.advantage for e in (a, a1, a2, b, b1)}
    estimate_advantages("anchored", [tree], fallback="rloo", anchor_key=_by_obs, min_matches=2)
    assert a1.advantage == pytest.approx(plain[id(a1)]) and a.advantage == pytest.approx(plain[id(a)])
    assert b1.advantage == pytest.approx(b1.q - np.mean([a1.q, a2.q]))
    with pytest.raises(ValueError, match="min_matches"):
        RLOO(baseline="anchored", min_matches=0)
    assert RLOO(baseline="anchored", min_matches=3).config()["min_matches"] == 3


def test_history_is_frozen_until_recorded():
    tree, (a, a1, a2, b, b1) = _anchor_tree()
    history = AnchorHistory(window=2, anchor_key=_by_obs)
    estimate_advantages("anchored", [tree], anchor_key=_by_obs, history=history)
    assert a2.advantage == pytest.approx(a2.q - b1.q)  # nothing recorded yet
    history.record([tree])
    # now the previous batch's five edges join: a2 (at "s") pools 3 "s"-edges of that batch
    estimate_advantages("anchored", [tree], anchor_key=_by_obs, history=history)
    assert a2.advantage == pytest.approx(a2.q - (b1.q + a1.q + a2.q + b1.q) / 4)
    history.record([tree])
    history.record([tree])
    assert len(history) == 2  # the window
    state = history.state_dict()
    again = AnchorHistory(window=2, anchor_key=_by_obs)
    again.load_state_dict(state)
    assert again.pooled((0, "s")) == history.pooled((0, "s")) == (2 * (a1.q + a2.q + b1.q), 6)


def _state_mdp():
    return gym.make("BPO-TreeMDP-v0", depth=4, n_actions=2, seed=3, decisive_levels=(2,), observe="state", n_tasks=2)


def _tree_shape(tree):
    return [(e.parent.depth, e.action.text, e.weight) for e in tree.edges()]


def test_a_tree_grpo_tree_does_not_depend_on_the_trees_built_before_it():
    # data-parallel ranks build different trees before tree i (seeded per tree): tree i must be
    # the same on every rank, so its expansions and pruning may not draw from a shared stream
    def tree_two(warm_up: bool):
        policy = TabularPolicy(seed=0)
        algorithm = TreeGRPO(m=1, n=2, l=2, k=3, seed=5)
        if warm_up:
            algorithm.collect(policy, [_state_mdp], [0], seed=1)
        policy.seed(7)
        return algorithm.collect(policy, [_state_mdp], [1], seed=2).trees[0]

    fresh, after_another = tree_two(False), tree_two(True)
    assert fresh.seed == after_another.seed is not None
    assert _tree_shape(fresh) == _tree_shape(after_another)


def test_tree_grpo_collects_m_trees_per_task_expanding_from_snapshots():
    policy = TabularPolicy(seed=0)
    algorithm = TreeGRPO(m=3, n=2, l=2, k=4, seed=0)
    batch = algorithm.collect(policy, [_state_mdp, _state_mdp], [0, 1])
    assert batch.n_trees == 6 and [t.task_id for t in batch.trees].count(0) == 3
    name, options = algorithm.estimator(batch.trees)  # the groups come from the batch, no state kept
    assert name == "tree-grpo" and sorted(len(g) for g in options["groups"]) == [3, 3]
    for tree in batch.trees:
        assert len(tree.leaf_edges()) == 4  # 1 + n*l = 5 grown, k = 4 kept
        assert sum(e.weight for e in tree.leaf_edges()) == pytest.approx(1.0)
    # every env step is an edge that was recorded (expansions restore, never replay): 5 leaves
    # of depth 4 per tree, less the pruned leaf's own steps
    assert batch.compute.env_steps == sum(tree.compute.env_steps for tree in batch.trees)
    assert batch.compute.snapshots > 0 and batch.compute.restores + batch.compute.resets >= 6 * 5
    loss = algorithm.loss(policy, batch)
    assert loss.requires_grad
    with pytest.raises(ValueError, match="1 \\+ n\\*l"):
        TreeGRPO(n=1, l=1, k=3)


def test_gigpo_collects_a_fan():
    policy = TabularPolicy(seed=0)
    batch = GiGPO(group_size=4, seed=0).collect(policy, [_state_mdp], [0])
    (tree,) = batch.trees
    assert len(tree.root.children) == 4 and all(len(n.children) <= 1 for n in tree.nodes() if n is not tree.root)
    assert any(e.advantage != 0 for e in tree.edges())


def test_the_main_job_passes_an_algorithms_options_to_its_variants():
    from bpo_experiments.presets import PRESETS
    from bpo_experiments.run_config import algorithm_spec

    preset = PRESETS["cpu-llm"]
    bpo = algorithm_spec("bpo-anchored", preset, 0).keywords()
    assert bpo["backbones"] == preset.options["bpo"].backbones == 2 and "baseline" not in bpo  # the variant's own
    assert algorithm_spec("rloo-anchored", preset, 0).keywords()["group_size"] == preset.options["rloo"].group_size == 4
    assert make_algorithm("rloo-anchored", **algorithm_spec("rloo-anchored", preset, 0).keywords()).options.baseline == "anchored"
    assert "group_size" not in algorithm_spec("gigpo", preset, 0).keywords()  # no GiGPO options in this preset: defaults
