"""The ALFWorld warm start's reuse: expert demos kept on disk, the scorer's inputs derived once
across cloning epochs, the handcoded expert's trace kept as the engine's objects. Each gives the
same demos, weights and expert actions as the path it replaces (docs/main-job.md, "What the
default costs on idle cores")."""

from __future__ import annotations

import gzip
import json
from contextlib import nullcontext
from pathlib import Path

import pytest
from alfworld_support import private_cache

pytest.importorskip("fast_downward", reason="run bpo-gym-setup alfworld")
pytest.importorskip("textworld", reason="run bpo-gym-setup alfworld")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import bpo_experiments.demo_cache as demo_cache  # noqa: E402
from bpo_algos.policy.episode_memory import context_features  # noqa: E402
from bpo_algos.policy.scorer import TextScorerPolicy, _bag_ids, _candidates  # noqa: E402
from bpo_algos.policy.sft import Demo, behaviour_cloning, demo_steps, expert_demos  # noqa: E402
from bpo_envs.alfworld import ALFWorldEnv  # noqa: E402
from bpo_experiments.demo_cache import cached_expert_demos, demos_data, demos_from_data  # noqa: E402
from bpo_experiments.runner import state_digest  # noqa: E402

KWARGS = {"games_per_type": 2, "expert": "handcoded", "max_episode_steps": 50}
TASKS = ["pick_and_place_simple/0001", "pick_clean_then_place_in_recep/0001", "look_at_obj_in_light/0001"]


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    with private_cache(tmp_path_factory, "alfworld-warm-start-cache"):
        yield


def make() -> gym.Env:
    return gym.make("BPO-ALFWorld-v0", **KWARGS)


@pytest.fixture(scope="module")
def demos() -> list[Demo]:
    return expert_demos(make, TASKS, seed=0)


def test_demos_are_kept_on_disk_and_read_back_equal(demos: list[Demo], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(demos) > 10 and sum(not d.context.history for d in demos) == len(TASKS)
    first = cached_expert_demos("BPO-ALFWorld-v0", KWARGS, make, TASKS, 0, seedless=True, folder=tmp_path)
    assert first == demos
    files = list(tmp_path.glob("*.json.gz"))
    assert len(files) == 1

    def no_collection(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demos were collected again")

    monkeypatch.setattr(demo_cache, "expert_demos", no_collection)
    # another seed of a seedless expert reads the same file: the same demos, context for context
    again = cached_expert_demos("BPO-ALFWorld-v0", KWARGS, make, TASKS, 7, seedless=True, folder=tmp_path)
    assert again == demos
    # the broken case: other tasks are another key, so they are not read from this file
    with pytest.raises(AssertionError, match="collected again"):
        cached_expert_demos("BPO-ALFWorld-v0", KWARGS, make, TASKS[:2], 0, seedless=True, folder=tmp_path)
    with pytest.raises(AssertionError, match="collected again"):
        cached_expert_demos("BPO-ALFWorld-v0", {**KWARGS, "max_episode_steps": 40}, make, TASKS, 0, seedless=True, folder=tmp_path)


def test_a_damaged_demo_file_is_collected_again(demos: list[Demo], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cached_expert_demos("BPO-ALFWorld-v0", KWARGS, make, TASKS, 0, seedless=True, folder=tmp_path)
    (path,) = tmp_path.glob("*.json.gz")
    payload = json.loads(gzip.decompress(path.read_bytes()))
    payload["episodes"][0]["steps"][0][1] = 42  # an observation that is not text
    path.write_bytes(gzip.compress(json.dumps(payload).encode()))
    assert cached_expert_demos("BPO-ALFWorld-v0", KWARGS, make, TASKS, 0, seedless=True, folder=tmp_path) == demos
    assert "collecting them again" in caplog.text
    path.write_bytes(b"not gzip")
    assert cached_expert_demos("BPO-ALFWorld-v0", KWARGS, make, TASKS, 0, seedless=True, folder=tmp_path) == demos


def test_a_cache_folder_that_cannot_be_made_still_gives_the_demos(demos: list[Demo], tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert cached_expert_demos("BPO-ALFWorld-v0", KWARGS, make, TASKS, 0, seedless=True, folder=blocked / "demos") == demos


def test_demo_data_round_trip_is_checked(demos: list[Demo]) -> None:
    data = demos_data(demos)
    assert data is not None and demos_from_data(json.loads(json.dumps(data))) == demos
    # demos that are not whole episodes in order cannot be stored
    assert demos_data(demos[1:]) is None
    assert demos_data([demos[0], demos[2], demos[1]]) is None
    with pytest.raises(ValueError):
        demos_from_data([{"task_id": TASKS[0], "initial_observation": "x", "observation": "x", "admissible": ["a"],
                          "steps": [], "actions": []}])


class _Unkept(TextScorerPolicy):
    """The scorer as it was: every scoring pass derives its inputs again."""

    def inputs_kept(self):  # noqa: ANN201
        return nullcontext()


def _cloning_as_before(policy: TextScorerPolicy, demos: list[Demo], epochs: int, lr: float, seed: int) -> list[float]:
    """Behaviour cloning's loop as it was (git 1632b10): AdamW's for-loop step, and every batch
    scored from its contexts afresh (the policy keeps nothing)."""
    steps = demo_steps(policy, demos)
    policy.prepare_parameters(steps)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(epochs):
        order = rng.permutation(len(steps))
        for start in range(0, len(order), 16):
            chunk = [steps[i] for i in order[start : start + 16]]
            loss = -policy.token_logprobs(chunk).sum() / sum(len(s.action.token_ids) for s in chunk)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    return losses


def test_cloning_gives_the_weights_of_the_loop_before(demos: list[Demo]) -> None:
    def cloned(seed: int = 3) -> tuple[str | None, list[float]]:
        policy = TextScorerPolicy(seed=11, memory="alfworld")
        losses = behaviour_cloning(policy, demos, epochs=3, lr=3e-3, seed=seed)
        assert policy._kept_inputs is None  # nothing is kept after the block
        return state_digest(policy), losses

    before = _Unkept(seed=11, memory="alfworld")
    losses = _cloning_as_before(before, demos, epochs=3, lr=3e-3, seed=3)
    now = cloned()
    assert now == (state_digest(before), losses)  # bit for bit: the same losses and the same final state
    # the comparison can fail: another shuffle gives other weights
    assert cloned(seed=4)[0] != now[0]


def _scores_as_before(policy: TextScorerPolicy, contexts: list) -> list[torch.Tensor]:
    """The scorer's forward as it was before its inputs were kept per context (git 1632b10):
    the features of the whole batch gathered in lists, then rounded to float32 at once."""
    state_bags, pair_bags, pair_lengths, static, repeated, remembered, sizes = [], [], [], [], [], [], []
    for c in contexts:
        actions = c.admissible_actions or ()
        task = c.initial_observation or c.observation
        recent = [turn.action for turn in c.history[len(c.history) - policy.history :]] if policy.history else []
        found = _candidates(task, c.observation, actions, policy.max_chars, policy.mention_chars, policy.buckets)
        state_bags += [_bag_ids(text, policy.max_chars, policy.buckets) for text in (task, c.observation, "\n".join(recent))]
        pair_bags.append(found.pair_ids)
        pair_lengths.append(found.pair_lengths)
        static.append(found.features)
        taken = np.zeros(len(actions))
        for action in recent:
            taken[found.positions.get(action, [])] = 1.0
        repeated.append(taken)
        remembered.append(np.asarray(context_features(c, actions), dtype=np.float64).reshape(len(actions), -1))
        sizes.append(len(actions))
    state_lengths = np.fromiter((len(b) for b in state_bags), dtype=np.int64, count=len(state_bags))
    lengths = np.concatenate([state_lengths, *pair_lengths])
    offsets = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    embedded = policy.embedding(torch.from_numpy(np.concatenate([*state_bags, *pair_bags])), torch.from_numpy(offsets))
    states = embedded[: len(state_bags)].view(len(contexts), 3, -1)
    pairs = embedded[len(state_bags) :].view(sum(sizes), 2, -1)
    features = torch.from_numpy(np.concatenate([np.concatenate(static), np.concatenate(repeated)[:, None],
                                                np.concatenate(remembered)], axis=1).astype(np.float32))
    per_action = states.index_select(0, torch.from_numpy(np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)))
    t, o, r = per_action[:, 0], per_action[:, 1], per_action[:, 2]
    a, m = pairs[:, 0], pairs[:, 1]
    x = torch.cat([a, m, a * t, a * o, m * t, a * r, features], dim=-1)
    return list(torch.split(policy.out(torch.tanh(policy.hidden(x))).squeeze(-1), sizes))


def test_scores_equal_the_scorer_before_its_inputs_were_kept(demos: list[Demo]) -> None:
    policy = TextScorerPolicy(seed=5, memory="alfworld")
    contexts = [d.context for d in demos[:40]]
    before = _scores_as_before(policy, contexts)
    for block in (nullcontext(), policy.inputs_kept()):
        with block, torch.no_grad():
            for _ in range(2):  # the second pass reads the kept inputs
                now = policy.scores(contexts)
                assert all(torch.equal(x, y) for x, y in zip(now, before, strict=True))
    # the broken case: a scorer without its memory features scores otherwise
    plain = TextScorerPolicy(seed=5)
    assert not all(torch.equal(x, y) for x, y in zip(plain.scores(contexts), before, strict=True))


def test_kept_inputs_are_reused_only_for_the_same_context(demos: list[Demo]) -> None:
    policy = TextScorerPolicy(seed=0, memory="alfworld")
    a, b = demos[3].context, demos[4].context
    with policy.inputs_kept():
        first = policy._inputs(a)
        assert policy._inputs(a) is first and policy._inputs(b) is not first
        twin = type(a)(a.task_id, a.observation, a.admissible_actions, a.history, a.initial_observation)
        assert policy._inputs(twin) is not first  # another object: derived on its own
    assert policy._kept_inputs is None


def test_an_expert_built_late_from_the_live_trace_acts_as_one_asked_throughout() -> None:
    env = ALFWorldEnv(**KWARGS)
    try:
        task = TASKS[1]
        env.reset(options={"task_id": task})
        asked = []
        while plan := env.expert_actions():
            asked.append(plan[0])
            *_, terminated, truncated, info = env.step(plan[0])
            if terminated or truncated:
                break
        assert info["won"] and len(asked) > 6
        env.reset(options={"task_id": task})
        for action in asked[:6]:
            env.step(action)  # nobody asks: the trace keeps the engine's objects
        rest = []
        while plan := env.expert_actions():  # built now from that trace
            rest.append(plan[0])
            *_, terminated, truncated, info = env.step(plan[0])
            if terminated or truncated:
                break
        assert rest == asked[6:] and info["won"]
    finally:
        env.close()
