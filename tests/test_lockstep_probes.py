"""Batches collected together in lock step (one policy pass per engine step over all of them) are
the batches collected one at a time, and the probes' gradients on them are the same
(docs/main-job.md, "Where the time goes").

The one-at-a-time reference is today's ``Algorithm.collect`` from the algorithm's state at the
call (a copy per batch, the engine seeds drawn in the same order): what ``collect_together``
promises. Where the algorithm has no adaptive state the collection reads (RLOO without a budget),
that is also what ``gradient_samples`` without pools gives, batch for batch.
"""

from __future__ import annotations

import copy

import engine_reference
import numpy as np
import pytest
import torch

from baselines import RLOO
from bpo_algos import BPO, Budget, EnvPool
from bpo_algos.controls import Frozen
from bpo_algos.diagnostics import gradient_samples
from bpo_algos.policy.scorer import TextScorerPolicy
from bpo_algos.rollout import EngineRun, RolloutEngine, run_together
from bpo_experiments.presets import PRESETS
from bpo_experiments.runner import INLINE_EVAL_ENVS, evaluation_pool_size, lockstep_pools

TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """As the main job's workers: small ops without threads spin-waiting on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _pools(n: int) -> list[EnvPool]:
    return [EnvPool([engine_reference.webshop] * 3) for _ in range(n)]


def _record(batch_or_result) -> list[tuple]:
    """Every edge of every tree (depth-first: depth, action, reward, advantage, weight) and the
    meters but seconds."""
    out = []
    for tree in batch_or_result.trees:
        edges = [(e.child.depth, e.action.command, e.reward, e.advantage, e.weight) for e in tree.edges()]
        meter = {k: v for k, v in tree.compute.to_dict().items() if k != "seconds"}
        out.append((tree.index, tree.task_id, tree.seed, edges, meter))
    return out


def _logprobs(batch_or_result) -> list[float]:
    return [e.action.logprob for t in batch_or_result.trees for e in t.edges()]


def test_engines_in_lock_step_build_the_trees_each_builds_alone():
    tasks = engine_reference.tasks(5)
    policy = TextScorerPolicy(seed=11)
    algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=0.5, seed=6)
    budget = Budget("env_steps", 60)
    pools = _pools(3)
    try:
        runs = [EngineRun(RolloutEngine(pool, seed=s), algorithm, tasks, budget) for pool, s in zip(pools, (1, 2, 3), strict=True)]
        together = run_together(policy, runs)
        alone = [RolloutEngine(pool, seed=s).run(policy, algorithm, tasks, budget) for pool, s in zip(pools, (1, 2, 3), strict=True)]
        with pytest.raises(ValueError, match="a pool per run"):
            run_together(policy, [EngineRun(RolloutEngine(pools[0], seed=1), algorithm, tasks),
                                  EngineRun(RolloutEngine(pools[0], seed=2), algorithm, tasks)])
        with pytest.raises(ValueError, match="seconds"):
            run_together(policy, [EngineRun(RolloutEngine(pools[0], seed=1), algorithm, tasks, Budget("seconds", 1.0))])
    finally:
        for pool in pools:
            pool.close()
    assert [_record(r) for r in together] == [_record(r) for r in alone]
    for t, a in zip(together, alone, strict=True):
        assert np.allclose(_logprobs(t), _logprobs(a), atol=TOLERANCE, rtol=0)
        assert t.entropies == pytest.approx(a.entropies, abs=TOLERANCE)
    # the batches are not one another's (a lock step that shared a stream would make them so)
    assert len({str(_record(r)) for r in together}) == 3
    assert any(e.child.depth > 1 and len(e.parent.children) > 1 for r in together for t in r.trees for e in t.edges())  # forks


def _one_at_a_time(algorithm, policy, pools, tasks, budget):
    """``collect`` from the algorithm's state at the call, once per pool, with the engine seeds
    ``collect_together`` draws (in order, from the same generator)."""
    start = copy.deepcopy(algorithm)
    draws = copy.deepcopy(algorithm._rng)
    seeds = [int(draws.integers(2**31 - 1)) for _ in pools]
    return [copy.deepcopy(start).collect(policy, pool, tasks, budget, seed=s) for pool, s in zip(pools, seeds, strict=True)]


@pytest.mark.parametrize("name", ["bpo_budget", "rloo"])
def test_collect_together_equals_collect_from_the_state_at_the_call(name):
    tasks = engine_reference.tasks(5)
    policy = TextScorerPolicy(seed=11)
    if name == "rloo":
        algorithm, budget = RLOO(group_size=3, seed=7), Budget("env_steps", 70)
    else:
        algorithm, budget = BPO(backbones=2, branch_factor=3, entropy_quantile=0.5, seed=6), Budget("env_steps", 70)
    pools = _pools(4)
    try:
        algorithm.collect(policy, pools[0], tasks, budget)  # a warm-up: tree costs (and BPO's threshold) to hold
        expected = _one_at_a_time(algorithm, policy, pools, tasks, budget)
        got = algorithm.collect_together(policy, pools, tasks, budget)
    finally:
        for pool in pools:
            pool.close()
    assert [_record(b) for b in got] == [_record(b) for b in expected]
    assert all(np.allclose(_logprobs(g), _logprobs(e), atol=TOLERANCE, rtol=0) for g, e in zip(got, expected, strict=True))
    assert len({str(_record(b)) for b in got}) == len(got)  # every batch on a stream of its own


def test_probe_gradients_in_lock_step_equal_the_one_at_a_time_gradients():
    """RLOO without a budget reads no adaptive state: ``gradient_samples`` with pools gives, row
    for row, the gradients it gives without them (today's path, one batch at a time)."""
    tasks = engine_reference.tasks(3)
    pool, *pools = _pools(3)
    try:
        policy = TextScorerPolicy(seed=11)
        # 4 batches on 2 pools: a group of 2 in lock step, then another from the state it left
        sequential = gradient_samples(RLOO(group_size=2, seed=7), policy, pool, tasks, 4, keep_grads=True)
        together = gradient_samples(RLOO(group_size=2, seed=7), policy, pool, tasks, 4, keep_grads=True, pools=pools)
        with pytest.raises(ValueError, match="two or more pools"):
            gradient_samples(RLOO(group_size=2, seed=7), policy, pool, tasks, 2, pools=[pools[0]])
    finally:
        pool.close()
        for p in pools:
            p.close()
    assert together.grads.shape == sequential.grads.shape == (4, sum(p.numel() for p in policy.parameters()))
    assert torch.allclose(together.grads, sequential.grads, atol=1e-6, rtol=1e-5)
    assert [{k: v for k, v in c.items() if k != "seconds"} for c in together.costs] == \
           [{k: v for k, v in c.items() if k != "seconds"} for c in sequential.costs]
    # distinct batches: a lock step that gave every batch one stream would repeat a row
    distance = torch.cdist(together.grads, together.grads)
    assert (distance + torch.eye(4)).min() > 0


def test_wide_pools_only_where_the_env_steps_inline():
    cpu = PRESETS["cpu"].envs
    assert evaluation_pool_size(cpu["webshop"], 4) == INLINE_EVAL_ENVS
    assert evaluation_pool_size(cpu["alfworld"], 4) == 4  # a step may block: the preset's pool
    assert lockstep_pools(cpu["alfworld"], 4) == []
    pools = lockstep_pools(cpu["webshop"], 4)
    try:
        assert len(pools) > 1 and {len(p) for p in pools} == {4}
    finally:
        for p in pools:
            p.close()


def test_frozen_collects_together_its_inner_batches_with_zero_advantages():
    tasks = engine_reference.tasks(3)
    policy = TextScorerPolicy(seed=11)
    pools = _pools(2)
    try:
        frozen = Frozen(RLOO(group_size=3, seed=7), "rloo").collect_together(policy, pools, tasks, Budget("env_steps", 40))
        inner = RLOO(group_size=3, seed=7).collect_together(policy, pools, tasks, Budget("env_steps", 40))
    finally:
        for pool in pools:
            pool.close()

    def without_advantages(batch):
        return [(i, task, seed, [e[:3] + e[4:] for e in edges], meter) for i, task, seed, edges, meter in _record(batch)]

    assert [without_advantages(b) for b in frozen] == [without_advantages(b) for b in inner]
    assert all(e.advantage == 0.0 for b in frozen for e in b.steps) and any(e.advantage != 0.0 for b in inner for e in b.steps)
    assert {b.algorithm for b in frozen} == {"frozen"}
