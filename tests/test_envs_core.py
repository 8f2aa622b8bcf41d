"""The snapshot contract, registration, ReplaySnapshot and TreeMDP."""

from __future__ import annotations

import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import bpo_envs
from bpo_envs import ReplayDivergenceError, ReplaySnapshot, check_snapshot


def make_tree(**kwargs):
    return gym.make("BPO-TreeMDP-v0", **{"depth": 4, "n_actions": 3, "seed": 1, **kwargs})


def test_ids_registered_without_time_limit():
    for env_id in ("BPO-WebShop-v0", "BPO-ALFWorld-v0", "BPO-SWEBench-v0", "BPO-TreeMDP-v0"):
        assert env_id in gym.registry
        assert gym.registry[env_id].max_episode_steps is None
    env = gym.make("bpo_envs:BPO-TreeMDP-v0")
    assert not any(isinstance(w, gym.wrappers.TimeLimit) for w in _wrappers(env))


def _wrappers(env):
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env


def test_check_env_tree_mdp():
    check_env(make_tree().unwrapped)
    check_env(make_tree(decisive_levels=(1,), n_tasks=3).unwrapped)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_check_snapshot_tree_mdp(seed):
    report = check_snapshot(make_tree(), seed=seed, steps=10)
    assert report.portable_checked and report.fresh_env_checked
    assert report.compared_transitions > 10


def test_check_snapshot_replay_wrapper():
    report = check_snapshot(ReplaySnapshot(make_tree(depth=5)), seed=3, steps=12)
    assert report.portable_checked and report.restores > 0


def test_snapshot_sees_through_wrappers():
    env = gym.wrappers.RecordEpisodeStatistics(make_tree())
    env.reset(seed=0)
    env.step("a1")
    snap = bpo_envs.snapshot(env)
    first = env.step("a2")
    env.step("a0")
    bpo_envs.restore(env, snap)
    assert env.step("a2")[0] == first[0]


def test_unwrapped_env_without_snapshots_is_named():
    env = gym.make("CartPole-v1")
    with pytest.raises(TypeError, match="ReplaySnapshot"):
        bpo_envs.snapshot(env)


class _Flaky(gym.Wrapper):
    """A nondeterministic env: the observation changes on every reset."""

    def __init__(self, env):
        super().__init__(env)
        self.resets = 0

    def reset(self, **kwargs):
        self.resets += 1
        obs, info = self.env.reset(**kwargs)
        return f"{obs} #{self.resets}", info


def test_replay_divergence_is_an_error():
    env = ReplaySnapshot(_Flaky(make_tree()))
    env.reset(seed=0)
    env.step("a0")
    snap = env.snapshot()
    with pytest.raises(ReplayDivergenceError, match="not deterministic"):
        env.restore(snap)


def test_released_snapshot_and_wrong_kind():
    env = make_tree()
    env.reset(seed=0)
    snap = bpo_envs.snapshot(env)
    other = make_tree(depth=3)
    other.reset(seed=0)
    with pytest.raises(bpo_envs.SnapshotKindError):
        bpo_envs.restore(other, snap)
    snap.release()
    snap.release()  # idempotent
    with pytest.raises(bpo_envs.SnapshotReleasedError):
        bpo_envs.restore(env, snap)
    with pytest.raises(bpo_envs.SnapshotError):
        bpo_envs.restore(env, b"not a snapshot")


def test_snapshot_survives_reset_and_other_restores():
    env = make_tree()
    env.reset(seed=0)
    env.step("a2")
    early = bpo_envs.snapshot(env)
    expected = [env.step(a)[:4] for a in ("a0", "a1", "a0")]
    env.reset(seed=5, options={"task_id": 0})
    env.step("a1")
    late = bpo_envs.snapshot(env)
    bpo_envs.restore(env, early)
    assert [env.step(a)[:4] for a in ("a0", "a1", "a0")] == expected
    bpo_envs.restore(env, late)
    assert "root/a1" in env.unwrapped.observation_of(0, env.unwrapped._path)


def test_portable_snapshot_restores_in_another_process(tmp_path):
    env = make_tree(depth=5)
    env.reset(seed=0)
    for action in ("a1", "a0"):
        env.step(action)
    blob = bpo_envs.snapshot(env).portable()
    expected = [env.step(a)[0] for a in ("a2", "a2", "a1")]
    (tmp_path / "snap.bin").write_bytes(blob)
    code = (
        "import sys, pickle, gymnasium as gym, bpo_envs\n"
        "env = gym.make('BPO-TreeMDP-v0', depth=5, n_actions=3, seed=1)\n"
        f"bpo_envs.restore(env, open({str(tmp_path / 'snap.bin')!r}, 'rb').read())\n"
        "print(pickle.dumps([env.step(a)[0] for a in ('a2', 'a2', 'a1')]).hex())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert pickle.loads(bytes.fromhex(out.stdout.strip())) == expected


def test_tree_mdp_episode_structure_and_invalid_action():
    env = make_tree(depth=3)
    obs, info = env.reset(seed=0)
    assert info["admissible_actions"] == ["a0", "a1", "a2"] and info["task_id"] == 0 and not info["won"]
    obs, reward, terminated, truncated, info = env.step("jump!")
    assert info["invalid_action"] and "Invalid action" in obs and reward == 0.0
    assert not terminated and not truncated
    total = 0.0
    for t, action in enumerate(("a0", "a1", "a2")):
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        assert terminated == (t == 2) and not truncated
    assert 0.0 <= total <= 1.0 and info["won"] == (total >= 0.5)
    with pytest.raises(bpo_envs.ResetNeeded):
        env.step("a0")


def test_tree_mdp_step_limit_truncates_and_is_in_the_snapshot():
    env = make_tree(depth=3, max_episode_steps=4)
    env.reset(seed=0)
    env.step("nope")
    env.step("nope")
    snap = bpo_envs.snapshot(env)
    env.step("nope")
    *_, truncated, _ = env.step("nope")
    assert truncated
    bpo_envs.restore(env, snap)
    env.step("a0")
    assert env.step("a0")[3]  # the restored counter truncates at the same step


def test_tree_mdp_rewards_are_fixed_by_seed_and_expert_is_optimal():
    a, b, c = (make_tree(seed=s).unwrapped for s in (4, 4, 5))
    leaves = a.leaves()
    assert [a.reward_of(0, p) for p in leaves] == [b.reward_of(0, p) for p in leaves]
    assert [a.reward_of(0, p) for p in leaves] != [c.reward_of(0, p) for p in leaves]
    best = max(a.reward_of(0, p) for p in leaves)
    a.reset(seed=0)
    reward = 0.0
    for action in a.expert_actions():
        reward += a.step(action)[1]
    assert reward == best


def test_agent_like_tree_moves_return_mostly_at_decisive_levels():
    routine, decisive = [], []
    for seed in range(20):
        env = make_tree(depth=6, n_actions=2, seed=seed, decisive_levels=(3,), routine_weight=0.02).unwrapped
        rewards = {p: env.reward_of(0, p) for p in env.leaves()}
        routine += [abs(rewards[p] - rewards[(*p[:5], 1 - p[5])]) for p in rewards]
        decisive += [abs(rewards[p] - rewards[(*p[:3], 1 - p[3], *p[4:])]) for p in rewards]
    assert np.mean(decisive) > 10 * np.mean(routine)


def test_reset_task_selection():
    env = make_tree(n_tasks=5)
    _, info = env.reset(options={"task_id": 3})
    assert info["task_id"] == 3
    _, info = env.reset(options={"task_id": "2"})
    assert info["task_id"] == 2
    with pytest.raises(ValueError, match="unknown task_id"):
        env.reset(options={"task_id": 99})
    with pytest.raises(ValueError, match="unknown reset option"):
        env.reset(options={"level": 1})
    picks = {env.reset(seed=s)[1]["task_id"] for s in range(20)}
    assert picks == {env.reset(seed=s)[1]["task_id"] for s in range(20)} and len(picks) > 1


@pytest.mark.parametrize(
    "kwargs, name",
    [({"depth": 0}, "depth"), ({"n_actions": 1}, "n_actions"), ({"decisive_levels": (9,)}, "decisive_levels"),
     ({"max_episode_steps": 0}, "max_episode_steps"), ({"routine_weight": 2.0}, "routine_weight")],
)
def test_tree_mdp_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        make_tree(**kwargs)


def test_vector_envs_with_text_spaces():
    sync = gym.make_vec("BPO-TreeMDP-v0", num_envs=2, vectorization_mode="sync")
    obs, _ = sync.reset(seed=0)
    obs2, *_ = sync.step(["a0", "a1"])
    # Gymnasium's async env corrupts Text observations in shared memory: shared_memory=False
    asyn = gym.make_vec(
        "BPO-TreeMDP-v0", num_envs=2, vectorization_mode="async", vector_kwargs={"shared_memory": False}
    )
    aobs, _ = asyn.reset(seed=0)
    aobs2, *_ = asyn.step(["a0", "a1"])
    asyn.close()
    sync.close()
    assert list(obs) == list(aobs) and list(obs2) == list(aobs2)
    assert obs2[0].startswith("tree 0 node root/a0") and obs2[1].startswith("tree 0 node root/a1")


def test_observations_fit_the_text_space():
    from bpo_envs.text import to_observation

    space = make_tree().observation_space
    text = "ﬁne café — 10€ ✓ \x00\x07 日本"
    folded = to_observation(text)
    assert folded in space and folded.startswith("fine café — 10€ ✓")
    long = to_observation("x" * 100 + "y" * 100, max_length=120)
    assert len(long) <= 120 and long.startswith("x") and long.endswith("y") and "cut" in long
    ascii_controls = to_observation("a\x00b\x7fc\td\ne")  # the ASCII fast path folds these too
    assert ascii_controls in space and ascii_controls == "a?b?c\td\ne"


def test_the_charset_test_agrees_with_the_charset_on_every_character():
    from bpo_envs.text import _CHARSET, inside_charset

    for cp in [*range(0x2800), 0xFFFF, 0x1F600]:
        ch = chr(cp)
        assert inside_charset(f"ab{ch}c") == (ch in _CHARSET), hex(cp)


def test_gym_make_max_episode_steps_time_limit_is_part_of_the_snapshot():
    """Gymnasium consumes ``max_episode_steps`` in ``gym.make`` and adds a TimeLimit: its counter
    travels with ``bpo_envs.snapshot`` so the contract holds either way."""
    env = gym.make("BPO-TreeMDP-v0", depth=4, max_episode_steps=3)
    env.reset(seed=0)
    env.step("nope")
    snap = bpo_envs.snapshot(env)
    env.step("nope")
    assert env.step("nope")[3]  # truncated at 3
    bpo_envs.restore(env, snap)
    assert not env.step("a0")[3] and env.step("a0")[3]
    blob = snap.portable()
    env.reset(seed=1)
    bpo_envs.restore(env, blob)
    assert not env.step("a0")[3] and env.step("a0")[3]
    check_snapshot(env, seed=0, steps=6)


def test_gym_make_asking_for_more_steps_than_the_env_allows_is_an_error_not_a_shorter_episode():
    """``gym.make(id, max_episode_steps=N)`` does not pass N to the env: above the env's own
    limit the episode would end early without a word, so the pools refuse such an env."""
    from bpo_algos import EnvPool

    longer = gym.make("BPO-TreeMDP-v0", depth=3, max_episode_steps=10)  # the env's own limit: 6
    with pytest.raises(ValueError, match=r"max_episode_steps=10 .* its own limit, 6 steps.*TreeMDPEnv\(max_episode_steps=10"):
        bpo_envs.check_step_limit(longer)
    with pytest.raises(ValueError, match="its own limit"):
        EnvPool([lambda: gym.make("BPO-TreeMDP-v0", depth=3, max_episode_steps=10)]).acquire()
    for ok in (gym.make("BPO-TreeMDP-v0", depth=3, max_episode_steps=4), gym.make("BPO-TreeMDP-v0", depth=3),
               bpo_envs.TreeMDPEnv(depth=3, max_episode_steps=10)):
        bpo_envs.check_step_limit(ok)
    env = EnvPool([lambda: gym.make("BPO-TreeMDP-v0", depth=3, max_episode_steps=4)]).acquire()
    assert env.unwrapped.max_episode_steps == 6 and env._max_episode_steps == 4


def test_state_observations_merge_routine_detours():
    env = make_tree(depth=4, n_actions=2, decisive_levels=(2,), observe="state").unwrapped
    assert env.observation_of(0, (0, 1)) == env.observation_of(0, (1, 0))
    assert env.observation_of(0, (0, 1, 0)) != env.observation_of(0, (0, 1, 1))
    check_snapshot(make_tree(depth=4, decisive_levels=(2,), observe="state"), seed=0, steps=8)
    with pytest.raises(ValueError, match="observe"):
        make_tree(observe="state")


def test_agent_prior_is_confident_on_routine_and_flat_on_decisive_decisions():
    env = make_tree(depth=5, n_actions=3, decisive_levels=(2,), observe="state", n_tasks=2).unwrapped
    prior = env.agent_prior(confidence=4.0)
    for obs, logits in prior.items():
        depth = int(obs.split("state[")[1].split(";")[0])
        assert sorted(logits) == ([0.0, 0.0, 0.0] if depth == 2 else [0.0, 0.0, 4.0])
    assert env.observation_of(1, (0, 0, 1, 0)) in prior
    with pytest.raises(ValueError, match="observe='state'"):
        make_tree(depth=3).unwrapped.agent_prior()
