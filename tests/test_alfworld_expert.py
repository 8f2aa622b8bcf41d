"""BPO-ALFWorld-v0's experts (``expert="planner" | "handcoded"``) and the on-disk translation cache."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from alfworld_support import engine_every_step, private_cache  # noqa: F401 - a fixture

pytest.importorskip("fast_downward", reason="run bpo-gym-setup alfworld")
pytest.importorskip("textworld", reason="run bpo-gym-setup alfworld")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

import bpo_envs  # noqa: E402
from bpo_envs import sealed as sealed_module  # noqa: E402
from bpo_envs.alfworld import (  # noqa: E402
    TASK_TYPES,
    ALFWorldEnv,
    _upstream,  # noqa: E402
)
from bpo_envs.alfworld.expert import EXPERTS  # noqa: E402

GAME = {t: f"{t}/0001" for t in TASK_TYPES}
NAME = re.compile(r"\b([a-z]+ \d+)\b")


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    with private_cache(tmp_path_factory, "alfworld-expert-cache"):
        yield


@pytest.fixture(scope="module")
def env() -> gym.Env:
    # a longer limit than the default 50: the expert searches every receptacle in a fixed
    # order, and a few games hide the object in the last ones it searches
    # (gym.make would consume max_episode_steps for a TimeLimit over the env's own limit of 50)
    e = ALFWorldEnv(games_per_type=2, expert="handcoded", max_episode_steps=120)
    yield e
    e.close()


def play_expert(env: gym.Env, task_id: str, max_steps: int = 120) -> tuple[list[str], list[str], dict[str, Any]]:
    """The handcoded expert's episode: its actions, the observations, the last info."""
    obs, info = env.reset(options={"task_id": task_id})
    actions, observations = [], [obs]
    for _ in range(max_steps):
        plan = env.unwrapped.expert_actions()
        if not plan:
            break
        assert len(plan) == 1 and plan[0] in info["admissible_actions"]
        obs, _, terminated, truncated, info = env.step(plan[0])
        actions.append(plan[0])
        observations.append(obs)
        if terminated or truncated:
            break
    return actions, observations, info


def test_expert_choice_is_checked() -> None:
    assert EXPERTS == ("planner", "handcoded")
    with pytest.raises(ValueError, match=r"expert must be one of \('planner', 'handcoded'\), got 'x'"):
        gym.make("BPO-ALFWorld-v0", expert="x")
    assert ALFWorldEnv(games_per_type=1).expert == "planner"  # the default


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_handcoded_expert_searches_and_wins(env: gym.Env, task_type: str) -> None:
    actions, observations, info = play_expert(env, GAME[task_type])
    assert info["won"], (task_type, actions, env.unwrapped.expert_failure)
    assert actions[0] == "look"  # as alfworld's AlfredExpert: nothing is known before looking
    assert env.unwrapped.expert_actions() == []  # nothing left to do once won
    # it acts only on what the agent has observed: every object it names appeared earlier
    seen: set[str] = set()
    for action, before in zip(actions, observations, strict=False):
        seen.update(NAME.findall(before))
        assert set(NAME.findall(action)) <= seen, (action, seen)


def test_handcoded_expert_is_deterministic_and_follows_the_history(env: gym.Env) -> None:
    task = GAME["pick_cool_then_place_in_recep"]
    first, _, _ = play_expert(env, task)
    again, _, _ = play_expert(env, task)
    assert first == again
    # after actions that are not the expert's (DAgger's setting), it still has an admissible answer
    _, info = env.reset(options={"task_id": task})
    for _ in range(4):
        env.step(info["admissible_actions"][-1])
        _, _, _, _, info = env.step("not a command")
        (answer,) = env.unwrapped.expert_actions()
        assert answer in info["admissible_actions"]


def test_planner_expert_is_unchanged(env: gym.Env) -> None:
    planner = ALFWorldEnv(games_per_type=2, expert="planner")
    try:
        planner.reset(options={"task_id": GAME["pick_and_place_simple"]})
        plan = planner.expert_actions()
        assert len(plan) > 1
        for command in plan:
            *_, info = planner.step(command)
        assert info["won"]
    finally:
        planner.close()


class ExpertInInfo(gym.Wrapper):
    """Puts the expert's answer into every ``info``, so ``check_snapshot`` compares it too."""

    def reset(self, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "expert": self.env.unwrapped.expert_actions()}

    def step(self, action: str) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "expert": self.env.unwrapped.expert_actions()}


@pytest.mark.parametrize("task_type", ["pick_two_obj_and_place", "pick_heat_then_place_in_recep"])
def test_check_snapshot_with_expert_calls_between_steps(env: gym.Env, task_type: str) -> None:
    wrapped = ExpertInInfo(env)

    def choose(obs: str, info: dict[str, Any], rng: np.random.Generator) -> str:
        if info.get("expert") and rng.random() < 0.6:
            return info["expert"][0]
        if rng.random() < 0.1:
            return "this is not an action"
        return str(rng.choice(info["admissible_actions"]))

    report = bpo_envs.check_snapshot(
        wrapped, seed=3, steps=14, options={"task_id": GAME[task_type]}, choose_action=choose, fresh_env=False
    )
    assert report.portable_checked and report.compared_transitions > 50


def test_expert_state_travels_in_portable_snapshots_to_a_fresh_env(env: gym.Env) -> None:
    task = GAME["pick_two_obj_and_place"]
    actions, _, _ = play_expert(env, task)
    env.reset(options={"task_id": task})
    for action in actions[:6]:
        env.step(action)
    blob = bpo_envs.snapshot(env).portable()  # the expert was asked at every step
    env.reset(options={"task_id": task})
    for action in actions[:6]:
        env.step(action)  # the same history without asking the expert: rebuilt from it
    unasked = bpo_envs.snapshot(env).portable()
    for snap in (blob, unasked):
        other = ALFWorldEnv(games_per_type=2, expert="handcoded", max_episode_steps=120)
        try:
            bpo_envs.restore(other, snap)
            rest = []
            while plan := other.unwrapped.expert_actions():
                rest.append(plan[0])
                *_, terminated, truncated, info = other.step(plan[0])
                if terminated or truncated:
                    break
            assert rest == actions[6:] and info["won"]
        finally:
            other.close()


def test_snapshot_kinds_differ_by_expert(env: gym.Env) -> None:
    env.reset(options={"task_id": GAME["pick_and_place_simple"]})
    snap = bpo_envs.snapshot(env)
    planner = ALFWorldEnv(games_per_type=2, expert="planner")
    try:
        with pytest.raises(bpo_envs.core.SnapshotKindError):
            planner.restore(snap)
    finally:
        planner.close()


# ---- upstream-layout game folders -----------------------------------------------------------
UPSTREAM_DIR = {
    "pick_heat_then_place_in_recep": "pick_heat_then_place_in_recep-{obj}-None-{parent}-1",
    "look_at_obj_in_light": "look_at_obj_in_light-{obj}-None-{toggle}-1",
}


def _upstream_copy(env: gym.Env, task_id: str, root: Path, trial: str = "trial_T20190906_000000_000001") -> str:
    """The generated game ``task_id`` in alfworld's own layout under ``root`` (as
    ``alfworld-download`` leaves it), returning its task id there."""
    src = env.unwrapped.games.game_path(task_id).parent
    traj = json.loads((src / "traj_data.json").read_text())
    params = traj["pddl_params"]
    folder = UPSTREAM_DIR[traj["task_type"]].format(
        obj=params["object_target"], parent=params["parent_target"], toggle=params["toggle_target"]
    )
    out = root / "json_2.1.1" / "valid_seen" / folder / trial
    out.mkdir(parents=True)
    shutil.copy(src / "game.tw-pddl", out / "game.tw-pddl")
    shutil.copy(src / "traj_data.json", out / "traj_data.json")
    return f"{folder}/{trial}"


def test_handcoded_expert_on_upstream_layout_folders(env: gym.Env, tmp_path: Path) -> None:
    ids = {t: _upstream_copy(env, GAME[t], tmp_path) for t in UPSTREAM_DIR}
    user = ALFWorldEnv(data_dir=tmp_path, split="valid_seen", expert="handcoded", max_episode_steps=120)
    try:
        assert sorted(user.unwrapped.task_ids()) == sorted(ids.values())
        for task_type, task_id in ids.items():
            theirs, _, info = play_expert(user, task_id)
            ours, _, _ = play_expert(env, GAME[task_type])
            assert info["won"] and theirs == ours
        bpo_envs.check_snapshot(ExpertInInfo(user), seed=0, steps=8, fresh_env=False)
    finally:
        user.close()


def test_handcoded_expert_without_task_params_says_why(env: gym.Env, tmp_path: Path, caplog) -> None:
    from bpo_algos.policy.sft import expert_demos

    task_id = _upstream_copy(env, GAME["look_at_obj_in_light"], tmp_path)
    folder = tmp_path / "json_2.1.1" / "valid_seen" / task_id
    game = json.loads((folder / "game.tw-pddl").read_text())
    assert "UNKNOWN GOAL" not in game["grammar"]  # the goal is in the game: it plays without traj_data
    (folder / "traj_data.json").unlink()
    user = ALFWorldEnv(data_dir=tmp_path, split="valid_seen", expert="handcoded")
    try:
        user.reset(options={"task_id": task_id})
        with caplog.at_level(logging.INFO, logger="bpo_envs.alfworld.expert"):
            assert user.expert_actions() == []
        assert "cannot start" in user.expert_failure and "traj_data.json" in user.expert_failure
        assert any("cannot start" in r.getMessage() for r in caplog.records)
    finally:
        user.close()
    # behaviour cloning over such a game gets no demos from it, and no exception
    make = lambda: gym.make("BPO-ALFWorld-v0", data_dir=str(tmp_path), split="valid_seen", expert="handcoded")  # noqa: E731
    assert expert_demos(make, [task_id]) == []


# ---- the translation kept beside the game ----------------------------------------------------
def _transitions(env: ALFWorldEnv, task_id: str, steps: int = 6) -> list[Any]:
    obs, info = env.reset(options={"task_id": task_id})
    out = [(obs, info["admissible_actions"])]
    for i in range(steps):
        result = env.step(info["admissible_actions"][i % len(info["admissible_actions"])])
        info = result[4]
        out.append((result[0], info["admissible_actions"], result[1], result[2]))
    return out


@pytest.mark.usefixtures("engine_every_step")  # "a new process": nothing answered from memory
def test_first_reset_reads_the_translation_from_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    env = ALFWorldEnv(games_per_type=2)
    task = GAME["pick_clean_then_place_in_recep"]
    try:
        path = _upstream.translation_path(env.games.game(task))
        assert path.parent == _upstream.cache_root() / "translations"  # never beside the game
        path.unlink(missing_ok=True)
        _upstream.clear_translation_cache()
        cold = _transitions(env, task)
        assert path.is_file()  # written on the game's first load

        # a new process: nothing in memory; the translation and grammar parse come from disk
        _upstream.clear_translation_cache()
        fd = _upstream.upstream()["fast_downward"]

        def no_translation(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("translated again although a translation was on disk")

        other = ALFWorldEnv(games_per_type=2)
        monkeypatch.setattr(fd, "pddl2sas", no_translation)
        assert _transitions(other, task) == cold
        monkeypatch.undo()
        other.close()

        # a damaged, stale or unsealed file is ignored and rewritten
        sealed = path.read_bytes()
        unsealed = sealed[len(sealed_module.MAGIC) + 32 :]
        for content in (b"not a pickle", sealed.replace(b"bpo-alfworld-translation/1", b"bpo-alfworld-translation/0"), unsealed):
            path.write_bytes(content)
            _upstream.clear_translation_cache()
            assert not _upstream.load_translation(env.games.game_path(task), env.games.game(task))
            fresh = ALFWorldEnv(games_per_type=2)
            assert _transitions(fresh, task) == cold
            fresh.close()
            _upstream.clear_translation_cache()
            assert _upstream.load_translation(env.games.game_path(task), env.games.game(task))
    finally:
        env.close()
