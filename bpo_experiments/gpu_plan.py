"""The GPU presets' power plan: seeds and evaluation episodes for a detectable effect of at most
4 points on every env, and what that costs (docs/paper-setting.md, "Power plan").

No GPU run has been made, so the spread of the paired difference (treatment minus comparator,
per seed) is assumed from named figures (:data:`ASSUMED_SPREAD`):

    sd(E)^2 = s_train^2 + 2 p (1 - p) / (T E)

``s_train``: the seed-to-seed spread of the paired difference BPO - RLOO in final success (the
evaluation after the last update) measured by the CPU main job (:data:`MEASURED_SPREAD`), all of
it counted as training spread (it also holds those runs' own evaluation noise, so this overstates
it). Every env takes the largest figure measured on any env: the only one with many seeds is
WebShop's (32); ALFWorld's (3 seeds, 2 degrees of freedom) is smaller but too uncertain to plan
with, and there is no SWE-bench run with seeds. The second term: two independent evaluations of
``T`` tasks x ``E`` episodes at success ``p`` (``p = 1/2``, the worst case; common random
numbers make the real term smaller). The detectable effect at ``n`` seeds is the main job's
:func:`~bpo_experiments.stats.minimal_detectable_effect` (a paired t-test, level 0.05,
power 0.8).

Cost: per run ``updates x budget`` flops of training (the budget unit is flops) plus, per
evaluation point, ``T x E`` episodes of :data:`~bpo_experiments.presets.GPU_EPISODE_SHAPE`
at ``2P`` a token. GPU-hours = flops / (peak bf16 dense x :data:`ASSUMED_MFU`).
"""

from __future__ import annotations

import math
from typing import Any

from bpo_experiments.presets import GPU_EPISODE_SHAPE, QWEN_7B_PARAMS
from bpo_experiments.run_config import ComparisonConfig, EnvConfig

TARGET_MDE = 0.04
"""The largest detectable effect the plan accepts (success, absolute): 4 points, so that effects
of the size claimed for tree-search RL on these envs (3.6-6.1 points) are mostly detectable."""

MEASURED_SPREAD: dict[str, dict[str, Any]] = {
    "webshop": {
        "s_train": 0.0226, "seeds": 32, "file": "docs/results/compare-cpu/results.json",
        "source": "docs/results/compare-cpu/results.json (code 72b7957): sd (n - 1) over seeds 0-31 of tuned BPO - "
                  "tuned RLOO final success, WebShop test split, 500 goals x 1 episode",
    },
    "alfworld": {
        "s_train": 0.0109, "seeds": 3, "file": "docs/results/compare-cpu-alfworld/results.json",
        "source": "docs/results/compare-cpu-alfworld/results.json (code 72b7957): sd (n - 1) over seeds 0-2 of "
                  "BPO - RLOO final success, ALFWorld valid_seen, 140 games x 1 episode",
    },
}
"""The seed-to-seed spread of the paired difference BPO - RLOO in final success measured by the
CPU main job (``per_env.ENV.treatment_vs_comparator.metrics.final.sd`` of ``file``), per env."""

_LARGEST = max(MEASURED_SPREAD.values(), key=lambda m: m["s_train"])


def _assumed(env: str) -> dict[str, Any]:
    own = MEASURED_SPREAD.get(env)
    if own is _LARGEST:
        return {"s_train": own["s_train"], "source": own["source"]}
    note = f"this env's own: {own['s_train']:.3f} over {own['seeds']} seeds" if own else "no run of this env with seeds"
    return {"s_train": _LARGEST["s_train"], "source": f"the largest CPU figure, {_LARGEST['source']} ({note})"}


ASSUMED_SPREAD: dict[str, dict[str, Any]] = {env: _assumed(env) for env in ("alfworld", "webshop", "swebench")}
"""The training part of the per-seed spread of the paired difference, per env, and its source:
the largest of :data:`MEASURED_SPREAD` for every env (module docstring)."""

PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12}
"""Dense bf16 tensor-core peak (NVIDIA H100 SXM and H200 datasheets: 989 TFLOPS dense; the
1,979 quoted is with 2:4 sparsity)."""

ASSUMED_MFU = 0.15
"""Achieved share of that peak over a whole RL update (generation-bound decoding, env waits,
the update). An assumption until ``scripts/device_check.sh`` measures tokens/s on a lent GPU."""


def planned_sd(env: str, eval_tasks: int, episodes: int, p: float = 0.5) -> float:
    """``sd(E)`` of the module docstring."""
    s = ASSUMED_SPREAD[env]["s_train"]
    return math.sqrt(s * s + 2.0 * p * (1.0 - p) / (eval_tasks * episodes))


def mde(sd: float, n: int) -> float:
    from bpo_experiments.stats import minimal_detectable_effect

    return minimal_detectable_effect(sd, n)


def run_flops(env: EnvConfig, episodes: int) -> dict[str, float]:
    """Training and evaluation flops of one run of ``env`` (module docstring)."""
    shape = GPU_EPISODE_SHAPE[env.name]
    train = env.trainer.updates * float(env.budget)
    per_episode = shape["steps"] * (shape["prompt_tokens"] + shape["reply_tokens"]) * 2 * QWEN_7B_PARAMS
    evaluation = len(env.eval_points) * env.setup.eval_tasks * episodes * per_episode
    return {"train": train, "eval": evaluation, "total": train + evaluation}


def choose(env: EnvConfig, *, max_seeds: int = 16, episode_options: tuple[int, ...] = (1, 2, 4, 8, 16)) -> dict[str, Any]:
    """The cheapest (seeds, evaluation episodes) whose detectable effect is <= :data:`TARGET_MDE`
    (SWE-bench: one greedy episode, so only seeds vary)."""
    tasks = env.setup.eval_tasks
    options = (1,) if env.name == "swebench" else episode_options
    best = None
    for episodes in options:
        for n in range(2, max_seeds + 1):
            effect = mde(planned_sd(env.name, tasks, episodes), n)
            if effect <= TARGET_MDE:
                cost = n * run_flops(env, episodes)["total"]
                if best is None or cost < best["cost"]:
                    best = {"seeds": n, "eval_episodes": episodes, "mde": effect, "cost": cost}
                break
    if best is None:
        raise ValueError(f"{env.name}: no plan of <= {max_seeds} seeds detects {TARGET_MDE:.0%}")
    return best


def gpu_plan(comparison: ComparisonConfig) -> dict[str, Any]:
    """Per env: seeds, evaluation episodes, the assumed spread and its source, the detectable
    effect, runs, flops and GPU-hours on one H200 and on 8 x H100 (module docstring)."""
    out: dict[str, Any] = {}
    per_gpu = PEAK_BF16_FLOPS["H100"] * ASSUMED_MFU
    for env, settings in comparison.envs.items():
        setup = settings.setup
        n = len(settings.seeds)
        episodes = settings.evaluation.episodes
        sd = planned_sd(env, setup.eval_tasks, episodes)
        runs = n * len(comparison.algorithms)
        flops = run_flops(settings, episodes)
        total = runs * flops["total"]
        gpu_hours = total / per_gpu / 3600
        out[env] = {
            "seeds": n,
            "eval_tasks": setup.eval_tasks,
            "eval_episodes": episodes,
            "sd_assumed": sd,
            "sd_source": ASSUMED_SPREAD[env]["source"] + "; + binomial evaluation noise at p = 1/2",
            "mde": mde(sd, n),
            "runs": runs,
            "flops_per_run": flops,
            "flops_total": total,
            "gpu_hours": gpu_hours,
            "days_on_1xH200": gpu_hours * PEAK_BF16_FLOPS["H100"] / PEAK_BF16_FLOPS["H200"] / 24,
            "days_on_8xH100": gpu_hours / 8 / 24,
        }
    return out


def markdown(plan: dict[str, Any]) -> str:
    head = "| env | seeds | eval tasks x episodes | sd assumed | MDE | runs | flops | GPU-hours | days, 1 x H200 | days, 8 x H100 |\n"
    head += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    rows = [
        f"| {env} | {p['seeds']} | {p['eval_tasks']} x {p['eval_episodes']} | {p['sd_assumed']:.3f} | {100 * p['mde']:.1f} pts | {p['runs']} | "
        f"{p['flops_total']:.2e} | {p['gpu_hours']:,.0f} | {p['days_on_1xH200']:,.0f} | {p['days_on_8xH100']:,.0f} |"
        for env, p in plan.items()
    ]
    return head + "\n".join(rows) + "\n"
