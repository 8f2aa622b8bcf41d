"""Prompt building and action parsing (no transformers needed)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from prompt_support import webshop_like_path

import bpo_envs  # noqa: F401  (registers the ids)
from bpo_algos.policy import Context, PromptConfig
from bpo_envs.prompting import build_messages, env_action, format_action, parse_action, window_start


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
    "kwargs", [{"history": -1}, {"history": 1.5}, {"action_open": ""}, {"max_observation_chars": 10}, {"layout": "chat"}]
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


def _extends(earlier: list[dict[str, str]], later: list[dict[str, str]]) -> bool:
    """Whether ``later`` repeats ``earlier`` up to the end of its current observation (the
    admissible actions and the instruction, which follow it, are the current step's own)."""
    head, last = earlier[:-1], earlier[-1]["content"].split("\n\nAdmissible actions:")[0].split("\n\nAnswer with")[0]
    return later[: len(head)] == head and later[len(head)]["content"] == last


@pytest.mark.parametrize("history", [1, 2, 3])
def test_turns_layout_extends_the_previous_prompt_until_the_window_moves(history):
    """With ``layout="turns"`` each step's chat repeats the previous one up to its current
    observation, save when the window of past steps moves (every ``history`` steps): then the
    first message says how many steps are not shown. Between ``history`` and ``2 * history - 1``
    past steps are shown. The broken case: today's ``"summary"`` layout never extends (its
    current observation is relabelled when it becomes a past step)."""
    config = PromptConfig(history=history, layout="turns")
    path = webshop_like_path(12, seed=history, words=None)
    chats = [build_messages(c, config) for c in path]
    for k in range(len(path) - 1):
        moved = window_start(k, history) != window_start(k + 1, history)
        assert _extends(chats[k], chats[k + 1]) != moved, k
        start = window_start(k + 1, history)
        shown = sum(m["role"] == "assistant" for m in chats[k + 1])
        assert shown == k + 1 - start and min(k + 1, history) <= shown <= 2 * history - 1
        assert chats[k + 1][0]["role"] == "system" and [m["role"] for m in chats[k + 1][1:]] == ["user", "assistant"] * shown + ["user"]
        assert chats[k + 1][1]["content"].startswith("Task:\n" + path[0].observation)
        assert (f"({start} earlier step" in chats[k + 1][1]["content"]) == (start > 0)
        assert chats[k + 1][-2]["content"] == format_action(path[k + 1].history[-1].action, config)
    summary = [build_messages(c, PromptConfig(history=history)) for c in path]
    assert not any(_extends(summary[k], summary[k + 1]) for k in range(len(path) - 1))


def test_turns_layout_shows_what_the_summary_shows():
    """The same decision point in both layouts: the task, each shown step's observation and
    action, the current observation, the admissible actions and the instruction."""
    path = webshop_like_path(3, seed=0, words=None)
    context = path[-1]
    chat = build_messages(context, PromptConfig(layout="turns"))
    text = "\n".join(m["content"] for m in chat[1:])
    assert text.count(context.initial_observation) == 1 and "Step 1 observation:\n(the task above)" in text
    for step, turn in enumerate(context.history, start=1):
        assert f"<action>{turn.action}</action>" in text
        if step > 1:
            assert f"Step {step} observation:\n{turn.observation}" in text
    assert chat[-1]["content"].startswith(f"Step 4 observation:\n{context.observation}")
    assert "- click[a]\n- click[b]\n- click[c]" in chat[-1]["content"] and chat[-1]["content"].endswith("<action>ACTION</action>.")
    assert window_start(0, 2) == 0 and window_start(5, 2) == 2 and window_start(3, 0) == 3
