"""VLLMPolicy on the tiny model (skipped unless vllm is installed: bpo-gym-setup vllm)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("transformers")

from bpo_algos.policy import Action, Context, VLLMPolicy  # noqa: E402
from bpo_algos.policy.tiny import tiny_model_path  # noqa: E402

ATOL = 1e-4


@dataclass
class Step:
    context: Context
    action: Action


def contexts() -> list[Context]:
    obs = "tree 0 node root (depth 0 of 3). Actions: a0, a1, a2"
    root = Context(0, obs, ("a0", "a1", "a2"), initial_observation=obs)
    return [root, root.child("a1", "tree 0 node root/a1 (depth 1 of 3). Actions: a0, a1, a2", ["a0", "a1", "a2"])]


@pytest.fixture(scope="module")
def policy():
    p = VLLMPolicy(tiny_model_path(), max_new_tokens=10, seed=0, max_model_len=2048)
    yield p
    p.close()


def _steps(samples, ctxs):
    return [Step(c, a) for c, row in zip(ctxs, samples, strict=True) for a in row]


def test_vllm_sampled_logprobs_equal_hf_teacher_forced(policy):
    ctxs = contexts()
    samples = policy.sample(ctxs, 4, None)
    assert [len(r) for r in samples] == [4, 4]
    steps = _steps(samples, ctxs)
    logp = policy.token_logprobs(steps).detach()
    for i, s in enumerate(steps):
        n = len(s.action.token_ids)
        assert s.action.prompt_token_ids == policy.prompt_ids(s.context)
        assert torch.allclose(logp[i, :n], torch.tensor(s.action.logprobs), atol=ATOL), (s.action, logp[i])
    assert policy.meter.gen_tokens == sum(len(s.action.token_ids) for s in steps)
    assert policy.meter.prefill_tokens > 0


def test_weights_after_an_update_reach_vllm(policy):
    ctxs = contexts()
    before = _steps(policy.sample(ctxs, 2, None), ctxs)
    old = policy.token_logprobs(before).detach()
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)
    loss = -policy.token_logprobs(before).sum()
    loss.backward()
    optimizer.step()
    new = policy.token_logprobs(before).detach()
    assert (new - old).abs().max() > 1e-2
    # the next sample pushes the new weights: vLLM's log-probs follow the updated HF model
    after = _steps(policy.sample(ctxs, 3, None), ctxs)
    hf = policy.token_logprobs(after).detach()
    for i, s in enumerate(after):
        n = len(s.action.token_ids)
        assert torch.allclose(hf[i, :n], torch.tensor(s.action.logprobs), atol=ATOL)


@pytest.mark.parametrize("scoring", ["vllm", "hf"])
def test_decision_entropy_through_vllm_equals_hf_and_is_metered(policy, scoring):
    from bpo_algos.policy import HFPolicy

    ctxs = contexts()
    policy.scoring = scoring
    try:
        before = policy.meter.score_tokens
        got = policy.decision_entropy(ctxs)
        charged = policy.meter.score_tokens - before
    finally:
        policy.scoring = "vllm"
    want = HFPolicy.decision_entropy(policy, ctxs)
    assert got == pytest.approx(want, abs=1e-4)
    answers = sum(len(policy.prompts.action_ids(a)) for c in ctxs for a in c.admissible_actions)
    prompts = sum(len(policy.prompt_ids(c)) for c in ctxs)
    if scoring == "hf":  # the separate HF pass, charged in full: each prompt once, every answer token but the last
        assert charged == prompts + answers - sum(len(c.admissible_actions) for c in ctxs)
    else:  # each prompt once (warm-up), then each answer row's own tokens (the prompt read from the cache)
        assert 0 < charged <= 2 * prompts + answers + len(ctxs) * 16 * 3


def test_probe_entropy_draws_from_vllm_and_charges_scoring(policy):
    ctxs = contexts()
    policy.decision_entropy_mode, policy.probe_samples = "probe", 4
    try:
        gen, score = policy.meter.gen_tokens, policy.meter.score_tokens
        values = policy.decision_entropy(ctxs)
    finally:
        policy.decision_entropy_mode = "exact"
    assert policy.meter.gen_tokens == gen and policy.meter.score_tokens > score
    assert all(0.0 <= v <= float(torch.log(torch.tensor(5.0))) + 1e-9 for v in values)


def test_vllm_scoring_needs_temperature_one():
    with pytest.raises(ValueError, match="temperature"):
        VLLMPolicy(tiny_model_path(), scoring="vllm", temperature=0.7)
