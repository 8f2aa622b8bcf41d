"""The BPO envs through SkyRL-gym's own registry and text-env interface."""

from __future__ import annotations

import gymnasium as gym
import pytest

import bpo_envs
from bpo_envs.prompting import Context, build_messages

skyrl_gym = pytest.importorskip("skyrl_gym")
skyrl = pytest.importorskip("bpo_envs.integrations.skyrl")
from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402


def _outputs(env, actions):
    return [
        (o["observations"], o["reward"], o["done"], o["metadata"], o["metadata"]["action"])
        for o in (env.step(a) for a in actions)
    ]


def test_every_bpo_id_is_in_skyrl_registry():
    for env_id in bpo_envs.ENV_IDS:
        assert env_id in skyrl_gym.registry
    env = skyrl_gym.make("BPO-TreeMDP-v0", env_config={"depth": 2, "n_actions": 3, "seed": 1}, extras={"seed": 0})
    assert isinstance(env, skyrl.SkyRLEnv) and isinstance(env, BaseTextEnv)
    assert env.env_id == "BPO-TreeMDP-v0" and env.env.unwrapped.depth == 2
    assert skyrl.register_skyrl_envs() == list(bpo_envs.ENV_IDS)  # idempotent


def test_webshop_expert_episode_matches_the_gym_env():
    env = skyrl_gym.make("BPO-WebShop-v0", env_config={}, extras={"task_id": 3})
    messages, meta = env.init([{"role": "user", "content": "a dataset prompt the env replaces"}])

    plain = gym.make("BPO-WebShop-v0")
    obs, info = plain.reset(options={"task_id": 3})
    context = Context(3, obs, tuple(info["admissible_actions"]), (), obs)
    assert messages == build_messages(context, env.prompt_config)  # the project's chat format
    assert meta == {"task_id": 3, "admissible_actions": info["admissible_actions"]}
    with pytest.raises(ValueError, match="summary"):  # SkyRL's chat holds the history: no "turns" layout
        skyrl_gym.make("BPO-WebShop-v0", env_config={"prompt_config": {"layout": "turns"}}, extras={"task_id": 3})

    expert = plain.unwrapped.expert_actions()
    outputs = _outputs(env, [f"I will search. <action>{a}</action>" for a in expert])
    total = 0.0
    for (observations, reward, done, metadata, sent), action in zip(outputs, expert, strict=True):
        obs, r, terminated, truncated, info = plain.step(action)
        total += reward
        assert sent == action and reward == r and done == (terminated or truncated)
        assert metadata["won"] == info["won"] and metadata["task_id"] == 3
        assert metadata["admissible_actions"] == info.get("admissible_actions")
        if not done:
            assert observations == [{"role": "user", "content": build_messages(
                Context(3, obs, tuple(info["admissible_actions"]), (), obs), env.prompt_config)[1]["content"]}]
    assert outputs[-1][2] and outputs[-1][3]["won"] and outputs[-1][0] == [] and total == 1.0
    assert env.get_metrics() == {"steps": len(expert), "won": 1.0}
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("<action>click[buy now]</action>")


def test_the_model_output_is_never_rewritten():
    # SkyRL-train trains on postprocessed_action's tokens whenever it is set: it must stay None so
    # that the generated text (tags, reasoning) and its sampling log-probs are what is trained
    env = skyrl_gym.make("BPO-WebShop-v0", env_config={}, extras={"task_id": 3})
    env.init(None)
    expert = gym.make("BPO-WebShop-v0")
    expert.reset(options={"task_id": 3})
    text = f"Let me think about it first.\n<action>{expert.unwrapped.expert_actions()[0]}</action>"
    out = env.step(text)
    assert out["postprocessed_action"] is None
    assert out["metadata"]["action"] == expert.unwrapped.expert_actions()[0] != text


def test_bad_model_output_is_an_observation():
    env = skyrl_gym.make("BPO-WebShop-v0", env_config={}, extras={"task_id": 0})
    env.init(None)
    out = env.step("no tags, just rambling")
    assert out["metadata"]["invalid_action"] and not out["done"] and out["reward"] == 0.0
    assert "Invalid action" in out["observations"][0]["content"]
    assert out["metadata"]["action"] == "no tags, just rambling"
    assert out["postprocessed_action"] is None


def test_snapshot_restore_pass_through_and_portable_state():
    env = skyrl_gym.make("BPO-WebShop-v0", env_config={}, extras={"task_id": 5})
    env.init(None)
    expert = env.env.unwrapped.expert_actions()
    tagged = [f"<action>{a}</action>" for a in expert]
    env.step(tagged[0])
    snap = env.snapshot()
    assert isinstance(snap, bpo_envs.Snapshot)
    state = env.portable_state()
    first = _outputs(env, tagged[1:])
    assert first[-1][3]["won"]

    env.restore(snap)  # the same instance
    assert env.turns == 1 and len(env.context.history) == 1
    assert _outputs(env, tagged[1:]) == first

    other = skyrl_gym.make("BPO-WebShop-v0", env_config={}, extras={"task_id": 0})
    other.init(None)
    other.restore(snap)  # another instance of the same env
    assert _outputs(other, tagged[1:]) == first

    resumed = skyrl_gym.make("BPO-WebShop-v0", env_config={}, extras={"state": state})
    messages, meta = resumed.init(None)  # a batch reset to a mid-episode state
    assert messages == build_messages(resumed.context, resumed.prompt_config)
    assert "Recent steps:" in messages[1]["content"] and f"Step 1 action: {expert[0]}" in messages[1]["content"]
    assert _outputs(resumed, tagged[1:]) == first

    with pytest.raises(ValueError, match="not taken by SkyRLEnv.snapshot"):
        env.restore(bpo_envs.snapshot(env.env))
    tree = skyrl_gym.make("BPO-TreeMDP-v0", env_config={"depth": 2}, extras={"seed": 0})
    tree.init(None)
    with pytest.raises(ValueError, match="cannot resume"):
        tree.restore(state)


def test_env_config_kwargs_and_bad_config():
    env = skyrl_gym.make("BPO-TreeMDP-v0", env_config={"depth": 2, "n_actions": 2, "seed": 4}, extras={"seed": 1})
    env.init(None)
    plain = gym.make("BPO-TreeMDP-v0", depth=2, n_actions=2, seed=4)
    plain.reset(seed=1)
    rewards = [env.step("<action>a1</action>")["reward"] for _ in range(2)]
    assert rewards == [plain.step("a1")[1] for _ in range(2)]
    assert env.max_turns == env.env.unwrapped.max_episode_steps
    with pytest.raises(ValueError, match="env_id"):
        skyrl.SkyRLEnv({}, {"task_id": 0})
    with pytest.raises(ValueError, match="task_id"):
        skyrl.SkyRLEnv({"env_id": "BPO-WebShop-v0"}, {}).init(None)
    with pytest.raises(TypeError, match="env_config must be a mapping"):
        skyrl.SkyRLEnv("BPO-WebShop-v0", {})


def test_omegaconf_env_config_as_skyrl_passes_it():
    omegaconf = pytest.importorskip("omegaconf")
    config = omegaconf.OmegaConf.create({"env_id": "BPO-TreeMDP-v0", "depth": 3})
    env = skyrl.SkyRLEnv(config, {"seed": 0})
    env.init(None)
    assert env.env.unwrapped.depth == 3


def test_missing_package_names_the_extra(monkeypatch):
    from importlib import metadata

    from bpo_envs.integrations import require

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    with pytest.raises(ImportError, match=r"pip install 'bpo-gym\[skyrl\]'"):
        require("skyrl_gym", "skyrl-gym", "skyrl", minimum="0.2")
    monkeypatch.setattr(metadata, "version", lambda name: "0.1.5")
    with pytest.raises(ImportError, match=r"found 0.1.5: pip install 'bpo-gym\[skyrl\]'"):
        require("skyrl_gym", "skyrl-gym", "skyrl", minimum="0.2")
