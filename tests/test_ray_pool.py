"""RayEnvPool on a local Ray cluster: same batches as a local pool, snapshots that stay on their
actor or move as portable bytes, concurrent steps, and an actor killed mid-tree."""

from __future__ import annotations

import functools
import os
import signal
import sys
import time

import gymnasium as gym
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'bpo-gym[distributed]'")

from test_reliability import check_tree  # noqa: E402

import bpo_envs  # noqa: E402
from bpo_algos import BPO, EnvPool, Policy, TabularPolicy, Trainer, TrainerConfig  # noqa: E402
from bpo_envs.ray_pool import RayEnvPool, RemoteEnv, RemoteSnapshot  # noqa: E402

# the wrappers below are defined here, so the actors get them by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

TREE = {"depth": 3, "n_actions": 3, "seed": 7}
tree_fn = functools.partial(gym.make, "BPO-TreeMDP-v0", **TREE)


def webshop_fn():
    return functools.partial(gym.make, "BPO-WebShop-v0", max_episode_steps=6)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _key(batch):
    return [
        [(e.action.text, e.reward, e.child.observation, round(e.weight, 12), round(e.advantage, 12)) for e in t.edges()]
        for t in batch.trees
    ]


@pytest.mark.parametrize("name", ["treemdp", "webshop"])
def test_same_seeds_give_the_same_batch_locally_and_on_ray(name):
    fn = tree_fn if name == "treemdp" else webshop_fn()
    tasks = [0, 0, 0] if name == "treemdp" else [0, 3, 5]

    def collect(pool):
        algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=2, seed=4)
        return algorithm.collect(TabularPolicy(seed=5), pool, tasks)

    local = collect(EnvPool([fn] * 4))
    with RayEnvPool(fn, actors=2, envs_per_actor=2) as pool:
        remote = collect(pool)
        assert pool.stats["local_restores"] + pool.stats["moved_restores"] == remote.compute.restores
    assert _key(local) == _key(remote) and local.n_trees == len(tasks)
    assert (local.compute.env_steps, local.compute.restores) == (remote.compute.env_steps, remote.compute.restores)


def test_snapshots_stay_on_their_actor_and_move_as_portable_bytes():
    with RayEnvPool(tree_fn, actors=2) as pool:
        a, b = pool.acquire(), pool.acquire()
        assert isinstance(a, RemoteEnv) and pool.actor_of(a) != pool.actor_of(b)
        a.reset(seed=0)
        b.reset(seed=1)
        a.step("a1")
        snap = bpo_envs.snapshot(a)
        assert isinstance(snap, RemoteSnapshot) and snap.kind[0] == "TreeMDP"
        expected = [a.step(x) for x in ("a2", "a0")]
        bpo_envs.restore(a, snap)
        assert pool.stats == {**pool.stats, "local_restores": 1, "moved_restores": 0, "moved_bytes": 0}
        assert [a.step(x) for x in ("a2", "a0")] == expected
        bpo_envs.restore(b, snap)  # another actor: the state moves as bytes
        assert pool.stats["moved_restores"] == 1 and pool.stats["moved_bytes"] > 0
        assert [b.step(x) for x in ("a2", "a0")] == expected
        local = tree_fn()
        bpo_envs.restore(local, snap.portable())  # and into this process
        assert [local.step(x) for x in ("a2", "a0")] == expected
        assert pool.actor_stats()[pool.actor_of(a)]["snapshots"] == 1
        snap.release()
        with pytest.raises(bpo_envs.SnapshotReleasedError):
            bpo_envs.restore(a, snap)
        assert pool.actor_stats()[pool.actor_of(a)]["snapshots"] == 0
        # bad model output is an observation on the actor too
        assert a.reset(seed=0) and a.step("\x00; rm -rf / $(id)")[4]["invalid_action"] is True


class SlowStep(gym.Wrapper):
    """Sleeps in step and reports when it ran (a sandbox waiting on a command)."""

    def step(self, action):
        start = time.monotonic()
        time.sleep(0.4)
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "ran": (os.getpid(), start, time.monotonic())}


def test_step_many_runs_different_actors_concurrently():
    with RayEnvPool(lambda: SlowStep(tree_fn()), actors=2, envs_per_actor=2) as pool:
        envs = [pool.acquire() for _ in range(4)]  # slots 0..3 on actors 0, 1, 0, 1
        for env in envs:
            env.reset(seed=0)
        runs = [r[4]["ran"] for r in pool.step_many(envs, ["a0"] * 4)]
    by_actor = {}
    for pid, start, end in runs:
        by_actor.setdefault(pid, []).append((start, end))
    assert len(by_actor) == 2
    (x0, x1), (y0, y1) = (sorted(v) for v in by_actor.values())
    # an actor runs its own envs in turn; the two actors overlap
    assert x0[1] <= x1[0] and y0[1] <= y1[0]
    assert x0[0] < y0[1] and y0[0] < x0[1]


class KillingPolicy(Policy):
    """Kills an actor process with SIGKILL at the n-th sampling call (a crashed worker)."""

    def __init__(self, inner, pid, at):
        self.inner, self.meter, self.pid, self.at, self.calls = inner, inner.meter, pid, at, 0

    def decision_entropy(self, contexts):
        return self.inner.decision_entropy(contexts)

    def sample(self, contexts, n, rngs):
        self.calls += 1
        if self.calls == self.at:
            os.kill(self.pid, signal.SIGKILL)
            for _ in range(500):  # wait until it is gone
                try:
                    os.kill(self.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.01)
        return self.inner.sample(contexts, n, rngs)

    def token_logprobs(self, steps):
        return self.inner.token_logprobs(steps)


@pytest.mark.parametrize("restarts", [1, 0])
def test_an_actor_killed_mid_tree_costs_only_its_paths(restarts):
    with RayEnvPool(tree_fn, actors=2, envs_per_actor=2, max_actor_restarts=restarts) as pool:
        victim = pool.pids()[0]
        algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=2, seed=4)
        policy = KillingPolicy(TabularPolicy(seed=5), victim, at=4)
        batch = algorithm.collect(policy, pool, [0, 0, 0, 0])
        assert policy.calls > 4 and batch.compute.failures >= 1
        assert batch.n_trees == 4 and batch.compute.dropped_steps == 0  # retried, not dropped
        for tree in batch.trees:
            check_tree(tree, tree_fn(), 2, 3)
            assert len(tree.root.children) == 2
        assert pool.stats["actor_restarts"] == restarts and pool.stats["retired_actors"] == 1 - restarts
        alive = [p for p in pool.pids() if p is not None]
        assert victim not in alive and len(alive) == 1 + restarts
        # training goes on with the same pool
        trainer = Trainer(algorithm, TabularPolicy(seed=1), pool, [0], TrainerConfig(updates=2, tasks_per_update=2))
        assert len(trainer.train()) == 2


class StuckOnce(gym.Wrapper):
    """A TreeMDP whose step hangs once among all processes (the first to create ``flag``): a
    stuck env (a hung daemon, a deadlock)."""

    def __init__(self, env, flag):
        super().__init__(env)
        self.flag = flag

    def step(self, action):
        try:
            os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL))
            time.sleep(3600)
        except FileExistsError:
            pass
        return self.env.step(action)


def stuck_once_fn(flag):
    return StuckOnce(tree_fn(), flag)


def test_a_stuck_step_times_out_and_its_actor_is_replaced(tmp_path):
    from bpo_envs.pool import DEFAULT_STEP_TIMEOUT_S

    with RayEnvPool(tree_fn, actors=1) as pool:
        assert pool.timeout_s == DEFAULT_STEP_TIMEOUT_S  # an hour by default: stuck envs end
    with RayEnvPool(functools.partial(stuck_once_fn, str(tmp_path / "hung")), actors=2, timeout_s=3.0) as pool:
        algorithm = BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, max_branch_points=2, seed=0)
        t0 = time.monotonic()
        batch = algorithm.collect(TabularPolicy(seed=0), pool, [0, 0])
        assert time.monotonic() - t0 < 60
        assert batch.n_trees == 2 and batch.compute.failures >= 1 and batch.compute.dropped_steps == 0
        assert pool.stats["actor_restarts"] >= 1


def test_bad_arguments_name_themselves():
    for kwargs, name in (({"actors": 0}, "actors"), ({"envs_per_actor": 0}, "envs_per_actor"), ({"timeout_s": -1}, "timeout_s"), ({"retries": -1}, "retries")):
        with pytest.raises(ValueError, match=name):
            RayEnvPool(tree_fn, **kwargs)
    with pytest.raises(ValueError, match="env_fns"):
        RayEnvPool([])


def _replay_tree():
    return bpo_envs.ReplaySnapshot(gym.make("BPO-TreeMDP-v0", **TREE))


def test_replayed_steps_on_the_actors_reach_the_meter():
    def collect(pool):
        algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=2, seed=4)
        return algorithm.collect(TabularPolicy(seed=5), pool, [0, 0])

    local = collect(EnvPool([_replay_tree] * 4)).compute
    with RayEnvPool(_replay_tree, actors=2, envs_per_actor=2) as pool:
        remote = collect(pool).compute
    assert local.replay_steps > 0
    assert (remote.replay_steps, remote.env_steps) == (local.replay_steps, local.env_steps)


class PinnedTree(bpo_envs.TreeMDPEnv):
    restore_prefers_origin = True  # as ALFWorld declares


def test_the_proxy_forwards_what_the_hosted_env_declares():
    import numpy as np

    shop = webshop_fn()
    with RayEnvPool([shop, functools.partial(PinnedTree, **TREE)], actors=1) as pool:
        proxy, pinned = pool.acquire(), pool.acquire()
        local = shop()
        here = local.unwrapped
        assert bpo_envs.declared(proxy) is proxy and isinstance(proxy, bpo_envs.EnvCapabilities)
        proxy.reset(seed=0, options={"task_id": 3})
        local.reset(seed=0, options={"task_id": 3})
        assert (proxy.max_episode_steps, proxy.restore_prefers_origin, proxy.has_expert) == (here.max_episode_steps, False, True)
        assert proxy.step_may_block and not here.step_may_block  # the proxy's own: every call waits on an actor
        assert proxy.task_ids() == list(here.task_ids())
        assert proxy.expert_actions() == here.expert_actions()
        assert proxy.provenance()["files_sha256"] == here.provenance()["files_sha256"]
        rng, twin = np.random.default_rng(2), np.random.default_rng(2)
        assert proxy.sample_action(rng) == here.sample_action(twin)
        assert rng.random() == twin.random()  # the caller's rng advanced as a local env's would
        assert pinned.restore_prefers_origin and pinned.max_episode_steps == PinnedTree(**TREE).max_episode_steps
        local.close()
