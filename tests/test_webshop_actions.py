"""WebShop: search_actions modes (no hidden goal field in a default), reward settings,
standard splits and provenance."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("rapidfuzz")
pytest.importorskip("bm25s")

import bpo_envs  # noqa: E402
from bpo_envs.reward_settings import REWARD_SETTINGS, VERL_AGENT_REWARD  # noqa: E402
from bpo_envs.webshop import DEFAULT_SEARCH_ACTIONS, WebShopEnv, instruction_queries  # noqa: E402
from bpo_envs.webshop.queries import FREE_SEARCH  # noqa: E402

ENV_ID = "BPO-WebShop-v0"
HIDDEN = "zorblax"  # appears only in the goal's hidden query / attributes, never on a page


def _record(asin, name, query, options):
    return {
        "asin": asin, "name": name, "category": "beauty", "query": query,
        "product_category": "Beauty & Personal Care › Personal Care › Deodorants",
        "full_description": f"{name}. Great for sensitive skin.", "small_description": [f"About {name}"],
        "pricing": "$10.00", "customization_options": options,
    }  # fmt: skip


def _opts(**groups):
    return {k: [{"value": v, "image": None} for v in vs] for k, vs in groups.items()}


def _hidden_token_data(folder):
    products = [
        _record("B000000001", "Citrus Deodorant Stick", f"{HIDDEN} deodorant", _opts(scent=["citrus", "lavender"])),
        _record("B000000002", "Mint Toothpaste Tube", f"{HIDDEN} toothpaste", {}),
        _record("B000000003", "Cedar Body Wash", f"body wash {HIDDEN}", _opts(size=["8 oz", "16 oz"])),
    ]  # fmt: skip
    ins = {
        "B000000001": {"attributes": [f"{HIDDEN} fresh"], "instruction": "i need a long lasting deodorant stick",
                       "instruction_attributes": [f"{HIDDEN} fresh"]},
        "B000000002": {"attributes": ["mint"], "instruction": "find me a mint toothpaste",
                       "instruction_attributes": [HIDDEN]},
        "B000000003": {"attributes": ["cedar"], "instruction": "i want a cedar body wash for dry skin",
                       "instruction_attributes": [f"{HIDDEN} cedar"]},
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "items_shuffle_1000.json").write_text(json.dumps(products))
    (folder / "items_ins_v2_1000.json").write_text(json.dumps(ins))
    return folder


def _every_admissible(env, rng, walks=6, steps=8):
    """Admissible lists along the expert's path and along random walks of every task."""
    seen = []
    for task in env.task_ids():
        _, info = env.reset(options={"task_id": task})
        seen += info["admissible_actions"]
        for a in env.expert_actions():
            *_, info = env.step(a)
            seen += info["admissible_actions"]
        for _ in range(walks):
            _, info = env.reset(options={"task_id": task})
            for _ in range(steps):
                acts = info["admissible_actions"]
                if not acts:
                    break
                *_, term, trunc, info = env.step(acts[int(rng.integers(len(acts)))])
                seen += info["admissible_actions"]
                if term or trunc:
                    break
    return seen


@pytest.mark.parametrize("mode", ["instruction", "free"])
def test_no_admissible_action_holds_a_hidden_goal_token(tmp_path, mode):
    env = WebShopEnv(data_dir=str(_hidden_token_data(tmp_path / "d")), search_actions=mode)
    seen = _every_admissible(env, np.random.default_rng(0))
    assert seen and not [a for a in seen if HIDDEN in a]


def test_upstream_il_candidates_do_hold_it(tmp_path):
    # the same check fails for upstream's IL candidates: it can detect a leak
    env = WebShopEnv(data_dir=str(_hidden_token_data(tmp_path / "d")), search_actions="upstream-il")
    _, info = env.reset(options={"task_id": 0})
    assert any(HIDDEN in a for a in info["admissible_actions"])
    goal = env.goal
    assert info["admissible_actions"][0] == f"search[{goal['query']}]"


def test_default_is_instruction_and_candidates_come_from_the_page():
    assert DEFAULT_SEARCH_ACTIONS == "instruction"
    env = gym.make(ENV_ID)
    obs, info = env.reset(options={"task_id": 3})
    text = env.unwrapped.goal["instruction_text"]
    assert text in obs
    for action in info["admissible_actions"]:
        query = action[len("search[") : -1]
        assert query in text.lower()  # every candidate is a piece of the instruction shown


def test_instruction_queries_shapes():
    q = instruction_queries(
        "i need a wireless charging phone case with color: clear, and size: iphone 14, and price lower than 50.00 dollars"
    )
    assert q == [
        "i need a wireless charging phone case with color: clear, and size: iphone 14",
        "i need a wireless charging phone case",
        "wireless charging phone case",
        "i need a wireless charging phone case with color: clear, and size: iphone 14, and price lower than 50.00 dollars",
    ]
    assert instruction_queries("find [x] me") == ["find x me"]  # brackets would break parsing
    assert instruction_queries("   ") == []


def test_free_mode_lists_the_placeholder_and_any_query_works():
    env = gym.make(ENV_ID, search_actions="free")
    _, info = env.reset(options={"task_id": 0})
    assert info["admissible_actions"] == [FREE_SEARCH]
    obs, reward, term, trunc, info = env.step("search[red hoodie]")
    assert not info.get("invalid_action") and info["page"] == "results"
    assert "click[back to search]" in info["admissible_actions"]
    # the expert still wins: it types its own query
    env.reset(options={"task_id": 0})
    for a in env.unwrapped.expert_actions():
        *_, info = env.step(a)
    assert info["won"]


def test_expert_search_is_admissible_under_the_default():
    env = gym.make(ENV_ID).unwrapped
    for task in range(0, 400, 20):
        _, info = env.reset(options={"task_id": task})
        actions = env.expert_actions()
        assert actions[0] in info["admissible_actions"], (task, actions[0])


def test_bad_search_actions_value():
    with pytest.raises(ValueError, match="search_actions must be one of"):
        gym.make(ENV_ID, search_actions="query")


# ---- rewards -------------------------------------------------------------------------------


def _buy_wrong(env, task):
    env.reset(options={"task_id": task})
    goal = env.unwrapped.goal
    _, _, _, _, info = env.step(env.unwrapped.expert_actions()[0])
    other = next(a for a in info["admissible_actions"][2:] if a[6:-1] != goal["asin"].lower())
    env.step(other)
    return env.step("click[buy now]")


def _buy_right(env, task):
    env.reset(options={"task_id": task})
    out = None
    for a in env.unwrapped.expert_actions():
        out = env.step(a)
    return out


def test_reward_modes_scale_and_penalty():
    score = gym.make(ENV_ID)
    success = gym.make(ENV_ID, reward_mode="success")
    verl = gym.make(ENV_ID, **VERL_AGENT_REWARD)
    _, r_score, term, _, info = _buy_wrong(score, 5)
    assert term and 0 < r_score < 1 and info["score"] == r_score and not info["won"]
    _, r_success, _, _, info2 = _buy_wrong(success, 5)
    assert r_success == 0.0 and info2["score"] == r_score
    _, r_verl, _, _, _ = _buy_wrong(verl, 5)
    assert r_verl == 0.0
    assert _buy_right(verl, 5)[1] == 10.0 and _buy_right(score, 5)[1] == 1.0
    scaled = gym.make(ENV_ID, reward_scale=2.5)
    assert _buy_wrong(scaled, 5)[1] == pytest.approx(2.5 * r_score)
    verl.reset(options={"task_id": 5})
    _, r_bad, term, _, info = verl.step("dance[wildly]")
    assert info["invalid_action"] and r_bad == -0.1 and not term
    score.reset(options={"task_id": 5})
    assert score.step("dance[wildly]")[1] == 0.0


def test_reward_settings_table_and_bad_values():
    assert REWARD_SETTINGS["verl-agent"] == {"reward_mode": "success", "reward_scale": 10.0, "invalid_penalty": 0.1}
    assert REWARD_SETTINGS["default"]["reward_mode"] == "score"
    with pytest.raises(ValueError, match="reward_mode"):
        gym.make(ENV_ID, reward_mode="dense")
    with pytest.raises(ValueError, match="invalid_penalty"):
        gym.make(ENV_ID, invalid_penalty=-0.1)
    with pytest.raises(ValueError, match="reward_scale"):
        gym.make(ENV_ID, reward_scale=float("nan"))


def test_snapshots_of_other_settings_are_refused():
    a = gym.make(ENV_ID).unwrapped
    b = gym.make(ENV_ID, search_actions="free").unwrapped
    c = gym.make(ENV_ID, **VERL_AGENT_REWARD).unwrapped
    a.reset(options={"task_id": 0})
    snap = a.snapshot()
    for other in (b, c):
        with pytest.raises(bpo_envs.SnapshotKindError):
            other.restore(snap)


@pytest.mark.parametrize(
    "kwargs", [{}, {"search_actions": "free"}, {"search_actions": "upstream-il"}, dict(VERL_AGENT_REWARD)]
)
def test_check_snapshot_every_setting(kwargs):
    env = gym.make(ENV_ID, **kwargs)
    bpo_envs.check_snapshot(env, seed=1, steps=10)


# ---- splits and provenance -----------------------------------------------------------------


def test_standard_splits_are_upstreams_and_disjoint():
    test = gym.make(ENV_ID, split="test").unwrapped
    evals = gym.make(ENV_ID, split="eval").unwrapped
    train = gym.make(ENV_ID, split="train").unwrapped
    assert list(test.task_ids()) == list(range(500))
    assert list(evals.task_ids()) == list(range(500, 1500))
    assert train.task_ids()[0] == 1500 and train.task_ids()[-1] == len(train.catalog.goals) - 1
    sets = [set(e.task_ids()) for e in (test, evals, train)]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    with pytest.raises(ValueError, match="unknown task_id"):
        test.reset(options={"task_id": 1500})


def test_provenance_bundled_and_data_dir(tmp_path):
    p = gym.make(ENV_ID, split="test").unwrapped.provenance()
    assert p["env"] == ENV_ID and p["data_source"] == "bundled-generator"
    assert p["generator"] == "bpo_envs.webshop.generator" and isinstance(p["generator_version"], int)
    assert p["split"] == "test" and p["task_count"] == 500 and p["search_actions"] == "instruction"
    assert len(p["files_sha256"]) == 64 and p["reward"]["reward_mode"] == "score"
    json.dumps(p)  # recordable as is
    folder = _hidden_token_data(tmp_path / "d")
    q = WebShopEnv(data_dir=str(folder)).provenance()
    assert q["data_source"] == "data_dir" and q["data_dir"] == str(folder.resolve())
    assert q["split"] == "all" and q["task_count"] == q["goal_count"] == 5
    other = _hidden_token_data(tmp_path / "e")
    (other / "items_ins_v2_1000.json").write_text((other / "items_ins_v2_1000.json").read_text().replace("cedar", "pine"))
    assert WebShopEnv(data_dir=str(other)).provenance()["files_sha256"] != q["files_sha256"]
