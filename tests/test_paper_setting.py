"""The paper's setting (docs/paper-setting.md): reasoning replies and the probe entropy on the
tiny LLM, the offloaded KL reference, and the memory plan of the published recipe."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest
import torch

pytest.importorskip("transformers")

import bpo_envs  # noqa: E402,F401
from bpo_algos.memory_plan import load_config, plan  # noqa: E402
from bpo_algos.policy import Context, HFPolicy, PromptConfig  # noqa: E402
from bpo_algos.policy.base import plugin_entropy  # noqa: E402
from bpo_algos.policy.tiny import tiny_model_path  # noqa: E402
from bpo_envs.prompting import build_messages, parse_action  # noqa: E402

REASONING = PromptConfig(reasoning=True)


def webshop_context() -> tuple[gym.Env, Context]:
    env = gym.make("BPO-WebShop-v0", max_episode_steps=5)
    obs, info = env.reset(seed=0)
    return env, Context(info["task_id"], obs, tuple(info["admissible_actions"]), initial_observation=obs)


def test_reasoning_prompt_asks_for_think_then_action():
    _, context = webshop_context()
    system, user = build_messages(context, REASONING)
    assert "<think>" in system["content"] and "</think>" in system["content"] and "<action>ACTION</action>" in system["content"]
    assert "First reason" in user["content"]
    from bpo_experiments.presets import PRESETS

    envs = PRESETS["gpu"].envs
    assert envs["webshop"].max_new_tokens == 512 == envs["alfworld"].max_new_tokens  # verl-agent's response limit
    with pytest.raises(ValueError, match="think"):
        PromptConfig(reasoning=True, think_open="")


def test_reasoning_reply_without_an_action_is_an_invalid_action_observation():
    env, context = webshop_context()
    from bpo_envs.prompting import env_action

    reply = "<think>I should look for the cheapest one. <action>click[next]</action> maybe</think> done"
    assert parse_action(reply, REASONING) is None
    obs, reward, terminated, truncated, info = env.step(env_action(reply, REASONING))
    assert info.get("invalid_action") is True and not terminated and isinstance(obs, str)
    good = "<think>search first</think><action>" + context.admissible_actions[0] + "</action>"
    assert env_action(good, REASONING) == context.admissible_actions[0]


@pytest.fixture(scope="module")
def probe_policy():
    return HFPolicy(tiny_model_path(), max_new_tokens=12, seed=0, prompt=REASONING, decision_entropy="probe", probe_samples=5)


def test_probe_entropy_is_the_plugin_entropy_of_parsed_completions_and_is_charged(probe_policy):
    _, context = webshop_context()
    policy = probe_policy
    policy.seed(3)
    before = policy.meter.to_dict()
    (h,) = policy.decision_entropy([context])
    after = policy.meter.to_dict()
    prompt = len(policy.prompt_ids(context))
    assert after["gen_tokens"] == before["gen_tokens"] and after["prefill_tokens"] == before["prefill_tokens"]
    charged = after["score_tokens"] - before["score_tokens"]
    assert prompt + 5 <= charged <= prompt + 5 * 12  # the prompt once, then 5 completions
    # the same draws, by hand: 5 completions, parsed (None: unreadable), plug-in entropy
    policy.seed(3)
    (rows,) = policy.generate([context], 5)
    assert h == pytest.approx(plugin_entropy([parse_action(a.text, REASONING) for a in rows]))
    # the probe kept the prompt's KV: the backbone's sample there prefills nothing
    policy.decision_entropy([context])
    prefill = policy.meter.prefill_tokens
    policy.sample([context], 2, None)
    assert policy.meter.prefill_tokens == prefill
    with pytest.raises(ValueError, match="decision_entropy"):
        HFPolicy(tiny_model_path(), decision_entropy="sampled")
    with pytest.raises(ValueError, match="probe_samples"):
        HFPolicy(tiny_model_path(), decision_entropy="probe", probe_samples=1)


def test_offloaded_reference_equals_the_resident_one_and_stays_in_host_memory():
    from dataclasses import dataclass

    from bpo_algos.policy import Action

    @dataclass
    class Step:
        context: Context
        action: Action

    _, context = webshop_context()
    resident = HFPolicy(tiny_model_path(), max_new_tokens=8, seed=0)
    offloaded = HFPolicy(tiny_model_path(), max_new_tokens=8, seed=0, reference_offload=True)
    steps = [Step(context, a) for a in resident.sample([context], 3, None)[0]]
    want = resident.reference_token_logprobs(steps)
    got = offloaded.reference_token_logprobs(steps)
    assert torch.allclose(got, want, atol=1e-5)
    ref = offloaded._reference
    assert getattr(ref, "_bpo_offloaded", False) and all(p.device.type == "cpu" for p in ref.parameters())
    assert not any(p.requires_grad for p in ref.parameters())
    # the anchor does not move with training, and checkpoints keep it
    with torch.no_grad():
        for p in offloaded.trainable_parameters():
            p.add_(0.01)
    assert torch.allclose(offloaded.reference_token_logprobs(steps), want, atol=1e-5)
    assert any(k.startswith("_reference.") for k in offloaded.state_dict())
    offloaded.to("cpu")
    assert all(p.device.type == "cpu" for p in ref.parameters())


def test_memory_plan_published_recipe_fits_8x80_only_with_the_offloaded_reference():
    config = load_config("qwen2.5-7b-instruct")
    kwargs = {"gpus": 8, "gpu_gb": 80, "kl": True, "vllm": True}
    replicated = plan(config, **kwargs)
    offloaded = plan(config, **kwargs, reference_offload=True)
    assert not replicated.fits and offloaded.fits
    assert replicated.reference == pytest.approx(2 * replicated.params_b)  # 2 bytes a parameter, every GPU
    assert offloaded.reference == pytest.approx(2 * 2 * 152064 * 3584 / 1e9)  # two embedding-sized modules
    assert offloaded.total == pytest.approx(replicated.total - replicated.reference + offloaded.reference)


def test_gpu_presets_follow_the_published_recipe_and_fit_their_gpus():
    from dataclasses import replace

    from bpo_algos.memory_plan import check_preset_fits
    from bpo_experiments.presets import GPU_UPDATE_FLOPS, PRESETS
    from bpo_experiments.run_config import comparison_config

    gpu, lora = PRESETS["gpu"], PRESETS["gpu-lora"]
    for preset in (gpu, lora):
        assert preset.shared.kl_coef == 0.01 and preset.reasoning and preset.decision_entropy == "probe"
        assert all(preset.options[a].group_size == 8 for a in ("grpo", "rloo", "gigpo"))
        assert preset.trainer.updates == 150 and preset.budget_unit == "flops" and preset.trainer.max_grad_norm == 1.0
        assert {name: setup.budget for name, setup in preset.envs.items()} == GPU_UPDATE_FLOPS
        envs = comparison_config(preset).envs
        assert envs["alfworld"].policy.eval_temperature == 0.4 == envs["webshop"].policy.eval_temperature
        assert envs["swebench"].policy.eval_temperature == 0.0
        assert preset.envs["alfworld"].kwargs["invalid_penalty"] == 0.1 == preset.envs["webshop"].kwargs["invalid_penalty"]
        assert preset.envs["alfworld"].kwargs["max_episode_steps"] == 50 and preset.envs["webshop"].kwargs["max_episode_steps"] == 15
        assert envs["alfworld"].policy.max_model_len == 2048 + 512 and envs["webshop"].policy.max_model_len == 4096 + 512
        assert preset.envs["swebench"].eval_split == "rows" and preset.envs["swebench"].eval_tasks == 500
        assert set(check_preset_fits(comparison_config(preset))) == set(preset.envs)
    assert gpu.trainer.learning_rate == 1e-6 and not gpu.lora and gpu.trainer.fsdp and gpu.reference_offload
    assert (gpu.gpus, gpu.gpu_gb) == (8, 80.0)
    assert lora.lora and lora.trainer.learning_rate == 1e-5 and not lora.trainer.fsdp and (lora.gpus, lora.gpu_gb) == (1, 141.0)
    assert gpu.envs["webshop"] is not lora.envs["webshop"]  # flags edit one preset's envs only
    # bad input: a preset that cannot fit the GPUs given is refused with the plan
    with pytest.raises(ValueError, match=r"(?s)does not fit 1 x 80 GB.*\| no \|"):
        check_preset_fits(comparison_config(replace(gpu, gpus=1)), "gpu")
    with pytest.raises(ValueError, match="does not fit 8 x 80 GB"):
        check_preset_fits(comparison_config(replace(gpu, reference_offload=False, pool_size=64)), "gpu")


def test_evaluation_temperature_zero_is_greedy_and_restored(probe_policy):
    from bpo_algos.policy.base import evaluation_sampling

    _, context = webshop_context()
    policy = probe_policy
    policy.eval_temperature = 0.0
    try:
        with evaluation_sampling(policy):
            policy.seed(1)
            first = [a.token_ids for a in policy.generate([context], 3)[0]]
            policy.seed(2)
            second = [a.token_ids for a in policy.generate([context], 1)[0]]
        assert first[0] == first[1] == first[2] == second[0]  # greedy: no randomness
        assert policy._sample_temperature is None
        policy.seed(1)
        sampled = {a.token_ids for a in policy.generate([context], 6)[0]}
        assert len(sampled) > 1  # sampling at the policy's temperature again
    finally:
        policy.eval_temperature = None
    with pytest.raises(ValueError, match="temperature"):
        with policy.sampling_temperature(-1.0):
            pass


def test_power_plan_of_the_gpu_preset_detects_4_points_on_every_env():
    from bpo_experiments.gpu_plan import (
        ASSUMED_SPREAD,
        TARGET_MDE,
        choose,
        gpu_plan,
        markdown,
    )
    from bpo_experiments.presets import PRESETS
    from bpo_experiments.run_config import comparison_config

    preset = PRESETS["gpu"]
    comparison = comparison_config(preset)
    plan = gpu_plan(comparison)
    assert set(plan) == set(preset.envs)
    for env, row in plan.items():
        assert row["mde"] <= TARGET_MDE, (env, row)
        assert ASSUMED_SPREAD[env]["source"] in row["sd_source"]
        assert row["runs"] == row["seeds"] * len(preset.algorithms)
        assert row["flops_total"] == pytest.approx(row["runs"] * row["flops_per_run"]["total"])
        assert row["days_on_8xH100"] == pytest.approx(row["gpu_hours"] / 8 / 24)
        best = choose(comparison.envs[env])  # the preset's seeds and episodes are the cheapest that detect 4 points
        assert (best["seeds"], best["eval_episodes"]) == (row["seeds"], row["eval_episodes"]), (env, best, row)
    assert plan["swebench"]["eval_episodes"] == 1 and plan["swebench"]["eval_tasks"] == 500
    assert "| alfworld |" in markdown(plan)


def test_the_power_plans_spread_is_the_committed_cpu_runs_sd_of_bpo_minus_rloo_final_success():
    """``MEASURED_SPREAD`` is recomputed from the committed results, not trusted: the sd (n - 1)
    over seeds of BPO's final success minus RLOO's, paired by seed, on each run's primary split."""
    import json
    import statistics
    from pathlib import Path

    from bpo_experiments.gpu_plan import ASSUMED_SPREAD, MEASURED_SPREAD

    root = Path(__file__).resolve().parents[1]
    for env, measured in MEASURED_SPREAD.items():
        results = json.loads((root / measured["file"]).read_text())
        assert (results["treatment"], results["comparator"]) == ("bpo", "rloo")
        per_env = results["per_env"][env]
        finals = per_env["splits"][per_env["eval_split"]]["algorithms"]
        diffs = [b - r for b, r in zip(finals["bpo"]["per_seed"], finals["rloo"]["per_seed"], strict=True)]
        assert len(diffs) == measured["seeds"] == len(results["seeds"])
        assert measured["s_train"] == pytest.approx(statistics.stdev(diffs), abs=5e-5), env
        assert per_env["treatment_vs_comparator"]["metrics"]["final"]["sd"] == pytest.approx(statistics.stdev(diffs))
        assert measured["file"] in measured["source"] and f"{len(diffs) - 1}" in measured["source"]
    largest = max(m["s_train"] for m in MEASURED_SPREAD.values())
    assert {env: a["s_train"] for env, a in ASSUMED_SPREAD.items()} == dict.fromkeys(("alfworld", "webshop", "swebench"), largest)


def _built_preset(argv, monkeypatch):
    """The preset ``bpo-compare argv`` would run (nothing trains)."""
    from bpo_experiments import compare

    built = {}
    original = compare.build_preset

    def stop(*args, **kwargs):
        built["preset"] = original(*args, **kwargs)
        raise SystemExit(0)

    with monkeypatch.context() as patch, pytest.raises(SystemExit) as exc:
        patch.setattr(compare, "build_preset", stop)
        compare.main(argv)
    if "preset" not in built:
        raise exc.value
    return built["preset"]


def test_bad_paper_setting_flags_fail_before_training(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="decision_entropy"):
        _built_preset(["--smoke", "--out", str(tmp_path), "--decision-entropy", "sampled"], monkeypatch)
    with pytest.raises(SystemExit, match="probe_samples"):
        _built_preset(["--smoke", "--out", str(tmp_path), "--decision-entropy", "probe", "--probe-samples", "1"], monkeypatch)
    with pytest.raises(SystemExit, match="eval-temperature"):
        _built_preset(["--smoke", "--out", str(tmp_path), "--eval-temperature", "-1"], monkeypatch)
    with pytest.raises(SystemExit, match=r"(?s)gpu-lora preset does not fit 1 x 40 GB.*\| no \|"):
        _built_preset(["--preset", "gpu-lora", "--envs", "webshop", "--out", str(tmp_path), "--gpu-gb", "40"], monkeypatch)
    preset = _built_preset(["--preset", "gpu-lora", "--envs", "webshop", "--out", str(tmp_path), "--probe-samples", "6"], monkeypatch)
    assert preset.probe_samples == 6 and preset.reasoning and set(preset.envs) == {"webshop"}
    with pytest.raises(SystemExit, match="prompt-layout"):
        _built_preset(["--smoke", "--out", str(tmp_path), "--prompt-layout", "chat"], monkeypatch)


def test_the_prompt_layout_reaches_the_llm_policy(tmp_path, monkeypatch):
    """``--prompt-layout turns`` is the layout of the policy an env's runs start from."""
    from bpo_experiments.build import make_policy
    from bpo_experiments.run_config import policy_settings

    preset = _built_preset(["--smoke", "--out", str(tmp_path), "--policy", "tiny", "--prompt-layout", "turns"], monkeypatch)
    setup = next(iter(preset.envs.values()))
    settings = policy_settings(preset, setup)
    policy = make_policy(dataclasses.replace(settings, sft_epochs=0), setup, 0, [])
    assert settings.prompt_layout == "turns" and policy.prompts.config.layout == "turns"


def test_training_needs_the_gpus_the_preset_is_planned_for(monkeypatch):
    from types import SimpleNamespace

    from bpo_experiments import compare
    from bpo_experiments.presets import PRESETS

    compare.check_launch_fits(PRESETS["gpu"], "gpu")  # no CUDA here: nothing to check
    memory = {"gb": 80.0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=memory["gb"] * 1e9))
    with pytest.raises(SystemExit, match="planned for 8 GPUs"):
        compare.check_launch_fits(PRESETS["gpu"], "gpu")
    memory["gb"] = 24.0
    with pytest.raises(SystemExit, match="this GPU has 24 GB"):
        compare.check_launch_fits(PRESETS["gpu-lora"], "gpu-lora")
    memory["gb"] = 141.0
    compare.check_launch_fits(PRESETS["gpu-lora"], "gpu-lora")
