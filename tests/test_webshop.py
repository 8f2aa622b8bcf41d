"""BPO-WebShop-v0: pages, actions, expert, snapshots, Gymnasium checks, vector envs."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("rapidfuzz")
pytest.importorskip("bm25s")

import bpo_envs  # noqa: E402
from bpo_envs.webshop import WebShopEnv, parse_action, write_catalog  # noqa: E402

ENV_ID = "BPO-WebShop-v0"


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    return str(write_catalog(tmp_path_factory.mktemp("webshop-small"), n_products=40, seed=7))


@pytest.fixture(scope="module")
def env():
    e = gym.make(ENV_ID)
    yield e
    e.close()


def _walk(env, actions):
    out = None
    for a in actions:
        out = env.step(a)
    return out


def test_registered_entry_point_and_bundled_catalog(env):
    u = env.unwrapped
    assert isinstance(u, WebShopEnv)
    assert u.catalog.goal_mode == "synthetic"
    assert len(u.catalog.products) == 3000
    assert len(u.task_ids()) > 5000
    assert gym.make("bpo_envs:BPO-WebShop-v0").unwrapped.catalog is u.catalog  # shared


def test_start_page_matches_upstream_format(env):
    obs, info = env.reset(options={"task_id": 0})
    goal = env.unwrapped.goal
    assert obs == f"WebShop [SEP] Instruction: [SEP] {goal['instruction_text']} [SEP] Search"
    assert info["task_id"] == 0 and info["won"] is False
    # the default candidates are phrases of the instruction the agent reads
    assert info["admissible_actions"][0] == f"search[{goal['instruction_text'].split(', and price')[0]}]"
    assert all(a.startswith("search[") for a in info["admissible_actions"])


def test_results_item_and_sub_pages(env):
    env.reset(options={"task_id": 5})
    goal = env.unwrapped.goal
    obs, r, term, trunc, info = env.step(f"search[{goal['query']}]")
    assert (r, term, trunc) == (0.0, False, False)
    parts = obs.split(" [SEP] ")
    assert parts[:3] == ["Instruction:", goal["instruction_text"], "Back to Search"]
    assert parts[3] == "Page 1 (Total results: 50)" and parts[4] == "Next >"
    assert "click[< prev]" not in info["admissible_actions"]
    asin = parts[5]
    assert info["admissible_actions"][:2] == ["click[back to search]", "click[next >]"]
    assert f"click[{asin.lower()}]" in info["admissible_actions"]

    obs2, *_, info2 = env.step("click[Next >]")  # labels are case-insensitive
    assert obs2.split(" [SEP] ")[3:6] == ["Page 2 (Total results: 50)", "< Prev", "Next >"]
    obs3, *_ = env.step("click[< prev]")
    assert obs3 == obs

    obs, *_, info = env.step(f"click[{asin}]")
    product = env.unwrapped.catalog.products[env.unwrapped.catalog.asin_to_index[asin.lower()]]
    parts = obs.split(" [SEP] ")
    assert parts[2:4] == ["Back to Search", "< Prev"]
    assert parts[-5:] == ["Rating: " + str(product["Rating"]), "Description", "Features", "Reviews", "Buy Now"]
    assert f"Price: {product['Price']}" in parts and product["Title"] in parts
    for name, values in product["options"].items():
        assert parts[parts.index(name) + 1 : parts.index(name) + 1 + len(values)] == values

    obs, *_ = env.step("click[features]")
    assert obs.split(" [SEP] ")[4:] == [b.strip() for b in product["BulletPoints"] if b.strip()]
    obs, *_ = env.step("click[< prev]")
    assert obs.split(" [SEP] ")[-1] == "Buy Now"
    obs, *_ = env.step("click[description]")
    assert obs.endswith(product["Description"])
    obs, *_, info = env.step("click[back to search]")
    assert obs.startswith("WebShop [SEP] Instruction:")
    assert info["page"] == "start"


def test_text_rich_marks_buttons_and_clicked_options():
    e = gym.make(ENV_ID, observation_mode="text_rich")
    e.reset(options={"task_id": 11})
    actions = e.unwrapped.expert_actions()
    obs, *_ = _walk(e, actions[:-1])
    options = [a[6:-1] for a in actions if a.startswith("click[") and a not in (actions[-1],)][1:]
    assert "[button] Buy Now [button_]" in obs
    for value in options:
        assert f"[clicked button] {value} [clicked button_]" in obs
        assert f"You have clicked {value}." in obs
    e.step("click[< prev]")
    obs, *_ = e.step("click[< prev]")
    asin = actions[-2 - len(options)][6:-1].upper()
    assert f"[clicked button] {asin} [clicked button_]" in obs  # the visited product


@pytest.mark.parametrize(
    "action, why",
    [
        ("buy it now", "actions are search"),
        ("search[]", "actions are search"),
        ("click[search]", "Search button cannot be clicked"),
        ("click[nonexistent]", "there is no 'nonexistent'"),
        ("Search[shoes]", "actions are search"),  # upstream's verbs are case-sensitive
        ("\x00\xff" * 50, "actions are search"),
    ],
)
def test_invalid_actions_leave_the_page(env, action, why):
    obs0, info0 = env.reset(options={"task_id": 3})
    obs, r, term, trunc, info = env.step(action)
    assert info["invalid_action"] is True
    assert why in obs and obs.endswith(obs0)
    assert (r, term, trunc) == (0.0, False, False)
    assert info["admissible_actions"] == info0["admissible_actions"]


def test_parse_action_follows_upstream_regex():
    assert parse_action("search[red shoes]") == ("search", "red shoes")
    assert parse_action("click[< Prev]") == ("click", "< Prev")
    assert parse_action("click[a[b]c]") == ("click[a", "b]c")  # greedy verb, greedy argument
    assert parse_action("search[x] and more") == ("search", "x")
    assert parse_action("search[x\n]") == ("search[x\n]", None)
    assert parse_action("[x]") == ("[x]", None)
    assert parse_action("search[]") == ("search[]", None)


def test_search_works_from_any_page_and_resets_options(env):
    env.reset(options={"task_id": 2})
    actions = env.unwrapped.expert_actions()
    _walk(env, actions[:-1])
    assert env.unwrapped.session.page == "item"
    obs, r, term, trunc, info = env.step("search[shoes]")
    assert not info.get("invalid_action") and info["page"] == "results"
    assert env.unwrapped.session.options == ()


def test_truncation_at_max_episode_steps():
    # direct construction: gym.make consumes max_episode_steps= itself (it adds a TimeLimit)
    e = WebShopEnv(max_episode_steps=3)
    e.reset(options={"task_id": 1})
    results = [e.step("click[nothing]") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert not any(r[2] for r in results)
    with pytest.raises(bpo_envs.ResetNeeded):
        e.step("search[x]")


def test_expert_wins_every_goal_of_a_small_catalog(small_dir):
    e = gym.make(ENV_ID, data_dir=small_dir)
    ids = e.unwrapped.task_ids()
    assert 100 < len(ids) < 5000
    for task in ids:
        e.reset(options={"task_id": task})
        for a in e.unwrapped.expert_actions():
            obs, reward, term, trunc, info = e.step(a)
            assert not info.get("invalid_action"), (task, a, obs)
        assert term and reward == 1.0 and info["won"], (task, info)


def test_expert_from_mid_episode(env):
    env.reset(options={"task_id": 9})
    env.step("search[zzz qqq]")
    actions = env.unwrapped.expert_actions()
    assert actions[0] == "click[back to search]"
    *_, info = _walk(env, actions)
    assert info["won"]


def test_buying_the_wrong_product_scores_below_one(env):
    env.reset(options={"task_id": 4})
    u = env.unwrapped
    goal = u.goal
    _, *_, info = env.step(f"search[{goal['query']}]")
    other = next(a for a in info["admissible_actions"][2:] if a[6:-1] != goal["asin"].lower())
    env.step(other)
    obs, reward, term, trunc, info = env.step("click[buy now]")
    assert term and 0.0 <= reward < 1.0 and not info["won"]
    assert set(info["reward_details"]) >= {"r_type", "r_att", "w_att", "title_score"}
    assert f"Your score (min 0.0, max 1.0) [SEP] {reward}" in obs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_check_snapshot(env, seed):
    report = bpo_envs.check_snapshot(env, seed=seed, steps=15)
    assert report.portable_checked and report.fresh_env_checked
    assert report.compared_transitions > 50


def test_check_snapshot_text_rich_small(small_dir):
    e = gym.make(ENV_ID, data_dir=small_dir, observation_mode="text_rich")
    bpo_envs.check_snapshot(e, seed=4, steps=15)


def test_snapshot_into_another_config_is_refused(small_dir, env):
    env.reset(seed=0)
    snap = bpo_envs.snapshot(env)
    other = gym.make(ENV_ID, data_dir=small_dir)
    with pytest.raises(bpo_envs.SnapshotKindError):
        bpo_envs.restore(other, snap)


def test_snapshot_is_tiny_and_restores_mid_episode(env):
    env.reset(options={"task_id": 7})
    actions = env.unwrapped.expert_actions()
    _walk(env, actions[:2])
    snap = bpo_envs.snapshot(env)
    assert len(snap.portable()) < 4096  # the session tuple plus the last observation
    first = _walk(env, actions[2:])
    env.reset(options={"task_id": 8})
    bpo_envs.restore(env, snap)
    assert _walk(env, actions[2:]) == first


def test_a_page_kept_for_the_next_click_is_never_another_tasks(env):
    """The env keeps its last page (for the next click); the start page of task 7 restored
    after task 8's start page was shown must show task 7's instruction, and click as task 7."""
    start7, _ = env.reset(options={"task_id": 7})
    snap = bpo_envs.snapshot(env)
    actions = env.unwrapped.expert_actions()
    first = _walk(env, actions[:3])
    start8, _ = env.reset(options={"task_id": 8})
    assert start8 != start7
    bpo_envs.restore(env, snap)
    assert env.unwrapped._render(env.unwrapped.session)[0] == start7  # same session object START
    assert _walk(env, actions[:3]) == first


def test_check_env(env):
    from gymnasium.utils.env_checker import check_env

    check_env(env.unwrapped, skip_render_check=True)


def test_splits_and_task_ids():
    test = gym.make(ENV_ID, split="test").unwrapped
    train = gym.make(ENV_ID, split="train").unwrapped
    assert list(test.task_ids()) == list(range(500))
    assert train.task_ids()[0] == 1500 and train.task_ids()[-1] == len(train.catalog.goals) - 1
    obs, info = test.reset(options={"task_id": "42"})  # the string form is accepted
    assert info["task_id"] == 42
    with pytest.raises(ValueError, match="unknown task_id 1500"):
        test.reset(options={"task_id": 1500})
    with pytest.raises(ValueError, match="split must be"):
        gym.make(ENV_ID, split="validation")
    with pytest.raises(ValueError, match="observation_mode"):
        gym.make(ENV_ID, observation_mode="html")


def test_reset_by_seed_is_deterministic(env):
    assert env.reset(seed=123) == env.reset(seed=123)


_CHILD = """
import json, pickle, sys, gymnasium as gym, bpo_envs
env = gym.make("BPO-WebShop-v0")
out = {"goal": env.unwrapped.catalog.goal(321)["instruction_text"], "asin": env.unwrapped.catalog.goal(321)["asin"]}
env.reset(seed=0)
bpo_envs.restore(env, pickle.loads(sys.stdin.buffer.read()))
out["step"] = list(env.step("click[buy now]")[:4])
print(json.dumps(out))
"""


def test_goals_and_portable_snapshots_are_the_same_in_another_process(env):
    env.reset(options={"task_id": 321})
    actions = env.unwrapped.expert_actions()
    _walk(env, actions[:-1])
    blob = bpo_envs.snapshot(env).portable()
    expected = list(env.step("click[buy now]")[:4])
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=pickle.dumps(blob), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    child = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    goal = env.unwrapped.catalog.goal(321)
    assert child["goal"] == goal["instruction_text"] and child["asin"] == goal["asin"]
    assert child["step"] == expected and expected[1] == 1.0


def test_sync_vector_env(small_dir):
    venv = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync", data_dir=small_dir)
    obs, infos = venv.reset(seed=[0, 1])
    assert all(o.startswith("WebShop [SEP]") for o in obs)
    obs, rewards, term, trunc, infos = venv.step(["search[shirt]", "click[nothing]"])
    assert obs[0].startswith("Instruction:") and "Invalid action" in obs[1]
    venv.close()


def test_async_vector_env_without_shared_memory(small_dir):
    venv = gym.make_vec(
        ENV_ID, num_envs=2, vectorization_mode="async",
        vector_kwargs={"shared_memory": False}, data_dir=small_dir,
    )  # fmt: skip
    try:
        obs, _ = venv.reset(seed=[0, 1])
        ref = gym.make(ENV_ID, data_dir=small_dir)
        assert list(obs) == [ref.reset(seed=0)[0], ref.reset(seed=1)[0]]
        obs, *_ = venv.step(["search[coffee]", "search[coffee]"])
        assert all("Total results" in o for o in obs)
    finally:
        venv.close()


def test_random_walks_stay_in_the_spaces(env):
    rng = np.random.default_rng(0)
    u = env.unwrapped
    for episode in range(5):
        obs, info = env.reset(seed=episode)
        for _ in range(15):
            assert env.observation_space.contains(obs)
            obs, r, term, trunc, info = env.step(u.sample_action(rng))
            assert 0.0 <= r <= 1.0
            if term or trunc:
                break


def test_extra_env_instances_share_the_catalog_and_stay_small(env):
    import tracemalloc

    env.reset(seed=0)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    envs = [gym.make(ENV_ID) for _ in range(20)]
    for e in envs:
        e.reset(seed=5)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert all(e.unwrapped.catalog is env.unwrapped.catalog for e in envs)
    assert grown / len(envs) < 1 << 20


@pytest.mark.parametrize("mode", ["text", "text_rich"])
def test_shared_page_cache_gives_the_pages_an_uncached_env_builds(small_dir, mode):
    """Random walks over several tasks, twice on one env: each step's observation, reward and
    info equal a fresh render of the same session (the page functions run again, no cache) and
    the first walk's; a cached page and a cached reward never leak into another task, mode or
    set of options."""
    env = gym.make(ENV_ID, data_dir=small_dir, observation_mode=mode)
    u = env.unwrapped
    u.catalog.page_cache.clear()
    u.catalog.reward_cache.clear()

    def walk() -> list:
        out, rng = [], np.random.default_rng(3)
        for task in (0, 1, 0, 2):
            obs, info = env.reset(options={"task_id": task})
            for _ in range(12):
                action = u.sample_action(rng)
                obs, r, term, trunc, info = env.step(action)
                u.catalog.page_cache, kept = {}, u.catalog.page_cache  # render this session afresh
                fresh_obs, fresh_info = u._render(u.session)
                u.catalog.page_cache = kept
                if not info.get("invalid_action"):
                    assert (obs, info["admissible_actions"], info["page"]) == (fresh_obs, fresh_info["admissible_actions"], fresh_info["page"])
                out.append((obs, r, term, trunc, {k: v for k, v in info.items() if k != "task_id"}))
                if term or trunc:
                    break
        return out

    first = walk()
    assert u.catalog.page_cache and any(step[2] for step in first)
    assert walk() == first  # now served from the cache
    env.close()
