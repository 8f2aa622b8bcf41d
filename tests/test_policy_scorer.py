"""TextScorerPolicy and the ChoicePolicy contract: a distribution over the admissible actions
that sampling, entropy, the loss and the reference all agree on; behaviour cloning teaches it
the WebShop expert; checkpoints and copies keep it exactly."""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import bpo_envs  # noqa: F401
from baselines import RLOO
from bpo_algos import EnvPool
from bpo_algos.policy import Context
from bpo_algos.policy.scorer import TextScorerPolicy, hashed_ngrams, mentions
from bpo_algos.policy.sft import behaviour_cloning, demo_steps, expert_demos

RESULTS = (
    "Instruction: [SEP] i need a clear phone case [SEP] Back to Search [SEP] B01 [SEP] Red Wallet "
    "Case [SEP] $9.99 [SEP] B02 [SEP] Clear Slim Phone Case [SEP] $12.00"
)
ACTIONS = ("click[back to search]", "click[b01]", "click[b02]")


def _context(observation: str = RESULTS, actions: tuple[str, ...] = ACTIONS) -> Context:
    return Context("t0", observation, actions, initial_observation="i need a clear phone case")


def _webshop() -> gym.Env:
    return gym.make("BPO-WebShop-v0", max_episode_steps=10)


def test_mentions_are_the_text_after_each_argument_up_to_the_next():
    found = mentions(RESULTS, ACTIONS, 200)
    assert found[0] == " [SEP] "  # cut where the next argument (b01) is mentioned
    assert "Red Wallet Case" in found[1] and "B02" not in found[1] and "Clear Slim" not in found[1]
    assert "Clear Slim Phone Case" in found[2]
    assert mentions("nothing here", ("go north", "look"), 50) == ("", "")


def test_hashing_is_stable_and_bounded():
    ids = hashed_ngrams("Put a clean Apple in the fridge", 1000)
    assert ids == hashed_ngrams("put a clean apple in the fridge", 1000)
    assert len(ids) == 7 + 6 and all(0 <= i < 1000 for i in ids)


def test_distribution_sampling_entropy_and_loss_agree():
    policy = TextScorerPolicy(seed=3)
    context = _context()
    dist = policy.action_distribution(context)
    assert list(dist) == list(ACTIONS) and math.isclose(sum(dist.values()), 1.0, rel_tol=1e-6)
    [entropy] = policy.decision_entropy([context])
    assert entropy == pytest.approx(-sum(p * math.log(p) for p in dist.values()), rel=1e-5)

    [samples] = policy.sample([context], 4000, None)
    counts = {a: 0 for a in ACTIONS}
    for s in samples:
        assert s.command in ACTIONS and s.token_ids == (ACTIONS.index(s.command),)
        counts[s.command] += 1
    for a in ACTIONS:  # 4-sigma binomial bounds: false alarm < 1e-4 per action
        p = dist[a]
        assert abs(counts[a] / 4000 - p) < 4 * math.sqrt(p * (1 - p) / 4000)

    steps = [type("S", (), {"context": context, "action": s})() for s in samples[:5]]
    logp = policy.token_logprobs(steps)
    assert logp.shape == (5, 1) and logp.requires_grad
    assert torch.allclose(logp[:, 0], torch.tensor([s.logprobs[0] for s in samples[:5]]), atol=1e-5)
    assert torch.allclose(policy.reference_token_logprobs(steps), logp.detach())
    logp.sum().backward()
    assert policy.hidden.weight.grad is not None and policy.embedding.weight.grad.abs().sum() > 0


def test_same_seed_same_model_and_copies_are_independent():
    a, b = TextScorerPolicy(seed=7), TextScorerPolicy(seed=7)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(a.hidden.weight, TextScorerPolicy(seed=8).hidden.weight)
    clone = copy.deepcopy(a)
    with torch.no_grad():
        clone.hidden.weight.mul_(3.0)
    assert a.action_distribution(_context()) == b.action_distribution(_context())
    assert clone.action_distribution(_context()) != a.action_distribution(_context())
    restored = TextScorerPolicy(seed=0)
    restored.load_state_dict(a.state_dict())
    assert restored.action_distribution(_context()) == a.action_distribution(_context())


def test_bad_input_names_the_problem():
    policy = TextScorerPolicy()
    with pytest.raises(ValueError, match="admissible actions"):
        policy.sample([Context("t", "free text only", None)], 1, None)
    with pytest.raises(ValueError, match="n must be"):
        policy.sample([_context()], 0, None)
    with pytest.raises(ValueError, match="buckets"):
        TextScorerPolicy(buckets=0)
    assert policy.recorded_action(_context(), "click[b99]") is None


def test_behaviour_cloning_teaches_the_webshop_expert():
    env = _webshop()
    tasks = list(env.unwrapped.task_ids())[:24]
    env.close()
    demos = expert_demos(_webshop, tasks, seed=0)
    policy = TextScorerPolicy(seed=0)
    steps = demo_steps(policy, demos)
    # under the default search_actions="instruction" the expert searches one of the listed
    # phrases of the instruction, so every expert step is one the choice policy can take
    assert 0 < len(steps) == len(demos)

    def expert_logp() -> float:
        with torch.no_grad():
            return float(policy.token_logprobs(steps).mean())

    before = expert_logp()
    torch.manual_seed(0)
    losses = behaviour_cloning(policy, demos, epochs=8, lr=3e-3, seed=0)
    assert losses[-1] < losses[0] and expert_logp() > before + 0.5

    pool = EnvPool([_webshop] * 2)
    try:
        uniform = RLOO(group_size=4, seed=1).collect(TextScorerPolicy(seed=0), pool, tasks).success_rate()
        cloned = RLOO(group_size=4, seed=1).collect(policy, pool, tasks).success_rate()
    finally:
        pool.close()
    # 96 episodes each: the cloned policy buys the right product far more often than chance
    assert cloned > uniform + 0.1, (uniform, cloned)
    assert np.isfinite(cloned)


def test_a_checkpoint_with_a_reference_loads_into_a_fresh_policy():
    """With a KL term the reference is made on first use and saved with the weights; a resumed
    run must get that reference back, not a new one from the trained weights."""
    policy = TextScorerPolicy(seed=1)
    policy.set_reference()
    with torch.no_grad():
        policy.hidden.weight.mul_(3.0)  # training moves the policy away from its reference
    fresh = TextScorerPolicy(seed=2)
    fresh.load_state_dict(policy.state_dict())
    for name, value in policy.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name
    [samples] = policy.sample([_context()], 3, None)
    steps = [type("S", (), {"context": _context(), "action": s})() for s in samples]
    assert torch.equal(fresh.reference_token_logprobs(steps), policy.reference_token_logprobs(steps))
    assert not torch.equal(fresh.reference_token_logprobs(steps), fresh.token_logprobs(steps).detach())


def test_categorical_draws_are_rng_choice_draws():
    """The sampler's inverse-CDF draws equal ``rng.choice(k, size=n, p=p)`` draw for draw and
    leave the generator in the same state, on distributions from flat to nearly one-hot; bad
    probabilities still raise rng.choice's error."""
    from bpo_algos.policy.choice import categorical_draws

    for t in range(3000):
        r = np.random.default_rng(t)
        k, n = int(r.integers(1, 60)), int(r.integers(1, 5))
        logits = r.normal(size=k) * float(r.choice([0.1, 1.0, 5.0, 40.0]))
        p = np.exp(logits - logits.max())
        p = p / p.sum()
        a, b = np.random.default_rng([t, 1]), np.random.default_rng([t, 1])
        assert np.array_equal(a.choice(k, size=n, p=p), categorical_draws(p, n, b))
        assert a.bit_generator.state == b.bit_generator.state
    with pytest.raises(ValueError):
        categorical_draws(np.array([0.5, np.nan]), 1, np.random.default_rng(0))


def test_categorical_rows_are_each_rows_categorical_draws():
    """All rows at once draw what the per-row loop drew (``categorical_draws(row / row.sum())``
    from each row's generator, row after row), and leave every generator in the same state:
    rows of 1 to 70 entries, flat to nearly one-hot, unnormalised, one shared generator or one
    each; a row that is not a distribution still raises rng.choice's error."""
    from bpo_algos.policy.choice import categorical_draws, categorical_rows

    for t in range(400):
        r = np.random.default_rng([t, 7])
        m, n = int(r.integers(1, 30)), int(r.integers(1, 6))
        sizes = r.integers(1, 71, size=m)
        probs = np.exp(r.normal(size=int(sizes.sum())) * float(r.choice([0.1, 1.0, 5.0, 40.0])) - 3.0)
        shared = bool(r.integers(2))
        rngs_a = [np.random.default_rng([t, 0])] * m if shared else [np.random.default_rng([t, i]) for i in range(m)]
        rngs_b = [np.random.default_rng([t, 0])] * m if shared else [np.random.default_rng([t, i]) for i in range(m)]
        before, start = [], 0
        for size, rng in zip(sizes.tolist(), rngs_a, strict=True):
            row = probs[start : start + size]
            before.append(categorical_draws(row / row.sum(), n, rng).tolist())
            start += size
        assert categorical_rows(probs, sizes, n, rngs_b) == before
        assert [a.bit_generator.state for a in rngs_a] == [b.bit_generator.state for b in rngs_b]
    # the comparison can fail: the rows' generators swapped draw otherwise
    probs, sizes = np.ones(40), np.array([20, 20])
    rows = categorical_rows(probs, sizes, 8, [np.random.default_rng(1), np.random.default_rng(2)])
    assert rows != categorical_rows(probs, sizes, 8, [np.random.default_rng(2), np.random.default_rng(1)])
    assert all(0 <= j < 20 for row in rows for j in row)  # never past its row (the padding's cdf is 1)
    with pytest.raises(ValueError):
        categorical_rows(np.array([0.5, 0.5, np.nan]), np.array([2, 1]), 1, [np.random.default_rng(0)] * 2)


def _sample_as_before(policy: TextScorerPolicy, contexts: list[Context], n: int, rngs: list | None) -> list[list]:
    """``ChoicePolicy.sample`` as it was before the rows were drawn together (git 6d6f922): a
    loop over the contexts."""
    from bpo_algos.policy.base import Action
    from bpo_algos.policy.choice import categorical_draws, context_key

    out = []
    for i, (context, lp) in enumerate(zip(contexts, policy._log_probs_no_grad(contexts), strict=True)):
        logp = lp.numpy().astype(np.float64)
        probs = np.exp(logp)
        picks = categorical_draws(probs / probs.sum(), n, policy._rng if rngs is None else rngs[i])
        prompt = (context_key(context.observation),)
        out.append([Action(context.admissible_actions[j], (int(j),), (float(logp[j]),), None, prompt, index=int(j)) for j in picks])
    return out


def test_sample_draws_what_the_loop_over_contexts_drew():
    """The samples, their log-probs and the meter of one ``sample`` over many WebShop contexts
    equal the loop before, with per-context generators and with the policy's own; another
    temperature samples otherwise (the comparison can fail)."""
    contexts = [d.context for d in expert_demos(_webshop, list(range(12)), seed=0) if d.context.admissible_actions]
    assert len(contexts) > 20
    for n in (1, 4):
        a, b = TextScorerPolicy(seed=3, temperature=1.5), TextScorerPolicy(seed=3, temperature=1.5)
        for _ in range(3):
            rngs_a = None if n == 4 else [np.random.default_rng([5, i]) for i in range(len(contexts))]
            rngs_b = None if n == 4 else [np.random.default_rng([5, i]) for i in range(len(contexts))]
            tokens = a.meter.gen_tokens, a.meter.prefill_tokens
            assert a.sample(contexts, n, rngs_a) == _sample_as_before(b, contexts, n, rngs_b)
            assert (a.meter.gen_tokens - tokens[0], a.meter.prefill_tokens - tokens[1]) == (
                n * len(contexts), sum(1 + len(c.admissible_actions) for c in contexts))
    hot = TextScorerPolicy(seed=3, temperature=9.0)
    assert hot.sample(contexts, 4, None) != _sample_as_before(TextScorerPolicy(seed=3, temperature=1.5), contexts, 4, None)


def test_plain_scorer_inputs_are_derived_once_and_score_as_before():
    """Without memory features a context's inputs are a function of its texts, kept across
    calls and context objects: the scores equal the derivation per context before (git
    6d6f922), on a first and a second pass; a policy with other ``history`` scores otherwise."""
    from bpo_algos.policy.scorer import _derive_inputs

    contexts = [d.context for d in expert_demos(_webshop, list(range(8)), seed=0) if d.context.admissible_actions]
    policy = TextScorerPolicy(seed=4)

    def before(c: Context):
        recent = tuple(turn.action for turn in c.history[len(c.history) - policy.history :])
        return _derive_inputs(c.initial_observation or c.observation, c.observation, c.admissible_actions, recent,
                              policy.max_chars, policy.mention_chars, policy.buckets)

    with torch.no_grad():
        for _ in range(2):
            now = policy.scores(contexts)
            policy._inputs = before  # type: ignore[method-assign]  # derived afresh, nothing kept
            assert all(torch.equal(x, y) for x, y in zip(now, policy.scores(contexts), strict=True))
            del policy._inputs
        other = TextScorerPolicy(seed=4, history=1)
        assert not all(torch.equal(x, y) for x, y in zip(now, other.scores(contexts), strict=True))


def test_fast_hashing_and_mentions_equal_their_plain_definitions():
    """The n-gram ids (hashed through ``map``) and the mentions (cut by bisection) equal the
    per-gram loop and the linear scan they replace, on random texts."""
    import re
    import zlib

    word = re.compile(r"[a-z0-9]+")

    def plain_ids(text: str, buckets: int) -> tuple[int, ...]:
        words = word.findall(text.lower())
        grams = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
        return tuple(zlib.crc32(g.encode()) % buckets for g in grams)

    def plain_mentions(observation: str, actions: tuple[str, ...], max_chars: int) -> tuple[str, ...]:
        lowered, found, starts = observation.lower(), {}, []
        for i, action in enumerate(actions):
            m = re.match(r"^\s*[\w ]+\[(.+)\]\s*$", action, re.DOTALL)
            arg = m.group(1).strip().lower() if m else None
            if arg and lowered.find(arg) >= 0:
                found[i] = lowered.find(arg) + len(arg)
                starts.append(lowered.find(arg))
        starts.sort()
        return tuple(observation[found[i]: min(next((s for s in starts if s >= found[i]), len(observation)), found[i] + max_chars)]
                     if i in found else "" for i in range(len(actions)))

    rng = np.random.default_rng(0)
    vocab = ["red", "Shoe", "b0", "b01", "size 9", "ünï", "42", "a-b", "[SEP]", "$9.99", "x"]
    for _ in range(300):
        text = " ".join(rng.choice(vocab, size=int(rng.integers(0, 80))))
        for buckets in (7, 1 << 15):
            assert hashed_ngrams.__wrapped__(text, buckets) == plain_ids(text, buckets)
        actions = tuple(f"click[{w.lower()}]" for w in rng.choice(vocab, size=int(rng.integers(1, 6))))
        assert mentions.__wrapped__(text, actions, 30) == plain_mentions(text, actions, 30)



def _per_step(policy: TextScorerPolicy, steps: list) -> torch.Tensor:
    """The recorded actions' log-probs as they were taken before: a select per step, stacked."""
    all_logp = policy.log_probs_of([s.context for s in steps])
    return torch.stack([lp[s.action.index] for lp, s in zip(all_logp, steps, strict=True)]).unsqueeze(-1)


def test_token_logprobs_are_the_per_step_selections_bit_for_bit():
    """The loss's log-probs, gathered from the concatenated rows, equal a select per step, values
    and gradients bit for bit (so training is unchanged)."""
    env = _webshop()
    tasks = list(env.unwrapped.task_ids())[:4]
    env.close()
    pool = EnvPool([_webshop] * 2)
    try:
        policy = TextScorerPolicy(seed=3)
        steps = RLOO(group_size=3, seed=2).collect(policy, pool, tasks).steps
    finally:
        pool.close()
    assert len(steps) > 10 and len({len(s.context.admissible_actions) for s in steps}) > 1
    weights = torch.linspace(-1.0, 2.0, len(steps))

    def grads(logp: torch.Tensor) -> list[torch.Tensor]:
        policy.zero_grad(set_to_none=True)
        (logp.squeeze(-1) * weights).sum().backward()
        return [p.grad.clone() for p in policy.parameters()]

    assert torch.equal(policy.token_logprobs(steps), _per_step(policy, steps))
    new, old = grads(policy.token_logprobs(steps)), grads(_per_step(policy, steps))
    assert all(torch.equal(a, b) for a, b in zip(new, old, strict=True))
    assert any(g.abs().sum() > 0 for g in new)
    assert policy.token_logprobs([]).shape == (0, 1)
