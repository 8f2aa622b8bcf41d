"""Prompt building and action parsing (no transformers needed)."""

from __future__ import annotations

import gymnasium as gym
import pytest

import bpo_envs  # noqa: F401  (registers the ids)
from bpo_algos.policy import Context, PromptConfig
from bpo_envs.prompting import build_messages, env_action, format_action, parse_action


def _tree_contexts(steps: int = 4) -> list[Context]:
    env = gym.make("BPO-TreeMDP-v0", depth=steps + 1, n_actions=3, seed=3)
    obs, info = env.reset(seed=0)
    context = Context(info["task_id"], obs, tuple(info["admissible_actions"]), initial_observation=obs)
    out = [context]
    for action in ["a1", "a0", "a2", "a1"][:steps]:
        obs, _, _, _, info = env.step(action)
        context = context.child(action, obs, info["admissible_actions"])
        out.append(context)
    return out


def test_first_prompt_shows_observation_and_admissible_actions_once():
    context = _tree_contexts()[0]
    system, user = build_messages(context)
    assert system["role"] == "system" and "<action>ACTION</action>" in system["content"]
    assert user["role"] == "user"
    assert user["content"].count(context.observation) == 1  # the task is the observation: once
    assert "Task:" not in user["content"]
    for action in ("a0", "a1", "a2"):
        assert f"- {action}" in user["content"]
    assert user["content"].rstrip().endswith("Answer with your next action as <action>ACTION</action>.")


def test_history_window_keeps_last_turns_and_task():
    contexts = _tree_contexts(4)
    last = contexts[-1]
    text = build_messages(last, PromptConfig(history=2))[1]["content"]
    assert text.startswith("Task:\n" + last.initial_observation)
    assert "2 earlier steps not shown" in text
    assert "Step 3 action: a2" in text and "Step 4 action: a1" in text
    assert "Step 2 action" not in text
    assert f"Step 3 observation:\n{contexts[2].observation}" in text
    assert text.index("Current observation:\n" + last.observation) > text.index("Step 4 action")
    # the whole history, and the first turn's observation refers to the task instead of repeating it
    full = build_messages(last, PromptConfig(history=10))[1]["content"]
    assert "not shown" not in full and "Step 1 observation:\n(the task above)" in full
    assert full.count(last.initial_observation) == 1
    none = build_messages(last, PromptConfig(history=0))[1]["content"]
    assert "Recent steps" not in none and "Task:" in none


def test_no_admissible_list_for_free_text_envs_and_long_observations_cut():
    context = Context("t", "x" * 20_000, None, initial_observation="the task")
    text = build_messages(context, PromptConfig(max_observation_chars=1000))[1]["content"]
    assert "Admissible actions" not in text
    assert "characters cut" in text and len(text) < 1500
    assert "Admissible" not in build_messages(_tree_contexts()[0], PromptConfig(show_admissible=False))[1]["content"]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("<action>a1</action>", "a1"),
        ("  I think <action> go north </action>\n", "go north"),
        ("<action>a0</action> no, <action>a2</action>", "a2"),
        ("<action>click[Buy Now]</action>", "click[Buy Now]"),
        ("<action>line1\nline2</action>", "line1\nline2"),
        ("a1", None),
        ("<action>a1", None),
        ("<action></action>", None),
        ("<action>   </action>", None),
        ("", None),
    ],
)
def test_parse_action(text, parsed):
    assert parse_action(text) == parsed
    assert env_action(text) == (text if parsed is None else parsed)


def test_custom_tags():
    config = PromptConfig(action_open="Action: [", action_close="]")
    assert format_action("a1", config) == "Action: [a1]"
    assert parse_action("thinking... Action: [a2]", config) == "a2"
    assert parse_action("<action>a2</action>", config) is None
    assert "Action: [ACTION]" in build_messages(_tree_contexts()[0], config)[0]["content"]


@pytest.mark.parametrize(
    "kwargs", [{"history": -1}, {"history": 1.5}, {"action_open": ""}, {"max_observation_chars": 10}]
)
def test_bad_config_is_a_clear_error(kwargs):
    with pytest.raises(ValueError):
        PromptConfig(**kwargs)


@pytest.mark.parametrize(
    "raw",
    [
        "x" * 100_000,
        "\x00\x01\x02\xff binary",
        "ünïcödé ✓ ☃ 你好 😀",
        "$(rm -rf /); `reboot` | cat /etc/passwd && echo $HOME",
        "<action>a7</action>",
        "<action>a1",
    ],
)
def test_malformed_model_output_is_an_invalid_action_in_a_real_env(raw):
    env = gym.make("BPO-TreeMDP-v0", depth=2, n_actions=3, seed=0)
    obs, _ = env.reset(seed=0)
    out, reward, terminated, truncated, info = env.step(env_action(raw))
    assert info["invalid_action"] is True
    assert reward == 0.0 and not terminated
    assert out.startswith("Invalid action") and obs in out
