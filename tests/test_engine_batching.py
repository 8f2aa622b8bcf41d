"""One policy pass per engine step, features built in one go, inline stepping and batched
evaluation give the numbers the engine gave before them (docs/algorithms.md, "One policy pass per
engine step").

``tests/data/engine_reference.json`` was written by ``tests/engine_reference.py`` on the engine
that scored each call on its own, stepped every env on a worker thread and evaluated one episode
at a time; the trees, meters and evaluation wins must be the same now (log-probs and entropies
up to float rounding: a larger batch may round a matrix product differently).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import engine_reference
import gymnasium as gym
import numpy as np
import pytest
import torch

import bpo_envs  # noqa: F401 - registers the ids
from bpo_algos import EnvPool, RolloutEngine, Topology
from bpo_algos.policy import Context
from bpo_algos.policy.base import Turn
from bpo_algos.policy.episode_memory import context_features
from bpo_algos.policy.scorer import TextScorerPolicy, _words, hashed_ngrams, mentions
from bpo_envs.core import SnapshotEnv
from bpo_envs.pool import StepTimeoutError, steps_inline
from bpo_experiments.evaluation import evaluate_episodes

REFERENCE = json.loads((Path(__file__).parent / "data" / "engine_reference.json").read_text())
TOLERANCE = 1e-5


def _same_trees(recorded: dict, now: dict) -> None:
    assert now["compute"] == recorded["compute"]
    assert len(now["trees"]) == len(recorded["trees"])
    for old, new in zip(recorded["trees"], now["trees"], strict=True):
        assert (new["index"], new["task"], new["seed"], new["compute"]) == (old["index"], old["task"], old["seed"], old["compute"])
        assert [(d, a, r) for d, a, _, r in new["edges"]] == [(d, a, r) for d, a, _, r in old["edges"]]
        assert np.allclose([e[2] for e in new["edges"]], [e[2] for e in old["edges"]], atol=TOLERANCE, rtol=0)
        assert np.allclose(new["entropies"], old["entropies"], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", sorted(REFERENCE["collections"]))
def test_batches_equal_the_recorded_engine(name):
    """BPO with forks on several trees in flight, BPO under an env-step budget, RLOO: the same
    trees, meters and budget behaviour as the engine that scored each call on its own."""
    now = engine_reference.collections(only=name)
    _same_trees(REFERENCE["collections"][name], json.loads(json.dumps(now[name])))


def test_evaluation_equals_the_recorded_one_episode_at_a_time():
    assert engine_reference.evaluation() == REFERENCE["evaluation"]
    assert 0 < sum(REFERENCE["evaluation"]["tree_mdp"]) < len(REFERENCE["evaluation"]["tree_mdp"])  # not all-or-nothing


class _OwnSeedScorer(TextScorerPolicy):
    """Declares that it samples from its own seed: evaluation then runs one episode at a time."""

    samples_from_rngs = False


def test_batched_evaluation_equals_the_one_at_a_time_path():
    tasks = list(range(8))
    pool = EnvPool([engine_reference.tree_mdp] * 3)
    try:
        batched = evaluate_episodes(TextScorerPolicy(seed=4), pool, tasks, 3, seed=9)
        policy = _OwnSeedScorer(seed=4)
        one_at_a_time = evaluate_episodes(policy, pool, tasks, 3, seed=9)
    finally:
        pool.close()
    assert batched == one_at_a_time and 0 < sum(batched) < len(batched)
    # a broken batch (every episode on one seed) would not be the one-at-a-time result
    assert one_at_a_time != evaluate_episodes_on_one_seed(tasks)


def evaluate_episodes_on_one_seed(tasks: list[int]) -> list[float]:
    pool = EnvPool([engine_reference.tree_mdp] * 3)
    try:
        result = RolloutEngine(pool, seed=9).run(TextScorerPolicy(seed=4), Topology(), [t for t in tasks for _ in range(3)],
                                                 seeds=[9] * (3 * len(tasks)))
    finally:
        pool.close()
    return [float(e.won) for t in result.trees for e in t.leaf_edges()]


def test_a_seeded_tree_in_a_batch_is_the_tree_built_alone():
    seeds = [101, 202, 303, 404, 505]
    tasks = [0, 1, 2, 0, 1]
    pool = EnvPool([engine_reference.tree_mdp] * 2)
    try:
        policy = TextScorerPolicy(seed=1)
        together = RolloutEngine(pool, seed=0).run(policy, Topology(), tasks, seeds=seeds).trees
        alone = [RolloutEngine(pool, seed=s).run(policy, Topology(), [t]).trees[0] for t, s in zip(tasks, seeds, strict=True)]
        with pytest.raises(ValueError, match="seeds for"):
            RolloutEngine(pool).run(policy, Topology(), tasks, seeds=seeds[:2])
    finally:
        pool.close()
    assert [t.seed for t in together] == [t.seed for t in alone]
    assert [[e.action.command for e in t.edges()] for t in together] == [[e.action.command for e in t.edges()] for t in alone]


# ---- the scorer's features, built in one go -----------------------------------------------------
def per_candidate_scores(policy: TextScorerPolicy, contexts: list[Context]) -> list[torch.Tensor]:
    """The scorer as it was: features as Python lists per candidate, one tensor per call."""

    def bags(texts: list[str]) -> torch.Tensor:
        ids: list[int] = []
        offsets: list[int] = []
        for text in texts:
            offsets.append(len(ids))
            ids.extend(hashed_ngrams(text[: policy.max_chars], policy.buckets))
        return policy.embedding(torch.tensor(ids, dtype=torch.long), torch.tensor(offsets, dtype=torch.long))

    state_texts: list[str] = []
    action_texts: list[str] = []
    features: list[list[float]] = []
    sizes: list[int] = []
    for c in contexts:
        actions = c.admissible_actions or ()
        task = c.initial_observation or c.observation
        recent = [turn.action for turn in c.history[len(c.history) - policy.history :]] if policy.history else []
        state_texts += [task, c.observation, "\n".join(recent)]
        task_words, obs_words = _words(task[: policy.max_chars]), _words(c.observation[: policy.max_chars])
        memory = context_features(c, actions) if policy.memory else [[] for _ in actions]
        for action, mention, remembered in zip(actions, mentions(c.observation, actions, policy.mention_chars), memory, strict=True):
            action_texts += [action, mention]
            a_words, m_words = _words(action), _words(mention)
            features.append([
                len(a_words & task_words) / max(len(a_words), 1),
                len(a_words & obs_words) / max(len(a_words), 1),
                len(m_words & task_words) / max(len(m_words), 1),
                float(action in recent),
                *remembered,
            ])
        sizes.append(len(actions))
    states = bags(state_texts).view(len(contexts), 3, -1)
    pairs = bags(action_texts).view(len(features), 2, -1)
    per_action = torch.repeat_interleave(states, torch.tensor(sizes), dim=0)
    t, o, r = per_action[:, 0], per_action[:, 1], per_action[:, 2]
    a, m = pairs[:, 0], pairs[:, 1]
    x = torch.cat([a, m, a * t, a * o, m * t, a * r, torch.tensor(features)], dim=-1)
    flat = policy.out(torch.tanh(policy.hidden(x))).squeeze(-1)
    return list(torch.split(flat, sizes))


ROOM = ("You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, "
        "a fridge 1, and a sinkbasin 1.\n\nYour task is to: put a clean apple in fridge.")


def _alfworld_contexts() -> list[Context]:
    actions = ("go to cabinet 1", "go to countertop 1", "go to fridge 1", "take apple 1 from countertop 1", "look", "look")
    turns = (Turn(ROOM, "go to countertop 1"), Turn("You arrive at countertop 1. On the countertop 1, you see a apple 1.", "look"))
    return [
        Context("a", ROOM, actions, (), ROOM),
        Context("a", "You arrive at countertop 1. On the countertop 1, you see a apple 1.", actions, turns[:1], ROOM),
        Context("a", "You are facing the countertop 1.", actions, turns, ROOM),
        Context("a", "Nothing happens.", actions[:2], turns + turns, ROOM),
    ]


def _webshop_contexts() -> list[Context]:
    pool = EnvPool([engine_reference.webshop] * 2)
    try:
        result = RolloutEngine(pool, seed=3).run(TextScorerPolicy(seed=3), Topology(), engine_reference.tasks(4))
    finally:
        pool.close()
    return [e.context for t in result.trees for e in t.edges()]


@pytest.mark.parametrize("memory", [None, "alfworld"])
def test_scores_equal_the_per_candidate_features(memory):
    policy = TextScorerPolicy(seed=5, memory=memory)
    contexts = _alfworld_contexts() + (_webshop_contexts() if memory is None else [])
    assert len(contexts) >= (4 if memory else 20)
    with torch.no_grad():
        new = policy.scores(contexts)
        old = per_candidate_scores(policy, contexts)
        alone = [policy.scores([c])[0] for c in contexts]
    for a, b, c in zip(new, old, alone, strict=True):
        assert a.shape == b.shape and torch.allclose(a, b, atol=TOLERANCE, rtol=0)
        assert torch.allclose(a, c, atol=TOLERANCE, rtol=0)  # a context scores the same in any batch
    # the repeat feature counts: an action just taken scores differently than before it was taken
    fresh = Context("a", "You are facing the countertop 1.", _alfworld_contexts()[2].admissible_actions, (), ROOM)
    assert not torch.equal(policy.scores([fresh])[0].detach(), new[2].detach())
    # gradients reach the embedding through the batched bags
    policy.scores(contexts[:3])[1].sum().backward()
    assert policy.embedding.weight.grad is not None and policy.embedding.weight.grad.abs().sum() > 0


def test_a_shared_pass_gives_the_separate_calls_results_and_meter():
    contexts = _alfworld_contexts()

    def calls(policy: TextScorerPolicy) -> tuple:
        rngs = [np.random.default_rng(i) for i in range(len(contexts))]
        entropies = policy.decision_entropy(contexts[1:])
        samples = policy.sample(contexts, 3, rngs=rngs)
        distinct = policy.sample_distinct(contexts[:2], 2, rngs=rngs[:2])
        return entropies, [[(a.command, a.logprob) for a in row] for row in samples + distinct], policy.meter

    separate = calls(TextScorerPolicy(seed=8))
    policy = TextScorerPolicy(seed=8)
    with policy.shared_pass(contexts):
        shared = calls(policy)
        # a context the pass did not cover is scored on its own
        [outside] = policy.decision_entropy([Context("b", ROOM, ("look", "go to fridge 1"), (), ROOM)])
    assert np.allclose(shared[0], separate[0], atol=TOLERANCE, rtol=0)
    assert [[a for a, _ in row] for row in shared[1]] == [[a for a, _ in row] for row in separate[1]]
    assert np.allclose([p for row in shared[1] for _, p in row], [p for row in separate[1] for _, p in row], atol=TOLERANCE)
    assert outside > 0 and policy._shared is None
    assert shared[2].policy_calls == separate[2].policy_calls + 1  # each call metered as before
    assert shared[2].score_tokens == separate[2].score_tokens + 3 and shared[2].prefill_tokens == separate[2].prefill_tokens


# ---- inline stepping --------------------------------------------------------------------------
class _ThreadRecorder(SnapshotEnv):
    """One-step episodes that record the thread each step ran on (and can hang)."""

    def __init__(self, hang: float = 0.0) -> None:
        super().__init__(max_episode_steps=3)
        self.hang = hang
        self.threads: list[int] = []

    def task_ids(self):
        return [0]

    def _reset_task(self, task_id):
        return "start", {"admissible_actions": ["go"]}

    def _step(self, action):
        self.threads.append(threading.get_ident())
        if action == "fail":
            raise RuntimeError("broken step")
        time.sleep(self.hang)
        return "done", 1.0, True, {"admissible_actions": ["go"]}

    def _get_state(self):
        return None

    def _set_state(self, state):
        pass

    def expert_actions(self):
        return ["go"]


class _Bounded(_ThreadRecorder):
    step_may_block = False


def test_bounded_envs_step_inline_and_the_others_keep_threads_and_deadlines():
    pool = EnvPool([_Bounded, lambda: gym.wrappers.OrderEnforcing(_Bounded()), _ThreadRecorder, lambda: _ThreadRecorder(hang=5.0)],
                   step_timeout_s=0.5)
    try:
        envs = [pool.acquire() for _ in range(4)]
        assert [steps_inline(e) for e in envs] == [True, True, False, False]  # read through the wrapper
        for env in envs:
            env.reset(seed=0)
        results = pool.step_many(envs, ["go", "fail", "go", "go"])
    finally:
        pool.close()
    me = threading.get_ident()
    assert envs[0].threads == [me] and envs[1].unwrapped.threads == [me]
    assert envs[2].threads and envs[2].threads[0] != me
    assert results[0][0] == "done" and isinstance(results[1], RuntimeError) and results[2][0] == "done"
    assert isinstance(results[3], StepTimeoutError)  # the deadline still holds for an env that may block


def test_the_declaration_is_read_from_the_class():
    env = _ThreadRecorder()
    env.step_may_block = False  # an instance cannot declare itself bounded: the class declares
    assert not steps_inline(env) and steps_inline(_Bounded())
    assert steps_inline(gym.make("BPO-WebShop-v0")) and steps_inline(gym.make("BPO-TreeMDP-v0"))
