"""BPO-ALFWorld-v0 on the real ALFWorld text engine (textworld PDDL + Fast Downward)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from alfworld_support import engine_every_step, private_cache  # noqa: F401 - a fixture

pytest.importorskip("fast_downward", reason="run bpo-gym-setup alfworld")
pytest.importorskip("textworld", reason="run bpo-gym-setup alfworld")

import gymnasium as gym  # noqa: E402
from gymnasium.utils.env_checker import check_env  # noqa: E402

import bpo_envs  # noqa: E402
from bpo_envs.alfworld import TASK_TYPES, ALFWorldEnv  # noqa: E402
from bpo_envs.alfworld._upstream import domain_text, grammar_text  # noqa: E402

# one game per type that the generator makes quickly (the cache is per test session)
GAME = {t: f"{t}/0001" for t in TASK_TYPES}


@pytest.fixture(scope="session", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    with private_cache(tmp_path_factory, "alfworld-cache"):
        yield


@pytest.fixture(scope="module")
def env() -> gym.Env:
    e = gym.make("BPO-ALFWorld-v0", games_per_type=3)
    yield e
    e.close()


def test_check_env(env: gym.Env) -> None:
    check_env(env.unwrapped, skip_render_check=True)


def test_reset_observation_and_info(env: gym.Env) -> None:
    obs, info = env.reset(options={"task_id": GAME["pick_heat_then_place_in_recep"]})
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert "Your task is to: " in obs and ("hot" in obs or "heat" in obs)
    assert info["won"] is False and info["task_type"] == "pick_heat_then_place_in_recep"
    assert info["admissible_actions"] == sorted(info["admissible_actions"])
    assert "look" in info["admissible_actions"] and any(a.startswith("go to ") for a in info["admissible_actions"])
    assert env.unwrapped.max_episode_steps == 50


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_planner_expert_wins(env: gym.Env, task_type: str) -> None:
    _, info = env.reset(options={"task_id": GAME[task_type]})
    assert not info["won"], "a generated game must not start solved"
    plan = env.unwrapped.expert_actions()
    assert plan
    for i, action in enumerate(plan):
        assert action in info["admissible_actions"]
        obs, reward, terminated, truncated, info = env.step(action)
        assert "invalid_action" not in info
        assert terminated == (i == len(plan) - 1) and reward == float(terminated)
    assert info["won"] and reward == 1.0 and not truncated


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_check_snapshot_every_task_type(env: gym.Env, task_type: str) -> None:
    report = bpo_envs.check_snapshot(env, seed=3, steps=8, options={"task_id": GAME[task_type]})
    assert report.portable_checked and report.fresh_env_checked
    assert report.compared_transitions > 8


@pytest.mark.usefixtures("engine_every_step")  # it reads the engine's epochs
def test_snapshot_detour_restore_win(env: gym.Env) -> None:
    env.reset(options={"task_id": GAME["pick_cool_then_place_in_recep"]})
    plan = env.unwrapped.expert_actions()
    for action in plan[:2]:
        env.step(action)
    engine = env.unwrapped._engine
    epoch = engine.epoch
    snap = bpo_envs.snapshot(env)
    _, info = env.reset(options={"task_id": GAME["pick_cool_then_place_in_recep"]})
    detour = [a for a in info["admissible_actions"] if a.startswith("go to ")][:3]
    bpo_envs.restore(env, snap)  # after a reset: re-rooted
    for action in detour:
        env.step(action)
    inner = bpo_envs.snapshot(env)
    env.step(detour[0])
    rooted_epoch = engine.epoch
    bpo_envs.restore(env, inner)  # same reset: native, no reload
    assert engine.epoch == rooted_epoch != epoch
    bpo_envs.restore(env, snap)
    assert env.unwrapped.expert_actions() == plan[2:]
    for action in plan[2:]:
        obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and info["won"] and reward == 1.0
    snap.release()
    inner.release()


@pytest.mark.parametrize(
    "action",
    ["", "GO TO nowhere", "x" * 20000, "\x00\x01\xff binary", "héllo ☃ 🤖", "go to fridge 1; rm -rf / && $(echo hi) `id` | cat"],
)
def test_invalid_actions_are_observations(env: gym.Env, action: str) -> None:
    _, info = env.reset(options={"task_id": GAME["pick_and_place_simple"]})
    obs, reward, terminated, truncated, after = env.step(action)
    assert obs == "Nothing happens."
    assert after["invalid_action"] is True and reward == 0.0 and not terminated
    assert after["admissible_actions"] == info["admissible_actions"]
    assert env.unwrapped.observation_space.contains(obs)


def test_commands_are_matched_case_and_space_insensitively(env: gym.Env) -> None:
    _, info = env.reset(options={"task_id": GAME["pick_and_place_simple"]})
    target = next(a for a in info["admissible_actions"] if a.startswith("go to "))
    obs, _, _, _, after = env.step("  " + target.upper().replace(" ", "   ") + "\n")
    assert "invalid_action" not in after and obs.startswith("You arrive at")


def test_step_limit_truncates(env: gym.Env) -> None:
    e = ALFWorldEnv(games_per_type=3, max_episode_steps=3)
    e.reset(options={"task_id": GAME["pick_and_place_simple"]})
    flags = [e.step("look")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    e.close()


def test_sys_argv_unchanged_after_reset() -> None:
    from bpo_envs.alfworld._upstream import clear_translation_cache

    argv = list(sys.argv)
    clear_translation_cache()
    e = ALFWorldEnv(games_per_type=3, task_types=["look_at_obj_in_light"])
    e.reset(options={"task_id": GAME["look_at_obj_in_light"]})
    assert sys.argv == argv
    e.close()


# ---- the user's ALFWorld data ---------------------------------------------------------------
PROBLEM = """
(define (problem plan_trial_test)
(:domain alfred)
(:objects
    agent1 - agent
    AppleType - otype
    MugType - otype
    CounterTopType - rtype
    FridgeType - rtype
    Apple_bar__minus_01_dot_65_bar__plus_00_dot_81_bar__plus_00_dot_07 - object
    Mug_bar__plus_00_dot_20_bar__plus_00_dot_91_bar__minus_01_dot_10 - object
    CounterTop_bar__minus_01_dot_87_bar__plus_00_dot_95_bar__minus_01_dot_21 - receptacle
    Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_07 - receptacle
    loc_bar__minus_7_bar__minus_5_bar_3_bar_45 - location
    loc_bar__minus_4_bar_4_bar_3_bar_15 - location
    loc_bar_0_bar_0_bar_1_bar_30 - location
    )
(:init
    (= (total-cost) 0)
    (receptacleType CounterTop_bar__minus_01_dot_87_bar__plus_00_dot_95_bar__minus_01_dot_21 CounterTopType)
    (receptacleType Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_07 FridgeType)
    (objectType Apple_bar__minus_01_dot_65_bar__plus_00_dot_81_bar__plus_00_dot_07 AppleType)
    (objectType Mug_bar__plus_00_dot_20_bar__plus_00_dot_91_bar__minus_01_dot_10 MugType)
    (canContain CounterTopType AppleType)
    (canContain CounterTopType MugType)
    (canContain FridgeType AppleType)
    (canContain FridgeType MugType)
    (pickupable Apple_bar__minus_01_dot_65_bar__plus_00_dot_81_bar__plus_00_dot_07)
    (pickupable Mug_bar__plus_00_dot_20_bar__plus_00_dot_91_bar__minus_01_dot_10)
    (openable Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_07)
    (atLocation agent1 loc_bar_0_bar_0_bar_1_bar_30)
    (inReceptacle Apple_bar__minus_01_dot_65_bar__plus_00_dot_81_bar__plus_00_dot_07 Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_07)
    (inReceptacle Mug_bar__plus_00_dot_20_bar__plus_00_dot_91_bar__minus_01_dot_10 CounterTop_bar__minus_01_dot_87_bar__plus_00_dot_95_bar__minus_01_dot_21)
    (receptacleAtLocation CounterTop_bar__minus_01_dot_87_bar__plus_00_dot_95_bar__minus_01_dot_21 loc_bar__minus_7_bar__minus_5_bar_3_bar_45)
    (receptacleAtLocation Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_07 loc_bar__minus_4_bar_4_bar_3_bar_15)
    (objectAtLocation Apple_bar__minus_01_dot_65_bar__plus_00_dot_81_bar__plus_00_dot_07 loc_bar__minus_4_bar_4_bar_3_bar_15)
    (objectAtLocation Mug_bar__plus_00_dot_20_bar__plus_00_dot_91_bar__minus_01_dot_10 loc_bar__minus_7_bar__minus_5_bar_3_bar_45)
    )
(:goal (and (exists (?r - receptacle) (exists (?o - object) (and (inReceptacle ?o ?r) (objectType ?o AppleType) (receptacleType ?r CounterTopType))))))
)
"""
TASK_DIR = "pick_and_place_simple-Apple-None-CounterTop-1"
TRIAL = "trial_T20190906_000000_000001"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("alfworld-data")
    trial = root / "json_2.1.1" / "valid_seen" / TASK_DIR / TRIAL
    trial.mkdir(parents=True)
    game = {
        "pddl_domain": domain_text(),
        "grammar": grammar_text(),  # "UNKNOWN GOAL": filled from traj_data like alfworld does
        "pddl_problem": textwrap.dedent(PROBLEM),
        "solvable": True,
        "walkthrough": None,
    }
    (trial / "game.tw-pddl").write_text(json.dumps(game))
    traj = {
        "task_type": "pick_and_place_simple",
        "pddl_params": {"object_target": "Apple", "parent_target": "CounterTop", "toggle_target": "",
                        "mrecep_target": "", "object_sliced": False},
    }
    (trial / "traj_data.json").write_text(json.dumps(traj))
    return root


def test_user_data_layout_plays_to_a_win(data_dir: Path) -> None:
    env = gym.make("BPO-ALFWorld-v0", data_dir=str(data_dir), split="valid_seen")
    assert env.unwrapped.task_ids() == [f"{TASK_DIR}/{TRIAL}"]
    obs, info = env.reset(seed=0)
    assert "a countertop 1, and a fridge 1" in obs
    assert obs.rstrip().endswith(("put a apple in countertop.", "put some apple on countertop."))
    commands = ["go to fridge 1", "open fridge 1", "take apple 1 from fridge 1", "go to countertop 1",
                "move apple 1 to countertop 1"]
    feedback = []
    for command in commands:
        assert command in info["admissible_actions"], (command, info["admissible_actions"])
        obs, reward, terminated, truncated, info = env.step(command)
        feedback.append(obs)
    assert feedback[1] == "You open the fridge 1. The fridge 1 is open. In it, you see a apple 1."
    assert feedback[-1] == "You move the apple 1 to the countertop 1."
    assert terminated and info["won"] and reward == 1.0
    bpo_envs.check_snapshot(env, seed=1, steps=10)
    env.close()


def test_alfworld_data_env_var(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALFWORLD_DATA", str(data_dir))
    env = ALFWorldEnv(split="valid_seen")
    assert env.task_ids() == [f"{TASK_DIR}/{TRIAL}"]
    env.close()


def test_missing_and_malformed_games_name_the_path(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "json_2.1.1" / "train")):
        ALFWorldEnv(data_dir=tmp_path / "json_2.1.1", split="train")
    bad = tmp_path / "json_2.1.1" / "train" / "pick_and_place_simple-Mug-None-Desk-301" / "trial_x"
    bad.mkdir(parents=True)
    (bad / "game.tw-pddl").write_text("{not json")
    # the listing reads every game (for its solvable mark), so a bad one is named at once
    with pytest.raises(ValueError, match=r"malformed ALFWorld game file .*trial_x/game\.tw-pddl"):
        ALFWorldEnv(data_dir=tmp_path, split="train")
    (bad / "game.tw-pddl").write_text(json.dumps({"pddl_domain": "x"}))
    with pytest.raises(ValueError, match=r"trial_x/game\.tw-pddl: missing or non-text \['grammar', 'pddl_problem'\]"):
        ALFWorldEnv(data_dir=tmp_path / "json_2.1.1", split="train")
    good = json.loads((data_dir / "json_2.1.1" / "valid_seen" / TASK_DIR / TRIAL / "game.tw-pddl").read_text())
    (bad / "game.tw-pddl").write_text(json.dumps(good))
    env = ALFWorldEnv(data_dir=tmp_path / "json_2.1.1" / "..", split="train")
    (bad / "game.tw-pddl").unlink()  # gone after listing: named at reset
    with pytest.raises(FileNotFoundError, match=r"trial_x/game\.tw-pddl"):
        env.reset(seed=0)
    with pytest.raises(ValueError, match="split must be one of"):
        ALFWorldEnv(data_dir=data_dir, split="test")
    with pytest.raises(ValueError, match="task_types"):
        ALFWorldEnv(task_types=["pick_and_eat"])


# ---- across processes ------------------------------------------------------------------------
CHILD = """
import pickle, sys
import gymnasium as gym, bpo_envs
blob, task_id, expected = pickle.load(sys.stdin.buffer)
env = gym.make("BPO-ALFWorld-v0", games_per_type=3)
obs, _ = env.reset(options={"task_id": task_id})
bpo_envs.restore(env, blob)
plan = env.unwrapped.expert_actions()
out = [env.step(a)[:4] for a in plan]
pickle.dump((env.unwrapped.task_ids()[:4], obs, plan, out), sys.stdout.buffer)
"""


def test_task_ids_games_and_portable_snapshots_across_processes(env: gym.Env) -> None:
    task_id = GAME["pick_two_obj_and_place"]
    intro, _ = env.reset(options={"task_id": task_id})
    plan = env.unwrapped.expert_actions()
    env.step(plan[0])
    env.step("examine nothing")
    env.step(plan[1])
    blob = bpo_envs.snapshot(env).portable()
    rest = env.unwrapped.expert_actions()
    expected = [env.step(a)[:4] for a in rest]
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=pickle.dumps((blob, task_id, expected)),
        capture_output=True,
        env=dict(os.environ),
        check=True,
        timeout=300,
    )
    ids, child_intro, child_plan, child_out = pickle.loads(result.stdout)
    assert ids == env.unwrapped.task_ids()[:4]
    assert child_intro == intro
    assert child_plan == rest and child_out == expected
    assert expected[-1][2] is True


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    pytest.skip("no VmRSS in /proc/self/status")


# RSS may wobble with the allocator by a few MiB; the leak this guards against (a NativeState
# or translation kept per expansion) grew ~0.1 MiB per expansion, i.e. >10 MiB over the half.
RSS_GROWTH_BOUND_MIB = 6.0


def test_rss_flat_over_many_cheap_expansions(env: gym.Env) -> None:
    """reset / step / snapshot / restore x3 / release on one game: RSS stops growing."""
    import random

    rng = random.Random(0)
    task = GAME["pick_and_place_simple"]

    def expansion() -> None:
        _, info = env.reset(options={"task_id": task})
        info = env.step(rng.choice(info["admissible_actions"]))[-1]
        snap = bpo_envs.snapshot(env)
        for _ in range(3):
            bpo_envs.restore(env, snap)
            env.step(rng.choice(info["admissible_actions"]))
        snap.release()

    n = 120
    samples = []
    for _ in range(2 * n):
        expansion()
        samples.append(_rss_mib())
    growth = samples[-1] - samples[n]
    assert growth < RSS_GROWTH_BOUND_MIB, f"RSS grew {growth:.1f} MiB over the last {n} expansions"


def test_translation_cache_is_bounded_in_bytes(env: gym.Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cross-env restores re-root (one new translation pair each); the cache stays in budget."""
    from bpo_envs.alfworld import _upstream

    budget = 2 * 2**20
    monkeypatch.setattr(_upstream, "TRANSLATION_CACHE_BYTES", budget)
    other = gym.make("BPO-ALFWorld-v0", games_per_type=3)
    try:
        _, info = env.reset(options={"task_id": GAME["look_at_obj_in_light"]})
        for i in range(4):
            env.step(sorted(info["admissible_actions"])[i])
            snap = bpo_envs.snapshot(env)
            bpo_envs.restore(other, snap)  # another engine: re-rooted, a fresh translation
            assert other.unwrapped._engine._rooted
            snap.release()
            assert _upstream.translation_cache_bytes() <= budget or len(_upstream._PROBLEM_BYTES) == 1
        kept = sum(s for _, s in _upstream._TRANSLATIONS.values())
        assert _upstream.translation_cache_bytes() == sum(_upstream._PROBLEM_BYTES.values()) == kept
    finally:
        other.close()
        _upstream.clear_translation_cache()


# ---- data discovery, solvable games, rewards, provenance ------------------------------------
def _copy_game(data_dir: Path, dest: Path, split: str, trial: str, **game_changes: object) -> None:
    src = data_dir / "json_2.1.1" / "valid_seen" / TASK_DIR / TRIAL
    out = dest / "json_2.1.1" / split / TASK_DIR / trial
    out.mkdir(parents=True)
    game = json.loads((src / "game.tw-pddl").read_text())
    game.update(game_changes)
    for key in [k for k, v in game_changes.items() if v is None]:
        game.pop(key)
    (out / "game.tw-pddl").write_text(json.dumps(game))
    (out / "traj_data.json").write_text((src / "traj_data.json").read_text())


def test_data_found_as_upstream_finds_it(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    import logging

    home = tmp_path / "home"
    _copy_game(data_dir, home / ".cache" / "alfworld", "valid_seen", "trial_home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    caplog.set_level(logging.INFO, logger="bpo_envs.alfworld")
    env = ALFWorldEnv(split="valid_seen")  # ~/.cache/alfworld, with no $ALFWORLD_DATA
    assert env.task_ids() == [f"{TASK_DIR}/trial_home"] and env.data_source == "~/.cache/alfworld"
    _, info = env.reset(seed=0)
    assert info["data_source"] == "~/.cache/alfworld"
    assert "~/.cache/alfworld" in caplog.text
    # $ALFWORLD_DATA comes before the home folder, data_dir= before both
    monkeypatch.setenv("ALFWORLD_DATA", str(data_dir))
    assert ALFWorldEnv(split="valid_seen").task_ids() == [f"{TASK_DIR}/{TRIAL}"]
    assert ALFWorldEnv(split="valid_seen").data_source == "$ALFWORLD_DATA"
    explicit = ALFWorldEnv(data_dir=home / ".cache" / "alfworld", split="valid_seen")
    assert explicit.data_source == "data_dir" and explicit.task_ids() == [f"{TASK_DIR}/trial_home"]
    # a $ALFWORLD_DATA without the split is logged and passed over; nothing anywhere: generated
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    caplog.clear()
    gen = ALFWorldEnv(split="valid_seen", games_per_type=1)
    assert gen.data_source == "generated" and "has no json_2.1.1/valid_seen" in caplog.text
    assert "generated games" in caplog.text


def test_only_solvable_games_are_listed(data_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "d"
    _copy_game(data_dir, root, "train", "trial_ok")
    _copy_game(data_dir, root, "train", "trial_unsolvable", solvable=False)
    _copy_game(data_dir, root, "train", "trial_unchecked", solvable=None)  # no key: upstream skips it
    env = ALFWorldEnv(data_dir=root, split="train")
    assert env.task_ids() == [f"{TASK_DIR}/trial_ok"]
    p = env.provenance()
    assert p["skipped_unsolvable"] == 2 and p["task_count"] == 1 and p["data_source"] == "data_dir"
    assert p["found_via"] == "data_dir" and len(p["files_sha256"]) == 64 and p["split"] == "train"
    with pytest.raises(ValueError, match="unknown task_id"):
        env.reset(options={"task_id": f"{TASK_DIR}/trial_unsolvable"})


def test_reward_settings_verl_agent(data_dir: Path) -> None:
    from bpo_envs.alfworld import VERL_AGENT_REWARD

    env = ALFWorldEnv(data_dir=data_dir, split="valid_seen", **VERL_AGENT_REWARD)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("fly to the moon")
    assert info["invalid_action"] and reward == -0.1 and not terminated
    rewards = [env.step(c)[1] for c in env.expert_actions()]
    assert rewards[-1] == 10.0 and all(r == 0.0 for r in rewards[:-1])
    bpo_envs.check_snapshot(env, seed=2, steps=8)
    plain = ALFWorldEnv(data_dir=data_dir, split="valid_seen")
    plain.reset(seed=0)
    with pytest.raises(bpo_envs.SnapshotKindError):
        plain.restore(env.snapshot())
    with pytest.raises(ValueError, match="reward_mode"):
        ALFWorldEnv(data_dir=data_dir, split="valid_seen", reward_mode="dense")


def test_generated_provenance_and_split_disjointness(env: gym.Env) -> None:
    p = env.unwrapped.provenance()
    assert p["data_source"] == "bundled-generator" and p["found_via"] == "generated"
    assert p["generator"] == "bpo_envs.alfworld.generator" and p["split"] == "train"
    assert p["task_count"] == len(env.unwrapped.task_ids()) == 3 * len(TASK_TYPES)
    json.dumps(p)
    from bpo_envs.alfworld.generator import generate_problem, scene_numbers

    # the same task id in two splits is two different games; valid_unseen rooms are never train rooms
    for index in range(3):
        problems = {s: generate_problem("pick_and_place_simple", s, index) for s in ("train", "valid_seen", "valid_unseen")}
        assert len({p.pddl_problem for p in problems.values()}) == 3
        assert problems["valid_unseen"].traj_data["scene"]["scene_num"] not in scene_numbers("train")
        assert problems["valid_seen"].traj_data["scene"]["scene_num"] in scene_numbers("train")


def test_generator_v2_keeps_alfreds_rooms_and_instance_counts() -> None:
    from bpo_envs.alfworld.generator import _tables, generate_problem, load_scene

    t = _tables()
    sizes = []
    for task_type in TASK_TYPES:
        for index in range(4):
            try:
                problem = generate_problem(task_type, "train", index, version=2)
            except Exception:  # GenerationFailed: the caller moves to the next attempt
                continue
            scene = load_scene(problem.traj_data["scene"]["scene_num"])
            text = problem.pddl_problem.split("(:init", 1)[0]  # the declarations
            receptacles = text.count(" - receptacle\n")
            assert receptacles == len(scene.receptacles)  # every receptacle of the room
            sizes.append(receptacles)
            target = problem.traj_data["pddl_params"]["object_target"]
            copies = sum(1 for line in text.splitlines() if line.strip().startswith(f"{target}_bar_") and line.strip().endswith("- object"))
            low = 2 if task_type == "pick_two_obj_and_place" else 1
            assert low <= copies <= t["max_target_instances"], (task_type, copies)
    assert sizes and max(sizes) > 24  # kitchens keep their ~30-50 cabinets and drawers


def test_generator_v2_games_are_verified_and_named() -> None:
    env = ALFWorldEnv(task_types=["look_at_obj_in_light"], games_per_type=1, generator_version=2)
    p = env.provenance()
    assert p["generator_version"] == 2 and p["data_source"] == "bundled-generator"
    game = env.games.game(env.task_ids()[0])
    assert game["solvable"] is True and game["walkthrough"]  # the planner solved it
    _, info = env.reset(seed=0)
    assert not info["won"]
    for command in env.expert_actions():
        *_, info = env.step(command)
    assert info["won"]
    bpo_envs.check_snapshot(env, seed=0, steps=6)
    v1 = ALFWorldEnv(task_types=["look_at_obj_in_light"], games_per_type=1, generator_version=1)
    assert v1.provenance()["generator_version"] == 1 and v1.games.root != env.games.root
    with pytest.raises(ValueError, match="generator_version"):
        ALFWorldEnv(generator_version=4)
