"""HFPolicy on the tiny offline Qwen2 model: logprobs, prefix sharing, entropy, LoRA, meter, BPO."""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium as gym
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

import bpo_envs  # noqa: E402,F401
from bpo_algos.policy import Action, Context, HFPolicy  # noqa: E402
from bpo_algos.policy.tiny import tiny_model_path  # noqa: E402
from bpo_envs.prompting import format_action  # noqa: E402

ATOL = 1e-3  # float32 sums over differently padded batches differ by ~2e-4 under load


@dataclass
class Step:
    context: Context
    action: Action


@pytest.fixture(scope="module")
def tiny_path():
    return tiny_model_path()


@pytest.fixture(scope="module")
def policy(tiny_path):
    return HFPolicy(tiny_path, max_new_tokens=10, seed=0)


def tree_contexts(depth: int = 3, n_actions: int = 3, walk=("a1", "a0")) -> list[Context]:
    env = gym.make("BPO-TreeMDP-v0", depth=depth, n_actions=n_actions, seed=1)
    obs, info = env.reset(seed=0)
    context = Context(info["task_id"], obs, tuple(info["admissible_actions"]), initial_observation=obs)
    out = [context]
    for action in walk:
        obs, _, _, _, info = env.step(action)
        context = context.child(action, obs, info["admissible_actions"])
        out.append(context)
    return out


def full_logits(policy: HFPolicy, ids) -> torch.Tensor:
    """Next-token logits at every position of ``ids``, one plain forward pass (no cache)."""
    with torch.no_grad():
        return policy.model(input_ids=torch.tensor([list(ids)])).logits[0].float()


def brute_sequence_logprob(policy: HFPolicy, prompt, answer) -> float:
    logp = torch.log_softmax(full_logits(policy, (*prompt, *answer)) / policy.temperature, -1)
    return float(sum(logp[len(prompt) - 1 + t, tok] for t, tok in enumerate(answer)))


def test_sampled_logprobs_equal_teacher_forced_token_logprobs(policy):
    contexts = tree_contexts()
    samples = policy.sample(contexts, 3, None)
    steps = [Step(c, a) for c, row in zip(contexts, samples, strict=True) for a in row]
    logp = policy.token_logprobs(steps)
    assert logp.requires_grad and logp.shape == (len(steps), max(len(s.action.token_ids) for s in steps))
    for i, step in enumerate(steps):
        n = len(step.action.token_ids)
        assert step.action.prompt_token_ids == policy.prompt_ids(step.context)
        assert len(step.action.logprobs) == n
        assert torch.allclose(logp[i, :n].detach(), torch.tensor(step.action.logprobs), atol=ATOL)
        assert torch.all(logp[i, n:] == 0)
        # and a third, independent computation: one unbatched forward pass
        brute = brute_sequence_logprob(policy, step.action.prompt_token_ids, step.action.token_ids)
        assert math.isclose(step.action.logprob, brute, abs_tol=ATOL * n)
    logp.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())
    policy.model.zero_grad(set_to_none=True)


def test_prompt_ids_are_the_chat_template_and_recorded_on_actions(policy):
    context = tree_contexts()[2]
    text = policy.tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    ids = policy.prompt_ids(context)
    decoded = policy.tokenizer.decode(list(ids))
    assert decoded.endswith("<|im_start|>assistant\n") and context.observation in decoded
    assert "Step 2 action: a0" in decoded
    assert policy.prompts.action_ids("a1")[-1] == policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert policy.tokenizer.decode(list(policy.prompts.action_ids("a1")[:-1])) == format_action("a1")


def test_tiny_tokenizer_reloads_exactly(tiny_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    raw = Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(tiny_path)
    for text in [
        "tree 12 node root/a3/a0 (depth 2 of 5). Actions: a0, a1, a2, a3",
        "Invalid action 'go north': choose one of a0, a1.\n<action>a1</action>",
        "héllo ﬁ 😀 \t\r\n $(rm -rf /) 1234567 ΑΒΓ",
    ]:
        ids = auto(text, add_special_tokens=False)["input_ids"]
        assert ids == raw.encode(text, add_special_tokens=False).ids
        assert auto.decode(ids) == text


def test_shared_prefix_greedy_outputs_equal_recomputation(policy):
    contexts = tree_contexts()
    shared = policy.generate(contexts, 3, share_prefix=True, greedy=True)
    fresh = policy.generate(contexts, 3, share_prefix=False, greedy=True)
    for a_row, b_row in zip(shared, fresh, strict=True):
        assert len({a.token_ids for a in a_row}) == 1  # greedy: the n rows agree
        for a, b in zip(a_row, b_row, strict=True):
            assert a.token_ids == b.token_ids and a.text == b.text
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=ATOL)


def _chi2_pvalue(stat: float, dof: int) -> float:
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)))


def test_shared_prefix_sampling_has_the_exact_two_token_distribution(tiny_path):
    """Seeded: 400 two-token answers with and without prefix sharing vs the exact distribution."""
    n = 400
    policy = HFPolicy(tiny_path, max_new_tokens=2, seed=11, batch_size=n)
    context = tree_contexts()[1]
    prompt = policy.prompt_ids(context)
    first = torch.softmax(full_logits(policy, prompt)[-1], -1)
    exact: dict[tuple[int, ...], float] = {}
    for t1 in torch.nonzero(first * n >= 5).flatten().tolist():  # rarer pairs fall in "other"
        if t1 in policy.stop_token_ids:
            exact[(t1,)] = float(first[t1])
            continue
        second = torch.softmax(full_logits(policy, (*prompt, t1))[-1], -1)
        for t2 in torch.nonzero(first[t1] * second * n >= 5).flatten().tolist():
            exact[(t1, t2)] = float(first[t1] * second[t2])
    for share in (True, False):
        answers = [a.token_ids for a in policy.generate([context], n, share_prefix=share)[0]]
        bins = {k: p for k, p in exact.items() if p * n >= 5}
        observed = [sum(a == k for a in answers) for k in bins]
        expected = [p * n for p in bins.values()]
        observed.append(n - sum(observed))
        expected.append(n - sum(expected))
        stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
        assert len(bins) >= 3
        assert _chi2_pvalue(stat, len(observed) - 1) > 1e-3, (share, observed, expected)


def test_decision_entropy_equals_brute_force_over_admissible_actions(tiny_path):
    policy = HFPolicy(tiny_path, temperature=0.7, seed=0)
    contexts = tree_contexts(depth=4, n_actions=5, walk=("a4", "a2", "a0"))
    free = Context("t", "Describe what you see.", None, initial_observation="Describe what you see.")
    values = policy.decision_entropy([*contexts, free])
    for context, value in zip(contexts, values[:-1], strict=True):
        prompt = policy.prompt_ids(context)
        seq = torch.tensor([brute_sequence_logprob(policy, prompt, policy.prompts.action_ids(a)) for a in context.admissible_actions], dtype=torch.float64)
        logp = seq - torch.logsumexp(seq, 0)
        assert math.isclose(value, float(-(logp.exp() * logp).sum()), abs_tol=ATOL)
        dist = policy.action_distribution(context)
        assert torch.allclose(torch.tensor(list(dist.values()), dtype=torch.float64), logp.exp(), atol=ATOL)
    opened = (*policy.prompt_ids(free), *policy.prompts.encode("<action>"))
    logp = torch.log_softmax(full_logits(policy, opened)[-1] / 0.7, -1)
    assert math.isclose(values[-1], float(-(logp.exp() * logp).sum()), abs_tol=ATOL)
    assert 0 < min(values[:-1]) and max(values[:-1]) <= math.log(5) + 1e-9


def test_meter_counts_and_prefill_reuse_between_entropy_and_sample(tiny_path):
    policy = HFPolicy(tiny_path, max_new_tokens=6, seed=0, prefix_store_tokens=0)  # per decision
    contexts = tree_contexts()
    lengths = [len(policy.prompt_ids(c)) for c in contexts]
    before = policy.meter.copy()
    samples = policy.generate(contexts, 4, share_prefix=False)
    assert policy.meter.prefill_tokens - before.prefill_tokens == 4 * sum(lengths)
    assert policy.meter.gen_tokens - before.gen_tokens == sum(len(a.token_ids) for r in samples for a in r)

    policy.decision_entropy(contexts)
    after_entropy = policy.meter.copy()
    scored = sum(len(policy.prompts.action_ids(a)) - 1 for c in contexts for a in c.admissible_actions)
    # the entropy pass is scoring: prompt + candidate tokens in score_tokens, none in prefill
    assert after_entropy.prefill_tokens - before.prefill_tokens == 4 * sum(lengths)
    assert after_entropy.score_tokens - before.score_tokens == sum(lengths) + scored
    assert after_entropy.policy_tokens == after_entropy.gen_tokens + after_entropy.prefill_tokens + after_entropy.score_tokens
    samples = policy.sample(contexts, 4, None)  # reuses the entropy pass's prompt KV: no prefill
    assert policy.meter.prefill_tokens == after_entropy.prefill_tokens
    assert policy.meter.policy_calls == after_entropy.policy_calls + 1 == 2
    steps = [Step(c, a) for c, row in zip(contexts, samples, strict=True) for a in row]
    assert torch.allclose(policy.token_logprobs(steps).detach(), _old(steps), atol=ATOL)
    policy.sample(contexts, 2, None)  # the store was consumed: prefill once per prompt
    assert policy.meter.prefill_tokens == after_entropy.prefill_tokens + sum(lengths)
    across = HFPolicy(tiny_path, max_new_tokens=6, seed=0, prefix_store_tokens=16384)  # kept across decisions
    across.decision_entropy(contexts)
    across.sample(contexts, 2, None)
    across.sample(contexts, 2, None)
    assert across.meter.prefill_tokens == 0
    across.token_logprobs(steps)  # the loss drops the store (an update follows)
    across.sample(contexts, 2, None)
    assert 0 < across.meter.prefill_tokens <= sum(lengths)


def _old(steps) -> torch.Tensor:
    from bpo_algos.policy import pad_token_rows

    return pad_token_rows([torch.tensor(s.action.logprobs) for s in steps])


def test_lora_reference_logprobs_equal_the_base_model(tiny_path):
    base = HFPolicy(tiny_path, max_new_tokens=8, seed=0)
    tuned = HFPolicy(tiny_path, max_new_tokens=8, seed=0, lora=True)
    names = [n for n, p in tuned.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in tuned.trainable_parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    contexts = tree_contexts()
    samples = tuned.sample(contexts, 2, None)
    steps = [Step(c, a) for c, row in zip(contexts, samples, strict=True) for a in row]
    logp = tuned.token_logprobs(steps)
    ref = tuned.reference_token_logprobs(steps)
    assert not ref.requires_grad
    assert torch.allclose(ref, base.token_logprobs(steps).detach(), atol=ATOL)
    assert (logp.detach() - ref).abs().max() > 1e-2  # the adapter does change the policy
    assert torch.allclose(logp.detach(), _old(steps), atol=ATOL)


def test_full_finetune_reference_is_a_frozen_copy(tiny_path):
    policy = HFPolicy(tiny_path, max_new_tokens=6, seed=0)
    contexts = tree_contexts()
    steps = [Step(c, a) for c, row in zip(contexts, policy.sample(contexts, 2, None), strict=True) for a in row]
    policy.set_reference()
    before = policy.token_logprobs(steps).detach()
    with torch.no_grad():
        policy.model.model.embed_tokens.weight.mul_(1.5)
    assert torch.allclose(policy.reference_token_logprobs(steps), before, atol=ATOL)
    assert (policy.token_logprobs(steps).detach() - before).abs().max() > 1e-2
    # a checkpoint saved with the reference loads into a fresh policy and keeps that reference
    fresh = HFPolicy(tiny_path, max_new_tokens=6, seed=1)
    fresh.load_state_dict(policy.state_dict())
    assert torch.allclose(fresh.reference_token_logprobs(steps), before, atol=ATOL)


def test_random_model_output_is_an_invalid_action_in_the_env(policy):
    env = gym.make("BPO-TreeMDP-v0", depth=2, n_actions=3, seed=0)
    obs, info = env.reset(seed=0)
    context = Context(info["task_id"], obs, tuple(info["admissible_actions"]), initial_observation=obs)
    policy.seed(5)
    actions = policy.sample([context], 6, None)[0]
    malformed = [a for a in actions if policy.prompts.config.action_open not in a.text]
    assert malformed, "the untrained tiny model should babble"
    for action in malformed:
        assert action.env_action == action.text
        env.reset(seed=0)
        out, reward, terminated, _, info = env.step(action.command)
        assert info["invalid_action"] is True and reward == 0.0 and not terminated
        assert out.startswith("Invalid action")


def test_bad_arguments_are_clear_errors(tiny_path, policy):
    with pytest.raises(ValueError, match="temperature"):
        HFPolicy(tiny_path, temperature=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        HFPolicy(tiny_path, max_new_tokens=0)
    with pytest.raises(ValueError, match="n must be"):
        policy.sample(tree_contexts()[:1], 0, None)
    with pytest.raises(ValueError, match="tokenizer"):
        HFPolicy(policy.model)


def test_lazy_import_keeps_bpo_algos_free_of_transformers():
    import subprocess
    import sys

    code = "import sys, bpo_algos, baselines; assert 'transformers' not in sys.modules and 'peft' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
