"""The text scorer's ALFWorld episode-memory features come from what the agent observed only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from alfworld_support import private_cache

from bpo_algos.policy.base import Context
from bpo_algos.policy.episode_memory import MEMORY_FEATURES, context_features, episode_memory
from bpo_algos.policy.scorer import TextScorerPolicy

INTRO = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
    "you see a cabinet 2, a cabinet 1, a countertop 1, a fridge 1, and a microwave 1.\n\n"
    "Your task is to: put a hot apple in countertop."
)


def _walk(steps: list[tuple[str, str]]) -> Context:
    context = Context("t", INTRO, ("look",), (), INTRO)
    for action, result in steps:
        context = context.child(action, result, ("look",))
    return context


def test_memory_reads_alfworld_feedback() -> None:
    context = _walk([
        ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
        ("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see a apple 1, and a egg 1."),
        ("go to cabinet 1", "You arrive at cabinet 1. On the cabinet 1, you see nothing."),
        ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is open. In it, you see a apple 1, and a egg 1."),
        ("take apple 1 from fridge 1", "You pick up the apple 1 from the fridge 1."),
        ("go to microwave 1", "You arrive at microwave 1. The microwave 1 is closed."),
        ("heat apple 1 with microwave 1", "You heat the apple 1 using the microwave 1."),
        ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a knife 1."),
    ])
    m = episode_memory(context)
    assert m.receptacles == ("cabinet 2", "cabinet 1", "countertop 1", "fridge 1", "microwave 1")
    assert m.location == "countertop 1" and m.visits["fridge 1"] == 2 and m.opened == {"fridge 1"}
    assert m.contents["fridge 1"] == {"egg 1"} and m.contents["cabinet 1"] == frozenset()
    assert "cabinet 2" not in m.contents and m.closed == {"microwave 1"}  # never looked into
    assert m.held == "apple 1" and m.processed == {"apple 1": {"hot"}}
    actions = ("move apple 1 to countertop 1", "go to cabinet 2", "go to cabinet 1", "open microwave 1")
    f = [dict(zip(MEMORY_FEATURES, row, strict=True)) for row in context_features(context, actions)]
    assert f[0]["target_in_task"] and f[0]["object_in_task"] and f[0]["holding_processed"] and f[0]["target_is_here"]
    assert not f[1]["target_visited"] and f[2]["target_visited"] and f[2]["target_searched_empty"]
    assert f[3]["target_unseen_inside"] and not f[3]["target_opened"]


def test_memory_cost_per_decision_is_small() -> None:
    import time

    steps = [(f"go to cabinet {i % 2 + 1}", f"You arrive at cabinet {i % 2 + 1}. On the cabinet {i % 2 + 1}, you see a cup {i}.") for i in range(40)]
    contexts = []
    context = Context("t", INTRO, ("look",), (), INTRO)
    for action, result in steps:
        context = context.child(action, result, tuple(f"go to cabinet {j}" for j in range(1, 30)))
        contexts.append(context)
    start = time.process_time()
    for c in contexts:  # an episode's decisions, in order (each extends the last one's memory)
        context_features(c, c.admissible_actions)
    per_decision = (time.process_time() - start) / len(contexts)
    assert per_decision < 0.005  # generous: ~0.1 ms measured; guards against re-parsing whole histories


# ---- a planted object in a place the agent never observed ---------------------------------
pytest.importorskip("fast_downward", reason="run bpo-gym-setup alfworld")
pytest.importorskip("textworld", reason="run bpo-gym-setup alfworld")

from bpo_envs.alfworld import ALFWorldEnv  # noqa: E402

TASK = "pick_and_place_simple/0001"


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    with private_cache(tmp_path_factory, "alfworld-memory-cache"):
        yield


def _contexts(env: ALFWorldEnv, task_id: str, actions: list[str]) -> list[Context]:
    obs, info = env.reset(options={"task_id": task_id})
    context = Context(task_id, obs, tuple(info["admissible_actions"]), (), obs)
    out = [context]
    for action in actions:
        obs, _, terminated, truncated, info = env.step(action)
        context = context.child(action, obs, info["admissible_actions"])
        out.append(context)
        if terminated or truncated:
            break
    return out


def _plant(game: dict, obj_type: str, receptacle: str) -> dict:
    """``game`` with one more object of ``obj_type`` inside ``receptacle`` (a PDDL id), named
    so that it sorts after every other object of its type (no other object is renumbered)."""
    problem = game["pddl_problem"]
    location = re.search(rf"\(receptacleAtLocation {re.escape(receptacle)} (\S+)\)", problem).group(1)
    planted = f"{obj_type}_bar__plus_99_dot_99_bar__plus_99_dot_99_bar__plus_99_dot_99"
    problem = problem.replace("(:objects", f"(:objects\n    {planted} - object", 1)
    facts = (
        f"(objectType {planted} {obj_type}Type)\n    (pickupable {planted})\n    "
        f"(inReceptacle {planted} {receptacle})\n    (objectAtLocation {planted} {location})\n    "
    )
    problem = re.sub(r"\(:init\s*", lambda m: m.group(0) + facts, problem, count=1)
    return dict(game, pddl_problem=problem)


def test_an_object_planted_where_the_agent_never_looked_changes_no_feature(tmp_path: Path) -> None:
    env = ALFWorldEnv(games_per_type=2, expert="handcoded")
    try:
        game = env.games.game(TASK)
        traj = json.loads((env.games.game_path(TASK).parent / "traj_data.json").read_text())
        obj_type = traj["pddl_params"]["object_target"]
        # the expert's first steps, and a receptacle those steps never reach
        _, info = env.reset(options={"task_id": TASK})
        actions = []
        for _ in range(6):
            (action,) = env.expert_actions()
            actions.append(action)
            *_, info = env.step(action)
        visited = {a[len("go to ") :] for a in actions if a.startswith("go to ")}
        names = dict(env._engine.names)  # Fast Downward's (lower-cased) ids -> display names
        in_problem = {m.lower(): m for m in re.findall(r"\(receptacleAtLocation (\S+) ", game["pddl_problem"])}
        parent = traj["pddl_params"]["parent_target"].lower()  # (a task object there would win the game)
        unseen = sorted(
            in_problem[i] for i, name in names.items()
            if i in in_problem and name not in visited and not i.startswith(parent + "_bar_")
        )  # fmt: skip
        receptacle = unseen[0]
    finally:
        env.close()
    root = tmp_path / "json_2.1.1" / "train"
    for name, g in (("original", game), ("planted", _plant(game, obj_type, receptacle))):
        folder = root / f"pick_and_place_simple-{obj_type}-None-X-1" / name
        folder.mkdir(parents=True)
        (folder / "game.tw-pddl").write_text(json.dumps(g))
        (folder / "traj_data.json").write_text(json.dumps(traj))
    data = ALFWorldEnv(data_dir=tmp_path, split="train")
    try:
        task_dir = f"pick_and_place_simple-{obj_type}-None-X-1"
        original = _contexts(data, f"{task_dir}/original", actions)
        planted = _contexts(data, f"{task_dir}/planted", actions)
        # the planted object is really there: going to its receptacle shows it
        where = names[receptacle.lower()]  # (a closed receptacle shows its contents once opened)
        shown = _contexts(data, f"{task_dir}/planted", [f"go to {where}", f"open {where}"])
        assert re.search(rf"{obj_type.lower()} \d+", " ".join(c.observation.lower() for c in shown[1:]))
    finally:
        data.close()
    assert [c.observation for c in original] == [c.observation for c in planted]
    policy = TextScorerPolicy(memory="alfworld", seed=0)
    for a, b in zip(original, planted, strict=True):
        assert context_features(a, a.admissible_actions) == context_features(b, b.admissible_actions)
        with torch.no_grad():
            assert torch.equal(policy.scores([a])[0], policy.scores([b])[0])


def test_memory_option_is_checked() -> None:
    with pytest.raises(ValueError, match="memory must be one of"):
        TextScorerPolicy(memory="webshop")
    plain, remembering = TextScorerPolicy(seed=0), TextScorerPolicy(seed=0, memory="alfworld")
    assert remembering.hidden.in_features == plain.hidden.in_features + len(MEMORY_FEATURES)
