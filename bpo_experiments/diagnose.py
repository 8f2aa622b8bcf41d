"""``bpo-diagnose ENV_ID``: will branching pay on this env and policy? Measured before training.

At a fixed policy (docs/regime.md, "Before you train"):

1. ``--batches`` batches of RLOO (``--group-size``) and of each BPO shape (``--shapes``) at the
   same env-step budget per batch, on tasks drawn from the training tasks;
2. the mechanism of each (:func:`bpo_algos.mechanism.measure`: η at BPO's branch points with its
   interval, branch depths, fork cost, zero-variance groups, distinct siblings, tasks per update,
   entropy by depth);
3. the predicted matched-compute gradient-variance ratio of each shape against RLOO
   (:func:`bpo_algos.mechanism.predict_variance_ratio`), and, unless ``--no-measure``, the
   measured ratio ``tr Cov(g_BPO) / tr Cov(g_RLOO)`` over the same batches with a bootstrap
   interval (cheap for small policies; for an LLM each batch adds a backward pass);
4. the recommendation: the shape with the lowest ratio (the measured one where it was measured,
   else the predicted one) when it is below ``--margin`` (default 0.9), else "do not branch".

On a TreeMDP it also gives the exact η at the depths BPO branched at
(:func:`~bpo_algos.mechanism.exact_prefix_explained`), and the task-sampling share of RLOO's
variance from the exact per-task gradients. Any registered env works: the env's settings come
from the first preset with a setup of that id (``--preset`` to choose), ``--env-kwargs`` JSON
overrides them, and ``--policy`` names a policy the main job knows (``scorer``, ``tabular``,
``tabular-prior``, ``tiny``, ``smollm2``, a model folder) or a user's ``module:function``
called as ``function(make_env, tasks, seed) -> Policy``. Writes ``diagnose.json`` and
``diagnose.md`` to ``--out``, and each configuration's measured trees as
``trees/CONFIG.json.gz`` (:func:`bpo_algos.tree.save_trees`; ``diagnose.json["trees"]`` lists
them), from which ``scripts/rediagnose_eta.py`` re-reads η::

    bpo-diagnose BPO-WebShop-v0 --batches 16 --out docs/results/diagnose/webshop
    bpo-diagnose BPO-TreeMDP-v0 --env-kwargs '{"depth": 8, "decisive_levels": [5], "observe": "state"}' --policy tabular-prior
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pkgutil
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bpo_algos import Budget, TabularPolicy
from bpo_algos.algorithm import Batch
from bpo_algos.diagnostics import flat_gradient
from bpo_algos.mechanism import (
    Mechanism,
    exact_prefix_explained,
    measure,
    mechanism_table,
    predict_variance_ratio,
    tree_moments,
)
from bpo_algos.rollout import EnvPool
from bpo_algos.tree import save_trees
from bpo_envs.console import ends_on_ctrl_c
from bpo_envs.tree_mdp import TreeMDPEnv
from bpo_experiments.build import make_policy
from bpo_experiments.presets import PRESETS, EnvSetup, Preset
from bpo_experiments.regime import CONFIGS, SHAPES, task_gradient_spread
from bpo_experiments.run_config import env_config, policy_settings
from bpo_experiments.streams import BOOTSTRAP, MECHANISM, PROBE, stream_seed
from bpo_experiments.tasks import env_factory, task_split

SEARCH_ORDER = ("cpu", "cpu-tabular", "cpu-swe", "cpu-llm")
LLM_FLAGS = ("reasoning", "decision_entropy", "probe_samples", "sft_epochs", "sft_lr", "max_new_tokens")
"""Flags that set the preset's (or the env setup's) LLM fields (:class:`~bpo_experiments.presets.Preset`)."""
SETUP_FLAGS = ("sft_epochs", "sft_lr", "max_new_tokens")


def find_setup(env_id: str, preset_name: str | None) -> tuple[Preset, str, EnvSetup]:
    """The preset, its env name and setup for ``env_id`` (a bare setup when no preset has one)."""
    names = [preset_name] if preset_name else list(SEARCH_ORDER)
    for name in names:
        preset = PRESETS[name]
        for env_name, setup in preset.envs.items():
            if setup.env_id == env_id:
                return copy.deepcopy(preset), env_name, copy.deepcopy(setup)
    preset = copy.deepcopy(PRESETS[preset_name or "cpu"])
    setup = EnvSetup(env_id)
    preset.envs = {env_id: setup}
    return preset, env_id, setup


def apply_llm_flags(preset: Preset, setup: EnvSetup, flags: dict[str, Any]) -> None:
    """Set the given (not None) :data:`LLM_FLAGS`: the warm start and reply length on the env's
    setup (which overrides the preset's), the reply format and decision entropy on the preset."""
    for name, value in flags.items():
        if name not in LLM_FLAGS:
            raise ValueError(f"{name!r} is not one of {LLM_FLAGS}")
        if value is not None:
            setattr(setup if name in SETUP_FLAGS else preset, name, value)


def build_policy(spec: str | None, preset: Preset, setup: EnvSetup, seed: int, tasks: list[Any]) -> Any:
    """The main job's policy ``spec`` (warm-started as the preset says for the env of ``setup``),
    or a user's ``module:function`` called as ``function(make_env, tasks, seed)``."""
    if spec and ":" in spec:
        return pkgutil.resolve_name(spec)(env_factory(setup), tasks, seed)
    if spec:
        setup = replace(setup, policy=spec)
    return make_policy(policy_settings(preset, setup), setup, seed, tasks)


def collect(config: str, policy: Any, pool: EnvPool, tasks: list[Any], per_update: int, budget: Budget, batches: int,
            warmup: int, seed: int, gradients: bool) -> tuple[list[Batch], np.ndarray | None, float]:
    """``batches`` batches of ``config`` on ``per_update`` tasks drawn afresh each (the same
    draws for every configuration), after ``warmup`` that set BPO's threshold; their gradients
    (ascent direction) when asked, and the seconds it took."""
    start = time.perf_counter()
    algorithm = CONFIGS[config](seed)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x6469]))
    per_update = min(per_update, len(tasks))
    params = [p for p in policy.parameters() if p.requires_grad] if gradients else []
    out, grads = [], []
    for i in range(warmup + batches):
        draw = [tasks[j] for j in rng.choice(len(tasks), per_update, replace=False)]
        batch = algorithm.collect(policy, pool, draw, budget, seed=stream_seed(seed, PROBE, 0, i))
        if i < warmup:
            continue
        out.append(batch)
        if gradients:
            for p in params:
                p.grad = None
            algorithm.loss(policy, batch).backward()
            grads.append(-flat_gradient(params).double().cpu().numpy())
            for p in params:
                p.grad = None
    if grads:
        width = max(len(g) for g in grads)  # a tabular policy may grow entries while collecting
        grads = [np.pad(g, (0, width - len(g))) for g in grads]
    return out, (np.stack(grads) if grads else None), time.perf_counter() - start


def behaviour(batches: Sequence[Batch]) -> dict[str, float]:
    """What the policy did: the mean episode return and win rate over the leaves (rule-3
    weighted within a tree, trees equal) and the share of its steps the env called invalid (an
    LLM that does not yet answer in actions shows it here)."""
    returns, wins, steps, invalid = [], [], 0, 0
    for tree in (t for b in batches for t in b.trees):
        moments = tree_moments(tree)
        if moments is not None:
            returns.append(moments.m1)
        leaves = [e for e in tree.edges() if e.terminated or e.truncated or not e.child.children]
        total = sum(e.weight for e in leaves)
        if total > 0:
            wins.append(sum(e.weight * bool(e.info.get("won", False)) for e in leaves) / total)
        for edge in tree.edges():
            steps += 1
            invalid += bool(edge.info.get("invalid_action", False))
    return {"mean_return": float(np.mean(returns)) if returns else float("nan"),
            "success": float(np.mean(wins)) if wins else float("nan"),
            "invalid_action_share": invalid / steps if steps else float("nan")}


def trace_ratio(g: np.ndarray, ref: np.ndarray, n_boot: int = 1000, seed: int = 0) -> tuple[float, tuple[float, float]]:
    """``tr Cov(g) / tr Cov(ref)`` and a percentile bootstrap interval (batches resampled)."""
    width = max(g.shape[1], ref.shape[1])
    g, ref = np.pad(g, ((0, 0), (0, width - g.shape[1]))), np.pad(ref, ((0, 0), (0, width - ref.shape[1])))

    def ratio(a: np.ndarray, b: np.ndarray) -> float:
        den = float(b.var(axis=0, ddof=1).sum())
        return float(a.var(axis=0, ddof=1).sum()) / den if den > 0 else float("nan")

    rng = np.random.default_rng(seed)
    boot = [ratio(g[rng.integers(len(g), size=len(g))], ref[rng.integers(len(ref), size=len(ref))]) for _ in range(n_boot)]
    boot = [b for b in boot if np.isfinite(b)]
    ci = (float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))) if boot else (float("nan"), float("nan"))
    return ratio(g, ref), ci


def exact_checks(env: TreeMDPEnv, policy: Any, mechanisms: dict[str, Mechanism], tasks: list[Any], per_update: float) -> dict[str, Any]:
    """Exact η at the depths each shape branched at, and the task-sampling variance term."""
    out: dict[str, Any] = {"prefix_explained": {}}
    for name, m in mechanisms.items():
        depths = [d for d, n in m.branch_depths.items() for _ in range(n)]
        out["prefix_explained"][name] = exact_prefix_explained(env, policy, depths, tasks) if depths else None
    n = len(tasks)
    spread = task_gradient_spread(env, policy, tasks)
    out["task_gradient_spread"] = spread * (n - per_update) / max((n - 1) * per_update, 1e-9)
    return out


def diagnose(args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    preset, env_name, setup = find_setup(args.env_id, args.preset)
    if args.env_kwargs:
        setup.kwargs = {**setup.kwargs, **json.loads(args.env_kwargs)}
        preset.envs = {**preset.envs, env_name: setup}
    if args.tasks:
        setup.train_tasks = args.tasks
    apply_llm_flags(preset, setup, {name: vars(args)[name] for name in LLM_FLAGS})
    preset.envs = {**preset.envs, env_name: setup}
    tasks, _ = task_split(replace(setup, eval_split="train"))  # the diagnosis needs training tasks only
    torch.manual_seed(args.seed)
    if preset.torch_threads:  # as the main job's workers: on a busy CPU extra threads spin-wait
        torch.set_num_threads(preset.torch_threads)
    policy = build_policy(args.policy, preset, setup, args.seed, tasks)
    if args.budget and setup.budget is None:  # a bare setup: the budget given is its only one
        setup = replace(setup, budget=args.budget)
        preset.envs = {**preset.envs, env_name: setup}
    settings = env_config(preset, env_name)
    amount = args.budget or settings.budget
    if preset.budget_unit != "env_steps" and not args.budget:
        raise SystemExit(f"the {args.preset} preset's budget is in {preset.budget_unit}: give --budget in env steps")
    budget = Budget("env_steps", float(amount))
    rloo = f"rloo-{args.group_size}"
    per_update = args.tasks_per_update or settings.trainer.tasks_per_update
    pool = EnvPool([env_factory(setup) for _ in range(args.envs)])
    rows: dict[str, Any] = {}
    mechanisms: dict[str, Mechanism] = {}
    grads: dict[str, np.ndarray | None] = {}
    saved: dict[str, str] = {}
    try:
        for config in [rloo, *args.shapes]:
            warmup = args.warmup if config.startswith("bpo") else 0
            batches, g, seconds = collect(
                config, policy, pool, tasks, per_update, budget, args.batches, warmup, args.seed, not args.no_measure
            )
            mechanisms[config] = measure(batches, seed=stream_seed(args.seed, MECHANISM))
            if args.out:  # the measured trees, so a later estimator can re-read them (scripts/rediagnose_eta.py)
                saved[config] = f"trees/{config}.json.gz"
                save_trees([t for b in batches for t in b.trees], Path(args.out) / saved[config])
            grads[config] = g
            rows[config] = {"mechanism": mechanisms[config].to_json(), "seconds": seconds,
                            "env_steps_per_batch": float(np.mean([b.compute.env_steps for b in batches])),
                            **behaviour(batches)}
        env = env_factory(setup)().unwrapped
        exact = None
        task_share = 0.0
        covered = mechanisms[rloo].tasks_per_update
        if isinstance(env, TreeMDPEnv) and isinstance(policy, TabularPolicy):
            exact = exact_checks(env, policy, {s: mechanisms[s] for s in args.shapes}, tasks, covered)
            if grads[rloo] is not None:
                ref_var = float(grads[rloo].var(axis=0, ddof=1).sum())
                task_share = float(np.clip(exact["task_gradient_spread"] / ref_var, 0, 1)) if ref_var > 0 else 0.0
        length = mechanisms[rloo].independent_steps_per_trajectory
        for shape in args.shapes:
            k0, k = SHAPES[shape]
            rows[shape]["predicted_ratio"] = predict_variance_ratio(
                mechanisms[shape], backbones=k0, branch_factor=k, group_size=args.group_size, independent_steps=length,
                task_share=task_share, independent_tasks_per_update=covered,
            )
            if grads[shape] is not None and grads[rloo] is not None:
                ratio, ci = trace_ratio(grads[shape], grads[rloo], seed=stream_seed(args.seed, BOOTSTRAP))
                rows[shape]["measured_ratio"] = ratio
                rows[shape]["measured_ratio_ci95"] = list(ci)
    finally:
        pool.close()
    recommendation = recommend(rows, args.shapes, args.margin)
    return {
        "command": "bpo-diagnose " + shlex.join(args.argv),
        "env_id": args.env_id,
        "env_kwargs": setup.kwargs,
        "policy": args.policy or setup.policy or preset.policy,
        "preset": args.preset,
        "budget_env_steps": amount,
        "tasks_per_update": per_update,
        "batches": args.batches,
        "reference": rloo,
        "configs": rows,
        "exact": exact,
        "task_share": task_share,
        "recommendation": recommendation,
        "trees": saved,
        "seconds": time.perf_counter() - start,
        "load_average": list(os.getloadavg()),
    }


def recommend(rows: dict[str, Any], shapes: Sequence[str], margin: float) -> dict[str, Any]:
    """The shape with the lowest ratio (measured where measured, else predicted) if below
    ``margin`` and, when measured, with its 95% interval below 1; else "do not branch" (an
    interval that reaches 1 says: inconclusive, more batches). When every sibling group's returns
    were equal there is no gradient to judge, whatever the model predicts from the shape alone."""
    if shapes and all((rows[s].get("mechanism") or {}).get("zero_variance_groups") == 1.0 for s in shapes):
        return {"branch": False, "shape": None, "reason": "every sibling group's returns were equal: no gradient for "
                "branching to improve (warm-start the policy until it sometimes succeeds)"}
    scored = []
    for shape in shapes:
        r = rows[shape]
        value = r.get("measured_ratio", r.get("predicted_ratio"))
        if value is not None and np.isfinite(value):
            scored.append((value, shape, "measured" if "measured_ratio" in r else "predicted"))
    if not scored:
        return {"branch": False, "shape": None, "reason": "no BPO shape branched: no mechanism to judge"}
    value, shape, basis = min(scored)
    lower, upper = rows[shape].get("measured_ratio_ci95", [value, value]) if basis == "measured" else (value, value)
    interval = (f"95% interval [{lower:.2f}, {upper:.2f}]" if basis == "measured"
                else "predicted from the mechanism, no interval: measure it (drop --no-measure)")
    if value < margin and upper < 1:
        return {"branch": True, "shape": shape, "ratio": value, "basis": basis,
                "reason": f"{shape}'s {basis} gradient variance is {value:.2f}x RLOO's at the same env steps ({interval})"}
    if value < margin:
        return {"branch": False, "shape": None, "ratio": value, "basis": basis,
                "reason": f"inconclusive: the best shape ({shape}) has {value:.2f}x RLOO's gradient variance ({basis}; {interval}), "
                          "an interval that reaches 1; run more batches before branching"}
    return {"branch": False, "shape": None, "ratio": value, "basis": basis,
            "reason": f"do not branch: the best shape ({shape}) has {value:.2f}x RLOO's gradient variance ({basis}; {interval}) "
                      "at the same env steps"}


MECHANISM_LEGEND = (
    "*eta: the share of the return variance the prefix explains at BPO's branch points, "
    "1 − E Var(R | h) / E Var(R | task) (docs/mechanism.md; near 0: branching adds little); branch nodes and depths: "
    "where the trees forked (depth: count); steps/leaf: env steps per finished episode in a tree; steps/trajectory: "
    "the same for an independent episode; zero-var groups: the share of sibling groups whose returns were all equal "
    "(no gradient); distinct siblings: different actions per branch point; tasks/update: tasks the budget covered.*",
)
"""The legend printed under the mechanism table."""


def markdown(result: dict[str, Any]) -> str:
    mechanisms = {name: Mechanism.from_json(row["mechanism"]) for name, row in result["configs"].items()}
    lines = [
        f"# bpo-diagnose {result['env_id']} (policy {result['policy']}, {result['batches']} batches of "
        f"{result['budget_env_steps']} env steps)",
        "",
        mechanism_table(mechanisms),
        "",
        *MECHANISM_LEGEND,
        "",
        "| algorithm | mean return | success | invalid actions |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {row['mean_return']:.3f} | {row['success']:.3f} "
          f"| {row['invalid_action_share']:.3f} |" for name, row in result["configs"].items()),
        "",
        "*Each algorithm's batches at the fixed policy: mean return per episode, share of episodes won, share of actions "
        "the env refused as invalid.*",
        "",
        f"| shape | predicted ratio vs {result['reference']} | measured ratio [95% CI] | exact eta |",
        "|---|---:|---|---:|",
    ]
    exact = (result.get("exact") or {}).get("prefix_explained", {})
    for name, row in result["configs"].items():
        if name == result["reference"]:
            continue
        measured = row.get("measured_ratio")
        ci = row.get("measured_ratio_ci95")
        pred = row.get("predicted_ratio")
        e = exact.get(name)
        lines.append(
            f"| {name} | {'-' if pred is None else f'{pred:.2f}'} "
            f"| {'-' if measured is None else f'{measured:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]'} "
            f"| {'-' if e is None else f'{e:.3f}'} |"
        )
    lines += ["", f"*Ratio: the shape's gradient variance `tr Cov(g)` over {result['reference']}'s at the same env steps per "
              "batch (below 1: branching gives a less noisy gradient for the same compute); predicted from η and the fork cost, "
              "measured over the batches with a bootstrap interval; exact eta: the true η of the TreeMDP at those depths.*",
              "", f"**Recommendation**: {result['recommendation']['reason']}.", "",
              f"{result['seconds']:.0f} s; load average {', '.join(f'{x:.1f}' for x in result['load_average'])}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_id", help="a registered env id (e.g. BPO-WebShop-v0)")
    parser.add_argument("--policy", help="scorer | tabular | tabular-prior | tiny | smollm2 | MODEL | module:function")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="whose env settings, policy and budget (default: the first with this env)")
    parser.add_argument("--env-kwargs", help="JSON over the preset's env kwargs")
    parser.add_argument("--batches", type=int, default=16, help="batches per configuration")
    parser.add_argument("--warmup", type=int, default=2, help="BPO batches that set the adaptive threshold first")
    parser.add_argument("--budget", type=float, help="env steps per batch (default: the preset's)")
    parser.add_argument("--tasks", type=int, help="training tasks to draw from (default: the preset's)")
    parser.add_argument("--tasks-per-update", type=int, help="tasks per batch (default: the preset's trainer setting)")
    parser.add_argument("--group-size", type=int, default=4, choices=sorted({2, 4, 8}), help="RLOO's group size (the reference)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--margin", type=float, default=0.9, help="branch only below this variance ratio")
    parser.add_argument("--no-measure", action="store_true", help="skip the gradients (prediction only)")
    parser.add_argument("--envs", type=int, default=2, help="envs in the pool")
    parser.add_argument("--seed", type=int, default=0)
    group = parser.add_argument_group("LLM policies (default: the preset's)")
    group.add_argument("--reasoning", action=argparse.BooleanOptionalAction, default=None,
                       help="reply <think>...</think> then the action")
    group.add_argument("--decision-entropy", choices=("exact", "probe"), help="exact over answers at h, or probe completions")
    group.add_argument("--probe-samples", type=int, help="completions per probe entropy")
    group.add_argument("--sft-epochs", type=int, help="behaviour-cloning epochs on the expert (the warm start)")
    group.add_argument("--sft-lr", type=float, help="behaviour-cloning learning rate")
    group.add_argument("--max-new-tokens", type=int, help="longest reply")
    parser.add_argument("--out", help="folder for diagnose.json and diagnose.md")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    result = diagnose(args)
    text = markdown(result)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "diagnose.json").write_text(json.dumps(result, indent=1, default=str))
        (out / "diagnose.md").write_text(text)
    return result


@ends_on_ctrl_c("bpo-diagnose")
def cli() -> None:
    """Console entry point (``bpo-diagnose``)."""
    main()


if __name__ == "__main__":
    cli()
