"""Tree pictures (``draw_tree``), saved trees (``save_trees``/``load_trees``) and ``bpo-trees``,
on trees the real engine builds on TreeMDP with a tabular policy."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET

import gymnasium as gym
import numpy as np
import pytest

import bpo_envs  # noqa: F401
from baselines import GRPO, RLOO
from bpo_algos import BPO, EnvPool, TabularPolicy, Trainer, TrainerConfig
from bpo_algos.tree import RolloutTree, load_trees, save_trees
from bpo_algos.viz import _layout, draw_run, draw_tree, main, shorten_action

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make():
    return gym.make("BPO-TreeMDP-v0", depth=5, n_actions=3, seed=1, n_tasks=4)


ALGORITHMS = {
    "grpo": lambda: GRPO(group_size=6, seed=1),
    "rloo": lambda: RLOO(group_size=4, seed=1),
    "bpo": lambda: BPO(backbones=2, branch_factor=4, max_branch_points=2, seed=1),
    "bpo-nested": lambda: BPO(backbones=2, branch_factor=3, max_branch_points=2, max_depth=2, seed=1),
}


def collect(name, tasks=(0, 1)):
    return ALGORITHMS[name]().collect(TabularPolicy(seed=3), [make, make], list(tasks)).trees


def svg_texts(path):
    root = ET.parse(path).getroot()
    return [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")] + [
        "".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}tspan")
    ]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_draw_tree_writes_a_png_and_an_svg_that_show_the_tree(tmp_path, name):
    import matplotlib.image

    tree = collect(name)[0]
    png = draw_tree(tree, tmp_path / "t.png")
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    assert matplotlib.image.imread(png).shape[0] > 300  # decodes as an image

    texts = svg_texts(draw_tree(tree, tmp_path / "t.svg"))
    joined = "\n".join(texts)
    leaves = tree.leaf_edges()
    assert f"task {tree.task_id}" in joined and name.split("-")[0] in joined
    assert f"{len(leaves)} leaves" in joined
    # one return label per leaf, with the episode's return
    returns = sorted(round(sum(e.reward for e in tree.path_to(leaf)), 2) for leaf in leaves)
    shown = sorted(float(t[2:]) for t in texts if t.startswith("R="))
    assert shown == pytest.approx(returns, abs=0.006)
    # every branch node's K (and the decision entropy where one was computed)
    branch_labels = [t for t in texts if t.startswith("K=")]
    assert len(branch_labels) == len(tree.branch_nodes())
    for node in tree.branch_nodes():
        if node.entropy is not None:
            assert f"K={len(node.children)} H={node.entropy:.2f}" in texts
    # every first action out of a branch node is labelled (TreeMDP actions are short)
    first_actions = {e.action.command for n in tree.branch_nodes() for e in n.children}
    assert first_actions <= set(texts)


def test_layout_puts_nodes_by_depth_and_one_row_per_leaf():
    for name in ALGORITHMS:
        tree = collect(name)[0]
        layout = _layout(tree)
        assert len(layout.terminals) == len(tree.leaf_edges())
        assert sorted(layout.y[id(n)] for n in layout.terminals) == list(range(len(layout.terminals)))
        by_depth = {}
        for node in tree.nodes():
            by_depth.setdefault(node.depth, set()).add(layout.x[id(node)])
        assert all(len(xs) == 1 for xs in by_depth.values())  # one x per depth
        xs = [by_depth[d].pop() for d in sorted(by_depth)]
        assert all(a < b for a, b in zip(xs, xs[1:], strict=False))  # x grows with depth


def test_long_chains_are_compressed_and_wide_fans_stay_readable(tmp_path):
    def deep():
        return gym.make("BPO-TreeMDP-v0", depth=40, n_actions=3, seed=1, n_tasks=2)

    tree = GRPO(group_size=24, seed=0).collect(TabularPolicy(seed=0), [deep], [0]).trees[0]
    layout = _layout(tree)
    assert layout.width < 8  # 40 steps in a few label widths, not 40
    texts = svg_texts(draw_tree(tree, tmp_path / "deep.svg"))
    assert sum(t.startswith("R=") for t in texts) == 24


def test_saved_trees_load_back_and_draw_the_same_picture(tmp_path, caplog):
    trees = collect("bpo-nested") + collect("grpo")
    path = save_trees(trees, tmp_path / "trees.json.gz")
    with caplog.at_level("WARNING"):
        loaded = load_trees(path)
    assert not caplog.records, "a file this version wrote loads without warnings"
    assert [t.to_dict() for t in loaded] == [t.to_dict() for t in trees]
    for before, after in zip(trees, loaded, strict=True):
        assert after.algorithm == before.algorithm and after.task_id == before.task_id
        assert after.seed == before.seed is not None
        assert after.compute == before.compute
        assert [e.action.command for e in after.edges()] == [e.action.command for e in before.edges()]
        assert [e.advantage for e in after.edges()] == [e.advantage for e in before.edges()]
        assert [n.entropy for n in after.nodes()] == [n.entropy for n in before.nodes()]
        assert after.success_rate() == before.success_rate()
        a = draw_tree(before, tmp_path / "before.svg").read_bytes()
        b = draw_tree(after, tmp_path / "after.svg").read_bytes()
        assert a == b
    # no token tensors in the file; plain JSON without gzip works too
    plain = save_trees(trees[:1], tmp_path / "one.json")
    record = json.loads(plain.read_text())["trees"][0]["nodes"][1]["edge"]
    assert "token_ids" not in record and "logprobs" not in record
    assert len(load_trees(plain)) == 1


def test_numpy_info_values_survive_the_round_trip():
    tree = collect("grpo")[0]
    leaf = tree.leaf_edges()[0]
    leaf.info = {**leaf.info, "won": np.bool_(True), "score": np.float32(0.5), "steps": np.int64(3), "big": list(range(9))}
    loaded = RolloutTree.from_dict(json.loads(json.dumps(tree.to_dict())))
    info = loaded.leaf_edges()[0].info
    assert info["won"] is True and info["score"] == 0.5 and info["steps"] == 3 and "big" not in info
    assert loaded.leaf_edges()[0].won


def test_observations_are_kept_only_when_asked(tmp_path):
    tree = collect("rloo")[0]
    kept = RolloutTree.from_dict(tree.to_dict(observations=True))
    assert [n.observation for n in kept.nodes()] == [n.observation for n in tree.nodes()]
    assert all(n.observation == "" for n in RolloutTree.from_dict(tree.to_dict()).nodes())


def test_a_tree_that_lost_lines_to_env_failures_draws(tmp_path):
    class Crashy(gym.Wrapper):
        rng = np.random.default_rng(0)

        def step(self, action):
            if self.rng.random() < 0.12:
                raise RuntimeError("sandbox died")
            return self.env.step(action)

    pool = EnvPool([lambda: Crashy(make())] * 2, retries=0, max_failures=1000)
    batch = BPO(backbones=3, branch_factor=3, max_branch_points=2, seed=2).collect(TabularPolicy(seed=1), pool, [0] * 6)
    damaged = [t for t in batch.trees if t.compute.dropped_steps]
    assert damaged, "seeded: some line is dropped"
    for tree in damaged:
        texts = "\n".join(svg_texts(draw_tree(tree, tmp_path / "d.svg")))
        assert f"{tree.compute.dropped_steps} steps dropped" in texts
        assert texts.count("R=") == len(tree.leaf_edges())


def test_bad_input_errors_name_the_problem(tmp_path):
    tree = collect("grpo")[0]
    with pytest.raises(ValueError, match=r"\.jpg"):
        draw_tree(tree, tmp_path / "t.jpg")
    with pytest.raises(ValueError, match="suffix ''"):
        draw_tree(tree, tmp_path / "t")
    with pytest.raises(TypeError, match="RolloutTree"):
        draw_tree({"nodes": []}, tmp_path / "t.png")
    (tmp_path / "x.json").write_text('{"trees": []}')
    with pytest.raises(ValueError, match="not a saved-trees file"):
        load_trees(tmp_path / "x.json")
    with pytest.raises(ValueError, match="parents come first"):
        RolloutTree.from_dict({"task_id": 0, "nodes": [{"parent": None}, {"parent": 5, "edge": {}}]})


def test_shorten_action():
    assert shorten_action("click[b0123456]") == "click[b0123456]"
    assert shorten_action("search[a very long query about jeans]", 20) == "search[a very long…]"
    assert len(shorten_action("search[a very long query about jeans]", 20)) == 20
    assert shorten_action("search[a very long query]", 9) == "search…"
    assert shorten_action("go to\n  cabinet 1", 30) == "go to cabinet 1"
    assert shorten_action("anything long", 3) == ""


def test_trainer_saves_trees_and_bpo_trees_draws_them(tmp_path, capsys):
    config = TrainerConfig(updates=3, tasks_per_update=2, out_dir=tmp_path / "run", save_trees_every=2)
    Trainer(BPO(backbones=2, branch_factor=3), TabularPolicy(), [make], [0, 1, 2], config).train()
    saved = sorted(p.name for p in (tmp_path / "run" / "trees").iterdir())
    assert saved == ["update00002.json.gz", "update00003.json.gz"]  # every 2nd and the last
    trees = load_trees(tmp_path / "run" / "trees" / "update00003.json.gz")
    assert len(trees) >= 2 and all(t.algorithm == "bpo" for t in trees)

    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "pics"), "--format", "svg", "--max", "1"]) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 1 and printed[0].endswith(".svg") and "update00003-tree00" in printed[0]
    assert "K=" in "\n".join(svg_texts(printed[0]))
    every = draw_run(tmp_path / "run", all_updates=True)
    both = sum(len(load_trees(p)) for p in (tmp_path / "run" / "trees").glob("*.json.gz"))
    assert len(every) == both
    assert all(p.parent == tmp_path / "run" / "trees" and p.suffix == ".png" for p in every)

    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path / "empty-or-missing")])
    assert stop.value.code == 2
    assert "no run directory" in capsys.readouterr().err
    with pytest.raises(ValueError, match="save_trees_every"):
        TrainerConfig(save_trees_every=-1)


def test_python_m_bpo_algos_viz_answers_help():
    import subprocess

    done = subprocess.run([sys.executable, "-m", "bpo_algos.viz", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: bpo-trees" in done.stdout


def _stroke_colours(path):
    """The stroke colours of an SVG picture's line pieces."""
    import re

    return set(re.findall(r"stroke: ?(#[0-9a-f]{6})", path.read_text()))


def test_the_colour_scale_is_centred_on_0_with_a_floor_so_zero_advantages_draw_neutral(tmp_path):
    from bpo_algos.viz import ADVANTAGE_FLOOR, advantage_scale

    assert advantage_scale([1e-16, -3e-17]) == ADVANTAGE_FLOOR and advantage_scale([]) == ADVANTAGE_FLOOR
    assert advantage_scale([0.5, -2.0]) == 2.0
    tree = collect("bpo")[0]
    edges = tree.edges()
    for sign, edge in zip([1, -1] * len(edges), edges, strict=False):
        edge.advantage = sign * 1e-16  # returns that cancel to 0 in floating point
    draw_tree(tree, tmp_path / "zero.svg")
    zero = _stroke_colours(tmp_path / "zero.svg")
    assert "#c3c4c4" in zero and not {"#b2182b", "#2166ac"} & zero  # the neutral middle, not saturated red or blue
    # the broken case the floor prevents: real advantages of both signs do saturate the ends
    for sign, edge in zip([1, -1] * len(edges), edges, strict=False):
        edge.advantage = sign * 0.5
    draw_tree(tree, tmp_path / "signed.svg")
    assert {"#b2182b", "#2166ac"} <= _stroke_colours(tmp_path / "signed.svg")
