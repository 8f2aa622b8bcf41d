"""The main job: BPO vs GRPO vs RLOO at matched compute, over envs and seeds.

For every env and seed, one initial policy (built once, warm-started by behaviour cloning on the
env's expert trajectories when it is an LLM) is copied to each algorithm, which then trains with
``bpo_algos.Trainer`` under the same optimizer, learning rate, task sequence and per-update
budget in one compute unit (``--budget-unit``; the others are reported). Then:

* final success: every algorithm's final policy is evaluated on the same held-out tasks;
* gradient-norm variance, measured the same way for every algorithm: at the initial policy,
  ``--grad-batches`` independent batches at the same budget (variance of the gradient vector,
  ``tr Cov(g)``, and of its norm), plus the variance of the logged gradient norms over training;
* ``updates_to_target``: updates each algorithm needs for its (seed-averaged, smoothed) batch
  success to reach the best baseline's final training success.

Writes to ``--out``: ``results.json``, ``results.md`` (means and 95% intervals over seeds) and
PNG plots (success vs updates, success vs compute, gradient-norm variance). ``--resume``
continues an interrupted run: finished runs are kept, unfinished ones resume from their last
checkpoint.

    python scripts/compare.py --out results/compare            # CPU default (~10 min)
    python scripts/compare.py --smoke --out /tmp/compare       # < 2 min (CI)
    python scripts/compare.py --preset gpu --out results/gpu   # the paper's setting
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import bpo_envs  # noqa: F401 - registers the ids
from baselines import GRPO, RLOO
from bpo_algos import BPO, Budget, EnvPool, TabularPolicy, Trainer, TrainerConfig
from bpo_algos.algorithm import Algorithm
from bpo_algos.diagnostics import gradient_samples, variance_summary

ALGORITHMS = ("bpo", "grpo", "rloo")
BASELINES = ("grpo", "rloo")


# ---- configuration ---------------------------------------------------------------------
@dataclass
class EnvSetup:
    """How one env is made and which tasks train and evaluate."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    train_tasks: int = 16
    eval_tasks: int = 16
    workers: int = 1
    """Envs stepped in parallel threads (worth it where steps wait on subprocesses)."""
    policy: str | None = None
    """Overrides the preset's policy for this env."""
    sft_epochs: int | None = None
    """Overrides the preset's behaviour-cloning epochs for this env."""
    eval_split: str = "held-out"
    """``held-out``: final success on tasks never trained on; ``train``: on the train tasks
    (fresh rollouts), for settings where the model cannot generalise from so few tasks."""


@dataclass
class Preset:
    """A full experiment setting; command-line flags override its fields."""

    envs: dict[str, EnvSetup]
    policy: str = "tabular"
    seeds: tuple[int, ...] | dict[str, tuple[int, ...]] = (0, 1, 2)
    """Seeds of every env, or per env (as ``updates``, ``eval_episodes`` and ``grad_batches``)."""
    updates: int | dict[str, int] = 30
    budget_unit: str = "env_steps"
    budget: dict[str, float] = field(default_factory=dict)
    """Per-update budget per env (in ``budget_unit``)."""
    group_size: int = 8
    backbones: int = 2
    branch_factor: int = 4
    entropy_quantile: float = 0.8
    max_branch_points: int = 1
    learning_rate: float = 0.1
    optimizer: str = "adam"
    max_grad_norm: float | None = None
    aggregation: str = "token-mean"
    eval_episodes: int | dict[str, int] = 2
    grad_batches: int | dict[str, int] = 8
    sft_epochs: int = 0
    """Behaviour-cloning epochs on the env experts' trajectories of the train tasks."""
    sft_lr: float = 1e-3
    temperature: float = 1.0
    lora: bool = False
    vllm: bool = False
    pool_size: int = 4
    tensorboard: bool = False
    """Also log every run to TensorBoard (``runs/<env>/<algorithm>/seed<s>/tensorboard``)."""
    wandb_project: str | None = None
    """Also log every run to this W&B project."""
    torch_threads: int | None = None
    """CPU threads for torch (None: torch's default). One thread makes small models faster
    (no synchronisation) and their training bit-reproducible."""

    def for_env(self, name: str, env: str) -> Any:
        """Field ``name`` for ``env``: its per-env value when the field is a dict (the field's
        default for an env the dict does not name)."""
        value = getattr(self, name)
        if isinstance(value, dict):
            return value[env] if env in value else Preset.__dataclass_fields__[name].default
        return value


PRESETS: dict[str, Preset] = {
    # About 10 minutes on a 2-core CPU: the small text-scoring model (TextScorerPolicy, ~1M
    # parameters) warm-started by behaviour cloning on the env experts, short horizons, small
    # task sets. ALFWorld is scored on its training games (fresh rollouts): 16 games of demos do
    # not teach this model unseen rooms (0% held-out), so held-out success would show nothing.
    "cpu": Preset(
        envs={
            "webshop": EnvSetup("BPO-WebShop-v0", {"max_episode_steps": 15}, train_tasks=64, eval_tasks=64),
            "alfworld": EnvSetup("BPO-ALFWorld-v0", {"max_episode_steps": 20}, train_tasks=16, eval_tasks=16, eval_split="train", sft_epochs=20),
        },
        policy="scorer",
        sft_epochs=4,
        sft_lr=3e-3,
        seeds={"webshop": (0, 1, 2, 3, 4, 5), "alfworld": (0, 1, 2)},
        budget={"webshop": 256, "alfworld": 320},
        updates={"webshop": 30, "alfworld": 12},
        learning_rate=1e-3,
        eval_episodes=4,
        grad_batches={"webshop": 16, "alfworld": 8},
        torch_threads=1,
    ),
    # The first CPU setting: tabular policies, agent-like TreeMDP from its agent prior, WebShop from uniform.
    "cpu-tabular": Preset(
        envs={
            "treemdp": EnvSetup(
                "BPO-TreeMDP-v0",
                {"depth": 8, "n_actions": 3, "decisive_levels": (5,), "observe": "state", "n_tasks": 16, "seed": 0},
                train_tasks=16,
                eval_tasks=16,
                policy="tabular-prior",
            ),
            "webshop": EnvSetup("BPO-WebShop-v0", {"max_episode_steps": 15}, train_tasks=16, eval_tasks=16),
        },
        budget={"treemdp": 512, "webshop": 512},
        updates=40,
    ),
    # The tiny offline Qwen2 model, warm-started by behaviour cloning on WebShop's expert, with
    # short episodes: the LLM code path end to end on a CPU (about 20 s an update here).
    "cpu-llm": Preset(
        envs={"webshop": EnvSetup("BPO-WebShop-v0", {"max_episode_steps": 8}, train_tasks=8, eval_tasks=8)},
        policy="tiny",
        budget={"webshop": 48},
        seeds=(0, 1),
        updates=8,
        group_size=4,
        backbones=2,
        branch_factor=2,
        learning_rate=1e-4,
        optimizer="adamw",
        max_grad_norm=1.0,
        sft_epochs=2,
        grad_batches=3,
        eval_episodes=2,
        pool_size=4,
    ),
    "smoke": Preset(
        envs={
            "treemdp": EnvSetup(
                "BPO-TreeMDP-v0",
                {"depth": 6, "n_actions": 3, "decisive_levels": (3,), "observe": "state", "n_tasks": 4, "seed": 0},
                train_tasks=4,
                eval_tasks=4,
            ),
            "webshop": EnvSetup(
                "BPO-WebShop-v0", {"max_episode_steps": 10}, train_tasks=8, eval_tasks=8, policy="scorer", sft_epochs=2
            ),
        },
        sft_lr=3e-3,
        budget={"treemdp": 128, "webshop": 128},
        seeds=(0, 1),
        updates=4,
        grad_batches=3,
        eval_episodes=1,
    ),
    # The paper's setting: a 7-8B instruct model with vLLM generation, group 8, the common
    # ALFWorld/WebShop step limits (50 and 15).
    "gpu": Preset(
        envs={
            "alfworld": EnvSetup("BPO-ALFWorld-v0", {"max_episode_steps": 50}, train_tasks=512, eval_tasks=128, workers=8),
            "webshop": EnvSetup("BPO-WebShop-v0", {"max_episode_steps": 15, "split": "train"}, train_tasks=2048, eval_tasks=256),
            "swebench": EnvSetup("BPO-SWEBench-v0", {"max_episode_steps": 50}, train_tasks=64, eval_tasks=16, workers=8),
        },
        policy="Qwen/Qwen2.5-7B-Instruct",
        budget_unit="gen_tokens",
        budget={"alfworld": 400_000, "webshop": 150_000, "swebench": 600_000},
        updates=150,
        learning_rate=1e-6,
        optimizer="adamw",
        max_grad_norm=1.0,
        temperature=1.0,
        lora=False,
        vllm=True,
        pool_size=64,
        eval_episodes=1,
        grad_batches=4,
    ),
}


# ---- policies --------------------------------------------------------------------------
def make_policy(preset: Preset, setup: EnvSetup, seed: int, tasks: list[Any]) -> Any:
    """The initial policy of one (env, seed): the same object state for every algorithm.

    ``scorer`` is the small :class:`~bpo_algos.policy.scorer.TextScorerPolicy`; ``tabular``
    starts uniform; ``tabular-prior`` starts from the env's ``agent_prior()``
    (TreeMDP: confident on routine decisions, uniform on decisive ones, as an SFT-warmed agent
    is); anything else is an LLM (``tiny``, ``smollm2``, a model name or folder).
    """
    name = setup.policy or preset.policy
    if name == "scorer":
        from bpo_algos.policy.scorer import TextScorerPolicy

        policy = TextScorerPolicy(temperature=preset.temperature, seed=seed)
        return warm_start(policy, preset, setup, tasks, seed)
    if name == "tabular":
        return TabularPolicy(temperature=preset.temperature, seed=seed)
    if name == "tabular-prior":
        env = env_factory(setup)()
        prior = env.unwrapped.agent_prior()
        env.close()
        return TabularPolicy.from_logits(prior, temperature=preset.temperature, seed=seed)
    from bpo_algos.policy import HFPolicy

    model = name
    if model == "tiny":
        from bpo_algos.policy.tiny import tiny_model_path

        model = str(tiny_model_path())
    elif model == "smollm2":
        from bpo_algos.policy.tiny import smollm2_path

        model = str(smollm2_path())
    torch.manual_seed(seed)
    if preset.vllm:
        from bpo_algos.policy import VLLMPolicy

        policy = VLLMPolicy(model, temperature=preset.temperature, lora=preset.lora, seed=seed)
    else:
        policy = HFPolicy(model, temperature=preset.temperature, lora=preset.lora, seed=seed)
    return warm_start(policy, preset, setup, tasks, seed)


def warm_start(policy: Any, preset: Preset, setup: EnvSetup, tasks: list[Any], seed: int) -> Any:
    """Behaviour cloning on the env expert's trajectories of ``tasks`` (``sft_epochs``)."""
    epochs = preset.sft_epochs if setup.sft_epochs is None else setup.sft_epochs
    if epochs:
        from bpo_algos.policy.sft import behaviour_cloning, expert_demos

        demos = expert_demos(env_factory(setup), tasks, seed=seed)
        behaviour_cloning(policy, demos, epochs=epochs, lr=preset.sft_lr, seed=seed)
    return policy


def make_algorithm(name: str, preset: Preset, seed: int) -> Algorithm:
    common = {"aggregation": preset.aggregation, "seed": seed, "max_parallel_trees": max(1, preset.pool_size // 4)}
    if name == "bpo":
        return BPO(
            backbones=preset.backbones,
            branch_factor=preset.branch_factor,
            entropy_quantile=preset.entropy_quantile,
            max_branch_points=preset.max_branch_points,
            **common,
        )
    if name == "grpo":
        return GRPO(group_size=preset.group_size, **common)
    if name == "rloo":
        return RLOO(group_size=preset.group_size, **common)
    raise ValueError(f"unknown algorithm {name!r}; choose from {ALGORITHMS}")


# ---- one run ---------------------------------------------------------------------------
def env_factory(setup: EnvSetup) -> Callable[[], gym.Env]:
    return lambda: gym.make(setup.env_id, **setup.kwargs)


def task_split(setup: EnvSetup) -> tuple[list[Any], list[Any]]:
    """Deterministic train and held-out eval tasks (the same for every algorithm and seed)."""
    env = env_factory(setup)()
    ids = list(env.unwrapped.task_ids())
    env.close()
    rng = np.random.default_rng(12345)
    order = [ids[i] for i in rng.permutation(len(ids))]
    train = order[: setup.train_tasks]
    if setup.eval_split == "train":
        return train, train[: setup.eval_tasks]
    if setup.eval_split != "held-out":
        raise ValueError(f"eval_split must be 'held-out' or 'train', got {setup.eval_split!r}")
    rest = order[setup.train_tasks :] or order
    return train, rest[: setup.eval_tasks]


def evaluate(policy: Any, pool: EnvPool, tasks: list[Any], episodes: int, seed: int) -> float:
    """Mean success of ``episodes`` independent rollouts per eval task (sampled, as trained)."""
    if episodes < 2:  # a group needs two members; evaluate two and average
        episodes = 2
    batch = RLOO(group_size=episodes, seed=seed).collect(policy, pool, tasks)
    return batch.success_rate()


def run_dir(out: Path, env: str, algorithm: str, seed: int) -> Path:
    return out / "runs" / env / algorithm / f"seed{seed}"


def run_one(
    out: Path,
    preset: Preset,
    env_name: str,
    algorithm_name: str,
    seed: int,
    initial: Any,
    train_tasks: list[Any],
    eval_tasks: list[Any],
    progress: bool,
) -> dict[str, Any]:
    """Train one algorithm from ``initial`` and measure it; cached in ``run.json``."""
    folder = run_dir(out, env_name, algorithm_name, seed)
    done = folder / "run.json"
    if done.exists():
        return json.loads(done.read_text())
    setup = preset.envs[env_name]
    pool = EnvPool([env_factory(setup)] * preset.pool_size, workers=setup.workers)
    budget = Budget(preset.budget_unit, preset.budget[env_name])
    policy = copy.deepcopy(initial)
    start = time.perf_counter()
    try:
        # gradient variance at the initial policy, the same measurement for every algorithm
        probe = make_algorithm(algorithm_name, preset, seed + 1000)
        grads = variance_summary(gradient_samples(probe, policy, pool, train_tasks, preset.for_env('grad_batches', env_name), budget))
        algorithm = make_algorithm(algorithm_name, preset, seed)
        config = TrainerConfig(
            updates=preset.for_env('updates', env_name),
            tasks_per_update=len(train_tasks),
            budget=budget,
            learning_rate=preset.learning_rate,
            optimizer=preset.optimizer,
            max_grad_norm=preset.max_grad_norm,
            seed=seed,
            out_dir=folder,
            progress=progress,
            tensorboard=preset.tensorboard,
            wandb_project=preset.wandb_project,
        )
        history = Trainer(algorithm, policy, pool, train_tasks, config).train()
        final_success = evaluate(policy, pool, eval_tasks, preset.for_env('eval_episodes', env_name), seed + 2000)
    finally:
        pool.close()
    norms = np.array([row["grad_norm"] for row in history])
    result = {
        "env": env_name,
        "algorithm": algorithm_name,
        "seed": seed,
        "final_success": final_success,
        "curve": [row["success"] for row in history],
        "returns": [row["return"] for row in history],
        "compute_per_update": {k: float(np.mean([row["compute"][k] for row in history])) for k in history[0]["compute"]},
        "compute_cumulative": [row["compute_total"][preset.budget_unit] for row in history],
        "grad_norm_var_initial": grads["grad_norm_var"],
        "grad_trace_var_initial": grads["trace_var"],
        "grad_noise_to_signal_initial": grads["noise_to_signal"],
        "grad_norm_var_train": float(norms.var(ddof=1)) if len(norms) > 1 else 0.0,
        "seconds": time.perf_counter() - start,
    }
    done.write_text(json.dumps(result))
    return result


# ---- aggregation -----------------------------------------------------------------------
def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of a 95% t-interval over seeds (0 for one seed)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), 0.0
    half = float(_T975.get(len(x) - 1, 1.96) * x.std(ddof=1) / math.sqrt(len(x)))
    return float(x.mean()), half


# two-sided 95% Student-t quantiles by degrees of freedom (1.96 beyond the table)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def smooth(curve: np.ndarray, window: int = 3) -> np.ndarray:
    out = np.convolve(curve, np.ones(window) / window, mode="full")[: len(curve)]
    counts = np.minimum(np.arange(1, len(curve) + 1), window)
    return out * window / counts


def aggregate(runs: list[dict[str, Any]], preset: Preset, envs: list[str]) -> dict[str, Any]:
    unit = preset.budget_unit
    per_env: dict[str, Any] = {}
    for env in envs:
        rows = {a: [r for r in runs if r["env"] == env and r["algorithm"] == a] for a in ALGORITHMS}
        mean_curves = {a: np.mean([r["curve"] for r in rows[a]], axis=0) for a in ALGORITHMS if rows[a]}
        final_train = {a: float(np.mean(c[-3:])) for a, c in mean_curves.items()}
        target = max(final_train[b] for b in BASELINES if b in final_train)
        env_result: dict[str, Any] = {
            "budget": preset.budget[env],
            "target_success": target,
            "seeds": list(preset.for_env("seeds", env)),
            "algorithms": {},
        }
        for a, rs in rows.items():
            if not rs:
                continue
            reached = np.nonzero(smooth(mean_curves[a]) >= target - 1e-9)[0]
            success, ci = mean_ci([r["final_success"] for r in rs])
            env_result["algorithms"][a] = {
                "success": success,
                "success_ci95": ci,
                "success_per_seed": [r["final_success"] for r in rs],
                "final_train_success": final_train[a],
                "compute": {k: float(np.mean([r["compute_per_update"][k] for r in rs])) for k in rs[0]["compute_per_update"]},
                "curve": mean_curves[a].tolist(),
                "compute_curve": np.mean([r["compute_cumulative"] for r in rs], axis=0).tolist(),
                "grad_norm_var": float(np.mean([r["grad_norm_var_initial"] for r in rs])),
                "grad_trace_var": float(np.mean([r["grad_trace_var_initial"] for r in rs])),
                "grad_noise_to_signal": float(np.median([r.get("grad_noise_to_signal_initial", np.nan) for r in rs])),
                "grad_norm_var_train": float(np.mean([r["grad_norm_var_train"] for r in rs])),
                "updates_to_target": int(reached[0]) + 1 if len(reached) else None,
                "budget_used_ratio": float(np.mean([r["compute_per_update"][unit] for r in rs]) / preset.budget[env]),
            }
        env_result["bpo_vs_best_baseline"] = paired_comparison(rows, env_result["algorithms"])
        env_result["eval_split"] = preset.envs[env].eval_split
        per_env[env] = env_result
    # across envs: the mean of the per-env figures (curves resampled to a common progress grid
    # when the envs ran different numbers of updates)
    overall: dict[str, Any] = {}
    for a in ALGORITHMS:
        items = [per_env[e]["algorithms"][a] for e in envs if a in per_env[e]["algorithms"]]
        if not items:
            continue
        length = max(len(i["curve"]) for i in items)
        grid = np.linspace(0.0, 1.0, length)
        curves = [np.interp(grid, np.linspace(0.0, 1.0, len(i["curve"])), i["curve"]) for i in items]
        overall[a] = {
            "success": float(np.mean([i["success"] for i in items])),
            "compute": {k: float(np.mean([i["compute"][k] for i in items])) for k in items[0]["compute"]},
            "curve": np.mean(curves, axis=0).tolist(),
            "grad_norm_var": float(np.mean([i["grad_norm_var"] for i in items])),
            "updates_to_target": [i["updates_to_target"] for i in items],
        }
    seeds = sorted({s for e in envs for s in preset.for_env("seeds", e)})
    return {"budget_unit": unit, "algorithms": overall, "per_env": per_env, "envs": envs, "seeds": seeds, "preset": _preset_dict(preset)}


def paired_comparison(rows: dict[str, list[dict[str, Any]]], summary: dict[str, Any]) -> dict[str, Any] | None:
    """BPO against the best baseline (highest mean final success), paired by seed.

    ``success_diff``: mean over seeds of ``success_BPO(s) - success_best(s)`` and its 95%
    t-interval (the same initial policy and tasks per seed, so seed-to-seed spread cancels);
    ``grad_norm_var_ratio`` / ``grad_trace_var_ratio``: BPO's over the best baseline's, at the
    initial policy and the same budget (the aim is <= 0.5); ``grad_norm_var_ratio_vs`` gives it
    against every baseline. RLOO's advantages have BPO's scale (returns minus a baseline), GRPO's
    are divided by the group's return std, so its gradients are larger by design.
    """
    baselines = [b for b in BASELINES if b in summary]
    if "bpo" not in summary or not baselines:
        return None
    best = max(baselines, key=lambda b: summary[b]["success"])
    by_seed = {r["seed"]: r["final_success"] for r in rows[best]}
    diffs = [r["final_success"] - by_seed[r["seed"]] for r in rows["bpo"] if r["seed"] in by_seed]
    diff, ci = mean_ci(diffs) if diffs else (float("nan"), float("nan"))

    def ratio(key: str, baseline: str) -> float:
        return summary["bpo"][key] / summary[baseline][key] if summary[baseline][key] > 0 else float("nan")

    return {
        "best_baseline": best,
        "success_diff": diff,
        "success_diff_ci95": ci,
        "success_diff_per_seed": diffs,
        "grad_norm_var_ratio": ratio("grad_norm_var", best),
        "grad_trace_var_ratio": ratio("grad_trace_var", best),
        "grad_norm_var_ratio_vs": {b: ratio("grad_norm_var", b) for b in baselines},
        "noise_to_signal_ratio_vs": {b: ratio("grad_noise_to_signal", b) for b in baselines},
    }


def _preset_dict(preset: Preset) -> dict[str, Any]:
    d = asdict(preset)
    return json.loads(json.dumps(d, default=str))


def markdown(results: dict[str, Any]) -> str:
    unit = results["budget_unit"]
    lines = [
        "# BPO vs GRPO vs RLOO at matched compute",
        "",
        f"Budget unit: `{unit}` per update; seeds {results['seeds']}; means with 95% t-intervals over seeds.",
        "`success`: final policy, sampled, on held-out tasks (or on the train tasks where the env says so); "
        "`grad-norm var`: variance of the gradient norm over "
        "independent batches at the initial policy (same budget); `noise/signal`: tr Cov(g) / ||E g||^2 there "
        "(median over seeds; scale-free, so GRPO's std scaling does not count); `updates to target`: updates to reach the best "
        "baseline's final training success.",
        "",
    ]
    for env, er in results["per_env"].items():
        lines += [
            f"## {env} (budget {er['budget']} {unit}/update, target {er['target_success']:.3f}, "
            f"success on {er.get('eval_split', 'held-out')} tasks, seeds {er.get('seeds')})",
            "",
            f"| algorithm | success | {unit}/update | budget used | leaves/update | env steps/update | grad-norm var | tr Cov(g) "
            "| noise/signal | updates to target |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for a, r in er["algorithms"].items():
            lines.append(
                f"| {a} | {r['success']:.3f} ± {r['success_ci95']:.3f} | {r['compute'][unit]:.0f} | {r['budget_used_ratio']:.2f} "
                f"| {r['compute']['leaves']:.1f} | {r['compute']['env_steps']:.0f} | {r['grad_norm_var']:.3g} "
                f"| {r['grad_trace_var']:.3g} | {r.get('grad_noise_to_signal', float('nan')):.3g} "
                f"| {r['updates_to_target'] if r['updates_to_target'] is not None else 'not reached'} |"
            )
        paired = er.get("bpo_vs_best_baseline")
        if paired:
            lines += [
                "",
                f"BPO − {paired['best_baseline']} (the best baseline), paired by seed: success "
                f"{paired['success_diff']:+.3f} ± {paired['success_diff_ci95']:.3f}; gradient-norm variance "
                f"{paired['grad_norm_var_ratio']:.2f}×, tr Cov(g) {paired['grad_trace_var_ratio']:.2f}× the baseline's "
                "(gradient-norm variance against each baseline: "
                + ", ".join(f"{b} {v:.2f}×" for b, v in paired["grad_norm_var_ratio_vs"].items())
                + "; noise/signal: "
                + ", ".join(f"{b} {v:.2f}×" for b, v in paired["noise_to_signal_ratio_vs"].items())
                + ").",
            ]
        lines.append("")
    return "\n".join(lines) + "\n"


def plots(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(results["per_env"])
    paths = []
    fig, axes = plt.subplots(2, len(envs), figsize=(5 * len(envs), 7), squeeze=False)
    for j, env in enumerate(envs):
        for a, r in results["per_env"][env]["algorithms"].items():
            axes[0][j].plot(range(1, len(r["curve"]) + 1), smooth(np.array(r["curve"])), label=a)
            axes[1][j].plot(r["compute_curve"], smooth(np.array(r["curve"])), label=a)
        axes[0][j].set(title=f"{env}: success vs updates", xlabel="update", ylabel="batch success (smoothed)")
        axes[1][j].set(title=f"{env}: success vs compute", xlabel=results["budget_unit"], ylabel="batch success (smoothed)")
        axes[0][j].legend()
        axes[1][j].legend()
    fig.tight_layout()
    paths.append(out / "success.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(2.5 + 2 * len(envs), 4))
    width = 0.25
    for i, a in enumerate(ALGORITHMS):
        values = [results["per_env"][e]["algorithms"].get(a, {}).get("grad_norm_var", np.nan) for e in envs]
        ax.bar(np.arange(len(envs)) + (i - 1) * width, values, width, label=a)
    ax.set_xticks(np.arange(len(envs)), envs)
    ax.set(title="gradient-norm variance at the initial policy (same budget)", ylabel="Var ||g|| (log scale)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "grad_norm_variance.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


# ---- main ------------------------------------------------------------------------------
def build_preset(args: argparse.Namespace) -> Preset:
    name = "smoke" if args.smoke else args.preset
    preset = copy.deepcopy(PRESETS[name])
    if args.envs:
        unknown = [e for e in args.envs if e not in preset.envs and e not in PRESETS["gpu"].envs]
        if unknown:
            raise SystemExit(f"unknown env(s) {unknown}; known: {sorted(set(preset.envs) | set(PRESETS['gpu'].envs))}")
        preset.envs = {e: preset.envs.get(e) or PRESETS["gpu"].envs[e] for e in args.envs}
        for e in args.envs:
            preset.budget.setdefault(e, PRESETS["gpu"].budget.get(e, 512))
    for key in ("policy", "updates", "budget_unit", "learning_rate", "group_size", "backbones", "branch_factor", "sft_epochs", "grad_batches"):
        value = getattr(args, key)
        if value is not None:
            setattr(preset, key, value)
    if args.seeds is not None:
        preset.seeds = tuple(args.seeds)
    preset.tensorboard = preset.tensorboard or args.tensorboard
    preset.wandb_project = args.wandb_project or preset.wandb_project
    import importlib.util

    for wanted, package in ((preset.tensorboard, "tensorboard"), (preset.wandb_project, "wandb")):
        if wanted and importlib.util.find_spec(package) is None:  # fail before hours of training, not after
            raise SystemExit(f"logging to {package} needs `pip install {package}`")
    if args.budget is not None:
        preset.budget = {e: args.budget for e in preset.envs}
    Budget(preset.budget_unit, 1)  # validates the unit
    return preset


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/compare", help="output folder")
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    parser.add_argument("--smoke", action="store_true", help="the smoke preset (< 2 min; CI)")
    parser.add_argument("--envs", nargs="+", help="env names (default: the preset's)")
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--updates", type=int)
    parser.add_argument("--budget-unit", choices=("env_steps", "gen_tokens", "leaves"))
    parser.add_argument("--budget", type=float, help="per-update budget (every env)")
    parser.add_argument("--policy", help="scorer | tabular | tiny | smollm2 | a model name or folder")
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--group-size", type=int, help="GRPO/RLOO N")
    parser.add_argument("--backbones", type=int, help="BPO K0")
    parser.add_argument("--branch-factor", type=int, help="BPO K")
    parser.add_argument("--sft-epochs", type=int, help="behaviour-cloning epochs before RL (scorer and LLM policies)")
    parser.add_argument("--grad-batches", type=int, help="batches for the gradient-variance probe")
    parser.add_argument("--tensorboard", action="store_true", help="also log to TensorBoard (needs tensorboard)")
    parser.add_argument("--wandb-project", help="also log to this W&B project (needs wandb)")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    preset = build_preset(args)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise SystemExit(f"{out} is not empty: pass --resume to continue it, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    if preset.torch_threads:
        torch.set_num_threads(preset.torch_threads)
    (out / "preset.json").write_text(json.dumps(_preset_dict(preset), indent=2))

    from tqdm.auto import tqdm

    progress = not args.no_progress and sys.stderr.isatty()
    jobs = [(e, s) for e in preset.envs for s in preset.for_env('seeds', e)]
    runs: list[dict[str, Any]] = []
    bar = tqdm(total=len(jobs) * len(ALGORITHMS), desc="runs", disable=args.no_progress)
    for env_name, seed in jobs:
        setup = preset.envs[env_name]
        train_tasks, eval_tasks = task_split(setup)
        initial = None
        for algorithm in ALGORITHMS:
            bar.set_postfix(env=env_name, seed=seed, algorithm=algorithm)
            if not (run_dir(out, env_name, algorithm, seed) / "run.json").exists() and initial is None:
                initial = make_policy(preset, setup, seed, train_tasks)
            runs.append(run_one(out, preset, env_name, algorithm, seed, initial, train_tasks, eval_tasks, progress))
            bar.update(1)
    bar.close()
    results = aggregate(runs, preset, list(preset.envs))
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))
    written = plots(results, out)
    print(markdown(results))
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, " + ", ".join(str(p) for p in written))
    return results


if __name__ == "__main__":
    main()
