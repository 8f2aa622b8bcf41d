"""Bad input for every env: adversarial and random action strings are observations, never
exceptions (and the env goes on working after them); bad constructor arguments, reset options
and data files give errors that name the problem."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from env_zoo import ADVERSARIAL_ACTIONS, ENVS, GARBAGE_ACTIONS, NAMES, make_or_skip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bpo_envs


@pytest.fixture(scope="module")
def envs():
    made = {}

    def get(name):
        if name not in made:
            made[name] = make_or_skip(name)()
        return made[name]

    yield get
    for e in made.values():
        e.close()


@pytest.fixture(params=NAMES)
def env(request, envs):
    return envs(request.param)


def _check_answer(env, result, action):
    obs, reward, terminated, truncated, info = result
    assert isinstance(obs, str) and env.observation_space.contains(obs), f"bad observation for {action[:40]!r}"
    assert isinstance(reward, float) and isinstance(terminated, bool) and isinstance(truncated, bool)
    assert "task_id" in info and isinstance(info["won"], bool)


@pytest.mark.parametrize("name, index", [(name, i) for name in NAMES for i in range(len(ADVERSARIAL_ACTIONS))])
def test_adversarial_actions_are_observations(envs, name, index):
    env = envs(name)
    action = ADVERSARIAL_ACTIONS[index]
    env.reset(seed=index)
    result = env.step(action)
    _check_answer(env, result, action)
    if action in GARBAGE_ACTIONS and not accepts_any_text(env):
        assert result[4].get("invalid_action") is True, f"{action!r} was not flagged invalid"
        assert result[1] == 0.0
    # the env still works: a real action steps, a snapshot round-trips
    admissible = result[4].get("admissible_actions")
    if not (result[2] or result[3]) and admissible:
        snap = bpo_envs.snapshot(env)
        first = env.step(admissible[0])
        bpo_envs.restore(env, snap)
        assert env.step(admissible[0])[0] == first[0]
        snap.release()


def accepts_any_text(env) -> bool:
    # a shell env runs any text as a command: there is no invalid action, only failing ones
    return env.spec is not None and env.spec.id == ENVS["swebench"][0]


@pytest.mark.parametrize("name", NAMES)
def test_random_text_and_bytes_never_raise(name):
    make = make_or_skip(name)
    env = make()
    examples = 150 if name in ("treemdp", "webshop") else 15

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 1000), actions=st.lists(st.text(max_size=300) | st.binary(max_size=300), min_size=1, max_size=4))
    def run(seed, actions):
        env.reset(seed=seed)
        for action in actions:
            result = env.step(action)
            text = action.decode("utf-8", errors="replace") if isinstance(action, bytes) else action
            _check_answer(env, result, text)
            if result[2] or result[3]:
                break

    try:
        run()
    finally:
        env.close()


def test_non_text_actions_are_a_clear_type_error(env):
    env.reset(seed=0)
    for action in (None, 3, ["a0"]):
        with pytest.raises(TypeError, match="action must be a str"):
            env.step(action)


def test_bad_reset_options_name_the_problem(env):
    with pytest.raises(ValueError, match="task_id"):
        env.reset(options={"task_id": "no such task \x00"})
    with pytest.raises(ValueError, match="bogus"):
        env.reset(options={"bogus": 1})
    with pytest.raises(bpo_envs.ResetNeeded):
        make = gym.make(env.spec)
        try:
            make.step("anything")
        finally:
            make.close()


CONSTRUCTOR_CASES = {
    "treemdp": [
        ({"depth": 0}, "depth"),
        ({"depth": "3"}, "depth"),
        ({"n_actions": 1}, "n_actions"),
        ({"n_tasks": 0}, "n_tasks"),
        ({"decisive_levels": [9]}, "decisive_levels"),
        ({"decisive_levels": []}, "decisive_levels"),
        ({"observe": "pixels"}, "observe"),
        ({"observe": "state"}, "decisive_levels"),
        ({"routine_weight": 2.0}, "routine_weight"),
        ({"max_episode_steps": 0}, "max_episode_steps"),
        ({"max_episode_steps": True}, "max_episode_steps"),
        ({"render_mode": "human"}, "render_mode"),
    ],
    "webshop": [
        ({"observation_mode": "html"}, "observation_mode"),
        ({"num_products": 0}, "num_products"),
        ({"goals": "all"}, "goals"),
        ({"split": "validation"}, "split"),
        ({"data_dir": "/nonexistent/webshop"}, "data_dir"),
        ({"noun_parser": "nltk"}, "noun_parser"),
        ({"max_episode_steps": -1}, "max_episode_steps"),
        ({"render_mode": "rgb_array"}, "render_mode"),
    ],
    "alfworld": [
        ({"split": "nope"}, "split"),
        ({"task_types": ["juggle"]}, "juggle"),
        ({"games_per_type": 0}, "games_per_type"),
        ({"data_dir": "/nonexistent/alfworld"}, "alfworld"),
        ({"max_episode_steps": 0}, "max_episode_steps"),
    ],
    "swebench": [
        ({"max_episode_steps": 0}, "max_episode_steps"),
        ({"render_mode": "human"}, "render_mode"),
    ],
}


@pytest.mark.parametrize(
    "name, kwargs, word",
    [(name, kwargs, word) for name, cases in CONSTRUCTOR_CASES.items() for kwargs, word in cases],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_constructor_arguments_name_the_problem(name, kwargs, word):
    make_or_skip(name)
    entry = gym.spec(ENVS[name][0]).entry_point
    module, cls = entry.split(":")
    env_cls = getattr(__import__(module, fromlist=[cls]), cls)
    base = {k: v for k, v in ENVS[name][1].items() if k not in kwargs}
    with pytest.raises((ValueError, TypeError, FileNotFoundError)) as err:
        env_cls(**base, **kwargs)
    assert word in str(err.value), f"{err.value!r} does not name {word!r}"


def test_webshop_goal_seed_is_checked():
    make_or_skip("webshop")
    from bpo_envs.webshop import WebShopEnv

    with pytest.raises(ValueError, match="goal_seed"):
        WebShopEnv(goal_seed="x")


def test_webshop_bad_data_files_name_the_file(tmp_path):
    make_or_skip("webshop")
    from bpo_envs.webshop import WebShopEnv, write_catalog

    folder = write_catalog(tmp_path / "shop", n_products=20, seed=1)
    items = next(p for p in folder.iterdir() if p.name.startswith("items_shuffle"))
    items.write_text("{not json")
    with pytest.raises(Exception) as err:
        WebShopEnv(str(folder))
    assert items.name in str(err.value)
    items.write_text(json.dumps([{"asin": 1}]))
    with pytest.raises(Exception) as err:
        WebShopEnv(str(folder))
    assert items.name in str(err.value) or "asin" in str(err.value)
