"""HFPolicy's prompt KV store across decisions (docs/training.md, "Prompt KV cache"): the same
samples, log-probs and entropies as prefilling every prompt whole, only the new tokens metered,
and a bounded store."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from prompt_support import webshop_like_path  # noqa: E402

import bpo_envs  # noqa: E402,F401
from bpo_algos.policy import Context, HFPolicy, PromptConfig  # noqa: E402
from bpo_algos.policy.prefix_store import PrefixStore, common_prefix_length  # noqa: E402
from bpo_algos.policy.tiny import tiny_model_path  # noqa: E402

ATOL = 1e-3  # float32 sums over differently padded batches differ by ~2e-4 under load


class Entry:
    def __init__(self, ids):
        self.ids = tuple(ids)


def test_common_prefix_length():
    assert common_prefix_length((1, 2, 3), (1, 2, 3, 4)) == 3
    assert common_prefix_length((1, 2, 3), (1, 5, 3)) == 1
    assert common_prefix_length((), (1,)) == 0
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = tuple(rng.integers(0, 3, size=rng.integers(0, 12)))
        b = tuple(rng.integers(0, 3, size=rng.integers(0, 12)))
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert common_prefix_length(a, b) == k


def test_store_finds_the_longest_common_prefix_and_evicts_least_recently_used():
    store = PrefixStore(max_tokens=10)
    store.put(Entry((1, 2, 3)))
    store.put(Entry((1, 2, 4, 5)))
    entry, k = store.longest_prefix((1, 2, 4, 9))
    assert entry.ids == (1, 2, 4, 5) and k == 3
    assert store.longest_prefix((7,)) == (None, 0)
    store.get((1, 2, 3))  # refreshed: (1, 2, 4, 5) is now the least recently used
    store.put(Entry((6, 6, 6, 6)))  # 11 tokens > 10
    assert (1, 2, 4, 5) not in store and (1, 2, 3) in store and store.tokens == 7 and store.evictions == 1
    store.put(Entry(range(11)))  # longer than the cap: not kept
    assert len(store) == 2 and store.tokens <= store.max_tokens


def _tree_steps():
    """A walk of the tree env and, at depth 2, three siblings (a fork) each taking one more step:
    the contexts of consecutive decisions, as the engine asks for them."""
    env = gym.make("BPO-TreeMDP-v0", depth=5, n_actions=3, seed=1)
    obs, info = env.reset(seed=0)
    context = Context(info["task_id"], obs, tuple(info["admissible_actions"]), initial_observation=obs)
    steps = [[context]]
    for action in ("a1", "a0"):
        obs, _, _, _, info = env.step(action)
        context = context.child(action, obs, info["admissible_actions"])
        steps.append([context])
    snap = bpo_envs.snapshot(env)
    siblings = []
    for action in ("a0", "a1", "a2"):
        bpo_envs.restore(env, snap)
        obs, _, _, _, info = env.step(action)
        siblings.append((context.child(action, obs, info["admissible_actions"]), bpo_envs.snapshot(env)))
    steps.append([c for c, _ in siblings])
    grandchildren = []
    for c, s in siblings:
        bpo_envs.restore(env, s)
        obs, _, _, _, info = env.step("a1")
        grandchildren.append(c.child("a1", obs, info["admissible_actions"]))
    steps.append(grandchildren)
    return steps


@pytest.fixture(scope="module")
def tiny_path():
    return tiny_model_path()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Two torch threads on a loaded 2-core machine spin-wait for each other (several times the
    wall-clock); these passes are tiny."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(policy: HFPolicy, steps, n: int = 3):
    out = []
    for t, contexts in enumerate(steps):
        h = policy.decision_entropy(contexts)
        rngs = [np.random.default_rng([t, i]) for i in range(len(contexts))]
        out.append((h, policy.sample(contexts, n, rngs)))
    return out


def _assert_same(a, b):
    for (h_a, s_a), (h_b, s_b) in zip(a, b, strict=True):
        assert np.allclose(h_a, h_b, atol=ATOL)
        for row_a, row_b in zip(s_a, s_b, strict=True):
            for x, y in zip(row_a, row_b, strict=True):
                assert x.token_ids == y.token_ids and x.prompt_token_ids == y.prompt_token_ids
                assert np.allclose(x.logprobs, y.logprobs, atol=ATOL)


def test_store_across_decisions_gives_the_same_samples_and_prefills_only_new_tokens(tiny_path):
    steps = _tree_steps()
    on = HFPolicy(tiny_path, max_new_tokens=8, seed=0, prefix_store_tokens=16384)
    off = HFPolicy(tiny_path, max_new_tokens=8, seed=0, prefix_store_tokens=0)
    assert on.across_decisions and not off.across_decisions
    _assert_same(_run(on, steps), _run(off, steps))

    # the meter: off prefills every prompt whole (once per decision, in the entropy pass);
    # on, only what follows the longest common prefix with a prompt of an earlier step
    prompts = [[on.prompt_ids(c) for c in contexts] for contexts in steps]
    scored = sum(len(on.prompts.action_ids(a)) - 1 for contexts in steps for c in contexts for a in c.admissible_actions)
    assert off.meter.score_tokens == sum(len(p) for ps in prompts for p in ps) + scored
    # from earlier steps only: what is left once each prompt reuses its longest kept prefix
    after_earlier = 0
    for t, ps in enumerate(prompts):
        earlier = [q for qs in prompts[:t] for q in qs]
        for p in ps:
            kept = max((common_prefix_length(p, q) for q in earlier), default=0)
            after_earlier += len(p) - min(kept, len(p) - 1)
    # the fork's siblings also share their common stem with each other (prefilled once), and
    # nothing can run fewer tokens than the distinct prefixes of all the prompts
    distinct = len({p[:i] for ps in prompts for p in ps for i in range(1, len(p) + 1)})
    assert distinct <= on.meter.score_tokens - scored < after_earlier
    assert on.meter.prefill_tokens == off.meter.prefill_tokens == 0  # sample reuses the entropy pass's KV
    assert on.meter.gen_tokens == off.meter.gen_tokens


def test_a_wrong_kept_prefix_is_caught(tiny_path, monkeypatch):
    """The broken case the comparison above must catch: a store that claims more shared tokens
    than there are (reusing KV computed for different tokens) changes the entropies."""
    steps = _tree_steps()
    off = HFPolicy(tiny_path, max_new_tokens=8, seed=0, prefix_store_tokens=0)
    bad = HFPolicy(tiny_path, max_new_tokens=8, seed=0, prefix_store_tokens=16384)
    real = PrefixStore.longest_prefix

    def overclaim(self, ids):
        entry, k = real(self, ids)
        return entry, (min(k + 4, len(entry.ids)) if entry is not None else 0)

    monkeypatch.setattr(PrefixStore, "longest_prefix", overclaim)
    with pytest.raises(AssertionError):
        _assert_same(_run(bad, steps), _run(off, steps))


def test_a_capped_store_stays_bounded_and_exact(tiny_path):
    steps = _tree_steps()
    off = HFPolicy(tiny_path, max_new_tokens=8, seed=0, prefix_store_tokens=0)
    cap = max(len(off.prompt_ids(c)) for contexts in steps for c in contexts) + 10
    small = HFPolicy(tiny_path, max_new_tokens=8, seed=0, prefix_store_tokens=cap)
    _assert_same(_run(small, steps), _run(off, steps))
    assert 0 < small._store.tokens <= cap and small._store.evictions > 0


def test_a_weight_update_drops_the_kept_prompts(tiny_path):
    steps = _tree_steps()
    on = HFPolicy(tiny_path, max_new_tokens=8, seed=0, prefix_store_tokens=16384)
    off = HFPolicy(tiny_path, max_new_tokens=8, seed=0, prefix_store_tokens=0)
    _run(on, steps[:2])
    with torch.no_grad():
        for p in (on, off):
            p.model.get_input_embeddings().weight.mul_(1.5)  # an in-place update, as an optimizer's
    score = on.meter.score_tokens
    _assert_same(_run(on, steps[2:3]), _run(off, steps[2:3]))
    prompts = [on.prompt_ids(c) for c in steps[2]]
    scored = sum(len(on.prompts.action_ids(a)) - 1 for c in steps[2] for a in c.admissible_actions)
    assert on.meter.score_tokens - score == sum(len(p) for p in prompts) + scored  # all prefilled anew


def test_prefill_batches_bound_padding(tiny_path):
    policy = HFPolicy(tiny_path, max_new_tokens=8, seed=0, batch_size=3)
    assert policy._batches([10, 10, 12, 100, 100, 100, 100]) == [[0, 1, 2], [3, 4, 5], [6]]
    batches = policy._batches([5, 400, 7, 300, 8])  # unsorted: still in order, padding bounded
    assert [i for b in batches for i in b] == list(range(5))
    lengths = [5, 400, 7, 300, 8]
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 1.25 * sum(lengths[i] for i in b)


def test_the_turns_layout_prefills_each_steps_new_turn_only(tiny_path):
    """With ``PromptConfig(layout="turns")`` a path's next prompt extends its last one
    (bpo_envs.prompting), so the store runs only the new turn: the same samples as without the
    store, and fewer prompt tokens scored than the default layout with the store on the same
    contexts; the broken case, the default layout, relabels the current observation once it is
    past and so prefills from there on."""
    path = [[c] for c in webshop_like_path(5, seed=5)]
    turns = PromptConfig(layout="turns")
    on = HFPolicy(tiny_path, max_new_tokens=8, seed=0, prefix_store_tokens=16384, prompt=turns)
    off = HFPolicy(tiny_path, max_new_tokens=8, seed=0, prefix_store_tokens=0, prompt=turns)
    summary = HFPolicy(tiny_path, max_new_tokens=8, seed=0, prefix_store_tokens=16384)
    _assert_same(_run(on, path), _run(off, path))
    _run(summary, path)
    scored = sum(len(on.prompts.action_ids(a)) - 1 for (c,) in path for a in c.admissible_actions)
    ran_turns, ran_summary = on.meter.score_tokens - scored, summary.meter.score_tokens - scored
    prompts = [on.prompt_ids(c) for (c,) in path]
    # each step runs exactly what follows its common prefix with the previous step's prompt:
    # its action, its observation, its admissible actions and the instruction
    new_turns = [len(p) - common_prefix_length(p, q) for q, p in zip(prompts, prompts[1:], strict=False)]
    assert ran_turns == len(prompts[0]) + sum(new_turns)
    assert ran_turns < 0.7 * ran_summary, (ran_turns, ran_summary)
