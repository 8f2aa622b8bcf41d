"""Branching for a policy that reasons before it acts, on the exact-gradient TreeMDP.

A synthetic text policy writes ``<think>...</think><action>...</action>``. BPO with each offered
decision-entropy rule (``exact``: the immediate-answer proxy; ``probe``: M completions at ``h``,
parsed and discarded) is unbiased: |z| < 4 along the exact gradient, 3 random directions and the
reasoning direction (3,000 seeded batches; a correct estimator fails with probability about
5 x 6.3e-5 = 3e-4). The rule that is not offered, branching on the entropy after the backbone's
own sampled reasoning, is caught by the same test (its z along the reasoning direction is
about 14 at this size).
"""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "studies"))
from reasoning_unbiasedness import TREE, z_scores  # noqa: E402

import bpo_envs  # noqa: E402,F401
from bpo_algos.policy.base import plugin_entropy  # noqa: E402
from bpo_algos.policy.reasoning import ReasoningTabularPolicy, tree_reasoning_policy  # noqa: E402
from bpo_envs.prompting import Context, PromptConfig, parse_action  # noqa: E402

BATCHES = 3000
Z_MAX = 4.0


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["exact", "probe"])
def test_offered_rules_are_unbiased(rule):
    row = z_scores(rule, BATCHES)
    assert row["max_abs_z"] < Z_MAX, row
    assert row["branch_points_per_tree"] > 0.2, row  # the rule does branch


@pytest.mark.slow
def test_branching_on_the_backbones_sampled_reasoning_is_biased():
    row = z_scores("sampled-reasoning", BATCHES)
    assert row["max_abs_z"] > Z_MAX, f"the rule-1 violation went undetected: {row}"


def test_probe_is_metered_as_scoring_and_discarded():
    env = gym.make("BPO-TreeMDP-v0", **TREE)
    policy, _ = tree_reasoning_policy(env, "probe", probe_samples=6)
    obs, info = env.reset(seed=0)
    context = Context(0, obs, tuple(info["admissible_actions"]), initial_observation=obs)
    before = policy.meter.to_dict()
    (h,) = policy.decision_entropy([context])
    after = policy.meter.to_dict()
    assert after["gen_tokens"] == before["gen_tokens"] and after["prefill_tokens"] == before["prefill_tokens"]
    assert after["score_tokens"] - before["score_tokens"] == 6 * 2 + 1  # 6 replies of 2 tokens, one prompt
    assert 0.0 <= h <= torch.log(torch.tensor(3.0)).item() + 1e-9
    (row,) = policy.sample([context], 3, None)
    assert len(row) == 3 and all(a.env_action in context.admissible_actions for a in row)


def test_plugin_entropy_and_reasoning_parse():
    assert plugin_entropy(["a", "a"]) == 0.0
    assert plugin_entropy(["a", "b"]) == pytest.approx(0.6931471805599453)
    assert plugin_entropy(["a", None, None, "b"]) == pytest.approx(1.0397207708399179)
    with pytest.raises(ValueError):
        plugin_entropy([])
    cfg = PromptConfig(reasoning=True)
    assert parse_action("<think>maybe <action>x</action></think><action>y</action>", cfg) == "y"
    assert parse_action("<think>maybe <action>x</action></think> so", cfg) is None  # reasoning, no action
    assert parse_action("<think>unfinished reasoning", cfg) is None
    with pytest.raises(ValueError, match="decision_entropy"):
        ReasoningTabularPolicy(decision_entropy="backbone")
