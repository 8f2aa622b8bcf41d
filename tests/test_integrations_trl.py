"""The BPO envs as TRL ``GRPOTrainer`` environments (the adapter, and TRL's own machinery on it)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
from pathlib import Path

import gymnasium as gym
import pytest

import bpo_envs  # noqa: F401  (registers the ids)
from bpo_envs.prompting import Context, build_messages

pytest.importorskip("trl")
pytest.importorskip("datasets")
trl_env = pytest.importorskip("bpo_envs.integrations.trl")

ROOT = Path(__file__).resolve().parents[1]


def _tools(instance):
    """The methods TRL turns into tools (its own rule: public functions but reset/get_reward)."""
    return [
        name
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def test_factory_class_exposes_one_act_tool_with_a_schema():
    from transformers.utils import get_json_schema

    env_class = trl_env.environment_factory("BPO-WebShop-v0")
    assert env_class.__name__ == "BPO_WebShop_v0"  # TRL's reward column name
    instance = env_class()
    assert _tools(instance) == ["act"]
    schema = get_json_schema(instance.act)
    assert schema["function"]["name"] == "act"
    assert schema["function"]["parameters"]["properties"]["action"]["type"] == "string"
    with pytest.raises(ValueError, match="unknown env id"):
        trl_env.environment_factory("BPO-Nope-v0")
    from bpo_envs.prompting import PromptConfig

    with pytest.raises(ValueError, match="summary"):  # TRL's conversation holds the history: no "turns" layout
        trl_env.environment_factory("BPO-WebShop-v0", prompt_config=PromptConfig(layout="turns"))


def test_expert_episode_reward_prompts_and_end():
    env_class = trl_env.environment_factory("BPO-WebShop-v0")
    dataset = trl_env.make_dataset(env_class, [2, 7])
    row = dataset[1]
    assert row["task_id"] == 7 and row["prompt"][0] == trl_env.system_message(env_class)
    env = env_class()
    first = env.reset(**row)  # TRL passes the whole row
    plain = gym.make("BPO-WebShop-v0")
    obs, info = plain.reset(options={"task_id": 7})
    context = Context(7, obs, tuple(info["admissible_actions"]), (), obs)
    assert first == build_messages(context, env_class.prompt_config, instruction=trl_env.TOOL_INSTRUCTION)[1]["content"]
    assert "Admissible actions:" in first and first.endswith(trl_env.TOOL_INSTRUCTION)

    expert = plain.unwrapped.expert_actions()
    for action in expert[:-1]:
        text = env.act(action)
        obs, *_ = plain.step(action)
        assert text.startswith("Current observation:\n" + obs) and "Task:" not in text
    assert env.get_reward() == 0.0
    last = env.act(expert[-1])
    assert "The episode is over (won, reward 1)" in last
    assert env.get_reward() == 1.0 and env.episode.won and env.episode.actions == expert
    assert env.act("click[buy now]").startswith("The episode is over")  # not sent to the env
    assert env.episode.calls_after_end == 1 and len(env.episode.rewards) == len(expert)

    env.reset(task_id=2)  # pooled instances are reset, the record starts over
    assert env.get_reward() == 0.0 and env.episode.actions == [] and env.episode.task_id == 2
    assert "Invalid action" in env.act("rubbish") and env.episode.invalid_actions == 1
    with pytest.raises(ValueError, match="neither a task_id nor a seed"):
        env.reset(prompt=[])


def test_snapshot_restore_and_resuming_rows():
    env_class = trl_env.environment_factory("BPO-WebShop-v0")
    env = env_class()
    env.reset(task_id=4)
    expert = env.env.unwrapped.expert_actions()
    env.act(expert[0])
    snap = trl_env.snapshot(env)
    state = trl_env.portable_state(env)
    tail = [env.act(a) for a in expert[1:]]
    assert env.get_reward() == 1.0

    other = env_class()
    other.reset(task_id=0)
    trl_env.restore(other, snap)  # fork the episode into another instance
    assert [other.act(a) for a in expert[1:]] == tail and other.get_reward() == 1.0

    dataset = trl_env.make_dataset(env_class, [4]).add_column("state", [state])
    resumed = env_class()
    first = resumed.reset(**dataset[0])  # a batch row reset to a mid-episode state
    assert "Task:" in first and f"Step 1 action: {expert[0]}" in first
    assert [resumed.act(a) for a in expert[1:]] == tail
    assert resumed.get_reward() == 1.0 and resumed.episode.resumed
    with pytest.raises(ValueError, match="not portable_state"):
        resumed.reset(state=b"junk")


def test_several_envs_in_one_run():
    factories = trl_env.environment_factories(
        {"shop": "BPO-WebShop-v0", "tree": ("BPO-TreeMDP-v0", {"depth": 1, "n_actions": 2, "seed": 0})}
    )
    rows = trl_env.make_dataset(factories["tree"], [0], environment="tree")
    assert rows[0]["environment"] == "tree"
    tree = factories["tree"]()
    tree.reset(seed=0)
    tree.act("a0")
    plain = gym.make("BPO-TreeMDP-v0", depth=1, n_actions=2, seed=0)
    plain.reset(seed=0)
    assert tree.get_reward() == plain.step("a0")[1] and tree.episode.done


@pytest.mark.slow
def test_grpo_trainer_takes_the_factory():
    """TRL's own constructor: the env's get_reward becomes a reward column, act the only tool."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from bpo_algos.policy.tiny import tiny_model_path

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    path = tiny_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.padding_side = "left"
    env_class = trl_env.environment_factory("BPO-WebShop-v0")
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        args=GRPOConfig(output_dir="/tmp/bpo-trl-test", max_steps=1, per_device_train_batch_size=2, num_generations=2,
                        use_cpu=True, report_to="none", save_strategy="no"),
        train_dataset=trl_env.make_dataset(env_class, [0, 1]),
        processing_class=tokenizer,
        environment_factory=env_class,
    )
    assert trainer.reward_func_names == ["BPO_WebShop_v0"]
    assert [t.__name__ for t in trainer.tools] == ["act"]


def _load_example():
    spec = importlib.util.spec_from_file_location("trl_grpo_example", ROOT / "examples" / "trl_grpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env_args", "stepped"),
    [
        # the example's default: WebShop (the tiny model rarely writes a valid call yet: rewards 0)
        ([], False),
        # short observations and actions: the warm-started model calls act, leaves pay rewards
        (["--env", "BPO-TreeMDP-v0", "--env-kwargs", '{"depth": 2, "n_actions": 3}', "--warm-turns", "2",
          "--max-completion-length", "512", "--max-turns", "4"], True),
    ],
    ids=["webshop", "treemdp"],
)
def test_example_trains_with_rewards_from_the_env(tmp_path, env_args, stepped):
    """examples/trl_grpo.py end to end with real TRL: 2 GRPO updates of the tiny Qwen2, seeded."""
    out = tmp_path / "summary.json"
    _load_example().main(
        [*env_args, "--steps", "2", "--tasks", "4", "--out", str(out), "--output-dir", str(tmp_path / "run")]
    )
    summary = json.loads(out.read_text())
    steps = [log for log in summary["logs"] if "loss" in log]
    assert len(steps) == 2
    episodes = summary["episodes"]
    assert len(episodes) == 2 * 4  # one episode per rollout: 2 updates x 4 generations
    assert {e["task_id"] for e in episodes} <= {0, 1, 2, 3}  # reset from the rows' task_ids
    for i, log in enumerate(steps):  # TRL's reward is the envs' return, rollout by rollout
        batch = episodes[4 * i : 4 * i + 4]
        assert float(log[summary["reward_column"]]) == pytest.approx(sum(e["reward"] for e in batch) / 4, abs=1e-4)
        assert float(log["reward"]) == pytest.approx(float(log[summary["reward_column"]]), abs=1e-4)
    if stepped:
        assert sum(len(e["actions"]) for e in episodes) > 0  # TRL's tool calls stepped the env
        assert any(e["done"] for e in episodes) and any(e["reward"] > 0 for e in episodes)


def test_make_dataset_takes_the_envs_declared_task_ids():
    env_class = trl_env.environment_factory("BPO-TreeMDP-v0", depth=3, n_actions=2, seed=0, n_tasks=4)
    assert list(trl_env.make_dataset(env_class)["task_id"]) == list(gym.make("BPO-TreeMDP-v0", n_tasks=4).unwrapped.task_ids())
