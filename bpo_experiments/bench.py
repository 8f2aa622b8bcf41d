"""Benchmark every BPO env, and what a BPO tree costs against independent rollouts (JSON + Markdown).

Per env (``BPO-TreeMDP-v0``, ``BPO-WebShop-v0``, ``BPO-ALFWorld-v0``, ``BPO-SWEBench-v0`` with
its default local backend):

* **costs**: median ms of ``reset`` (warm, one task), of ``step`` on random admissible walks
  and their throughput (steps/s, resets included), of ``bpo_envs.snapshot`` and
  ``bpo_envs.restore`` at a mid-episode state, and of a ``ReplaySnapshot`` restore (a reset
  plus a replay of the same prefix) at that depth, with the ratio replay/restore;
* **tree vs independent**: on the same tasks, one BPO tree per task with ``N`` leaves against
  ``N`` independent rollouts (``baselines.RLOO(group_size=N)``), collected through one
  ``EnvPool`` with the same policy, and the batches' compute meters (env steps, generated and
  prefilled tokens, policy calls, leaves) with the ratios tree / independent. Two tree shapes
  have ``N`` leaves: wide (``K0=2`` backbones, ``K=N/2`` siblings at one branch point) and deep
  (``K0=2``, ``K=2`` at ``N/2 - 1`` branch points along each backbone). The branch threshold
  is 0 nats, so a backbone branches at its first decision points (a step after the root).
  Policies: a uniform ``TabularPolicy`` (envs that list admissible actions) and the tiny offline
  LLM (``HFPolicy`` on ``tiny_model_path()``, ``max_new_tokens=32``).

An env whose optional dependency or system part is missing is reported as skipped, with why.

    bpo-bench --out DIR [--envs treemdp webshop alfworld swebench] [--leaves 8] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from baselines import RLOO
from bpo_algos import BPO, Algorithm, EnvPool, TabularPolicy
from bpo_envs.console import ends_on_ctrl_c
from bpo_envs.files import atomic_write
from bpo_envs.timing import (
    random_walk,
    replay_restore_ms,
    reset_ms,
    snapshot_restore_ms,
    walk_prefix,
)

METER_FIELDS = ("leaves", "env_steps", "gen_tokens", "prefill_tokens", "policy_calls", "restores", "snapshots", "resets")
RATIO_FIELDS = ("env_steps", "gen_tokens", "prefill_tokens", "policy_calls")


@dataclass
class EnvCase:
    """One env: how to make it, what it needs, and how much of it to run."""

    env_id: str
    kwargs: dict[str, Any]
    modules: tuple[str, ...]
    install: str
    repeats: int
    """Timed calls per cost (reset, snapshot, restore, replay)."""
    walk_steps: int
    tasks: int
    """Tasks (trees) per tree-vs-independent comparison, uniform policy."""
    llm_tasks: int = 1
    llm: bool = True
    """Run the tiny LLM comparison by default."""
    tree_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra make kwargs for the comparisons (shorter episodes where steps are slow)."""


ENVS: dict[str, EnvCase] = {
    "treemdp": EnvCase("BPO-TreeMDP-v0", {"depth": 6, "n_actions": 3, "seed": 0, "n_tasks": 8}, (), "",
                       repeats=2000, walk_steps=20_000, tasks=8, llm_tasks=2),
    "webshop": EnvCase("BPO-WebShop-v0", {}, (), "", repeats=500, walk_steps=5000, tasks=8, llm_tasks=2),
    "alfworld": EnvCase("BPO-ALFWorld-v0", {"games_per_type": 2}, ("bpo_envs.alfworld", "textworld", "fast_downward"),
                        "pip install 'bpo-gym[alfworld]' and run bpo-gym-setup alfworld",
                        repeats=40, walk_steps=300, tasks=2, llm=False),
    "swebench": EnvCase("BPO-SWEBench-v0", {"step_timeout": 30}, ("bpo_envs.swebench", "swebench"),
                        "pip install 'bpo-gym[swe]' and run bpo-gym-setup swebench",
                        repeats=10, walk_steps=30, tasks=1, tree_kwargs={"max_episode_steps": 8}),
}  # fmt: skip
LLM_SKIP_REASON = {
    "alfworld": "not run by default: slow (about 20 s a tree on 2 CPU cores even with 20-step "
    "episodes, the default being 50: prompts of ~1k tokens, entropy over ~30 admissible actions); "
    "add it with --llm-envs",
}


class UniformPolicy(TabularPolicy):
    """A ``TabularPolicy`` whose logits are zero everywhere: uniform over the admissible actions.

    It keeps no table, so an observation that comes back with another action list (ALFWorld's
    ``help`` text) is no error.
    """

    def logits(self, observation: str, n_actions: int) -> torch.Tensor:  # type: ignore[override]
        return torch.zeros(n_actions)


# ---- availability --------------------------------------------------------------------------
def make_factory(case: EnvCase, **extra: Any) -> Callable[[], gym.Env]:
    return functools.partial(gym.make, case.env_id, **{**case.kwargs, **extra})


def unavailable(case: EnvCase) -> str | None:
    """Why ``case``'s env cannot run here, or None (one instance is made and reset to check)."""
    for module in case.modules:
        try:
            found = importlib.util.find_spec(module) is not None
            if found and module.startswith("bpo_envs."):
                importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - a dependency of the module is missing
            return f"importing {module} failed ({type(exc).__name__}: {exc}); {case.install}"
        if not found:
            return f"module {module!r} is not installed; {case.install}"
    try:
        env = make_factory(case)()
        env.reset(seed=0)
        env.close()
    except Exception as exc:  # noqa: BLE001 - a system part (sandbox, engine) is missing
        return f"cannot make {case.env_id}: {type(exc).__name__}: {str(exc)[:300]}"
    return None


# ---- costs ---------------------------------------------------------------------------------
def env_costs(case: EnvCase, depth: int, quick: bool, seed: int = 0) -> dict[str, Any]:
    """reset / step / snapshot / restore / replay-restore of one env (see the module docstring)."""
    scale = 10 if quick else 1
    repeats = max(3, case.repeats // scale)
    make = make_factory(case)
    env = make()
    try:
        task = list(env.unwrapped.task_ids())[0]
        options = {"task_id": task}
        start = time.perf_counter()
        env.reset(seed=seed, options=options)
        first_reset_ms = (time.perf_counter() - start) * 1000
        reset = reset_ms(env, repeats, seed, options=options)
        walk = random_walk(env, max(10, case.walk_steps // scale), seed, options=options)
        actions, info = walk_prefix(env, depth, seed, options=options)
        snap = snapshot_restore_ms(env, info, repeats, seed)
        replay = replay_restore_ms(make, actions, repeats, seed=seed, options=options)
    finally:
        env.close()
    return {
        "task_id": task,
        "first_reset_ms": first_reset_ms,
        "reset_ms": reset,
        "step_ms": walk.step_ms,
        "steps_per_s": walk.steps_per_s,
        "walk_steps": walk.steps,
        "walk_episodes": walk.episodes,
        **snap,
        "depth": len(actions),
        "replay_restore_ms": replay,
        "replay_over_restore": replay / snap["restore_ms"],
        "repeats": repeats,
    }


# ---- tree vs independent -------------------------------------------------------------------
def tree_shapes(leaves: int) -> dict[str, BPO]:
    """BPO configurations whose trees have ``leaves`` leaves: ``K0 * (1 + M * (K - 1))``."""
    if leaves < 4 or leaves % 2:
        raise ValueError(f"--leaves must be an even number >= 4, got {leaves}")
    half = leaves // 2
    configs = {"wide": (2, half, 1), "deep": (2, 2, half - 1)}
    if half == 2:
        configs.pop("deep")  # the same shape as wide
    return {
        f"bpo-{name} (K0={k0}, K={k}, M={m})": BPO(
            backbones=k0, branch_factor=k, max_branch_points=m, entropy_threshold=0.0, seed=0
        )
        for name, (k0, k, m) in configs.items()
    }


def meter_row(algorithm: Algorithm, batch: Any, seconds: float) -> dict[str, Any]:
    compute = batch.compute
    meters = compute.to_dict()
    row: dict[str, Any] = {f: meters[f] for f in METER_FIELDS}
    row["trees"] = batch.n_trees
    row["leaves_per_tree"] = sorted({tree.compute.leaves for tree in batch.trees})
    row["seconds"] = seconds
    row["config"] = algorithm.config()
    return row


def tree_vs_independent(
    make: Callable[[], gym.Env], tasks: Sequence[Any], policy: Any, leaves: int, pool_size: int, seed: int = 0
) -> dict[str, Any]:
    """One batch per algorithm on ``tasks`` through one pool; meters and ratios to RLOO."""
    algorithms: dict[str, Algorithm] = {f"independent (RLOO, N={leaves})": RLOO(group_size=leaves, seed=seed)}
    algorithms.update(tree_shapes(leaves))
    pool = EnvPool([make] * pool_size)
    rows: dict[str, dict[str, Any]] = {}
    try:
        for name, algorithm in algorithms.items():
            policy.seed(seed)
            start = time.perf_counter()
            batch = algorithm.collect(policy, pool, list(tasks))
            rows[name] = meter_row(algorithm, batch, time.perf_counter() - start)
    finally:
        pool.close()
    base_name = next(iter(rows))
    base = rows[base_name]
    for name, row in rows.items():
        if name == base_name:
            continue
        row["ratio_to_independent"] = {f: row[f] / base[f] if base[f] else None for f in RATIO_FIELDS}
        row["ratio_to_independent_per_leaf"] = {
            f: (row[f] / row["leaves"]) / (base[f] / base["leaves"]) if base[f] and row["leaves"] else None
            for f in RATIO_FIELDS
        }
    return {"tasks": [str(t) for t in tasks], "pool_size": pool_size, "leaves": leaves, "algorithms": rows}


def task_list(case: EnvCase, count: int) -> list[Any]:
    env = make_factory(case)()
    try:
        return list(env.unwrapped.task_ids())[:count]
    finally:
        env.close()


def tiny_llm(seed: int) -> Any:
    from bpo_algos.policy import HFPolicy
    from bpo_algos.policy.tiny import tiny_model_path

    return HFPolicy(str(tiny_model_path()), max_new_tokens=32, seed=seed)


# ---- report --------------------------------------------------------------------------------
def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        "# BPO env benchmarks (`bpo-bench`, bpo_experiments/bench.py)",
        "",
        f"{report['machine']['platform']}, {report['machine']['cpus']} CPU(s), torch threads "
        f"{cfg['torch_threads']}; {report['date']}; {'--quick' if cfg['quick'] else 'default run'}, "
        f"{report['seconds']:.0f} s in all.",
        "",
        "## Env costs",
        "",
        "Medians over repeats on one task. reset: warm, each after one random step. step: random "
        "admissible walks; steps/s is their throughput, resets included. snapshot / restore: "
        "`bpo_envs.snapshot` of a state one random step past the depth shown, `bpo_envs.restore` "
        "back to that depth. replay: a `ReplaySnapshot` restore to the same state (a reset and a "
        "replay of `depth` steps, checked by hashing).",
        "",
        "| env | reset ms | step ms | steps/s | snapshot ms | restore ms | depth | replay-restore ms | replay / restore |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for env in report["envs"].values():
        c = env.get("costs")
        if c is None:
            continue
        lines.append(
            f"| {env['env_id']} | {_fmt(c['reset_ms'])} | {_fmt(c['step_ms'])} | {_fmt(c['steps_per_s'])} | "
            f"{_fmt(c['snapshot_ms'])} | {_fmt(c['restore_ms'])} | {c['depth']} | "
            f"{_fmt(c['replay_restore_ms'])} | {_fmt(c['replay_over_restore'])}x |"
        )
    for policy, title in (("uniform", "uniform TabularPolicy"), ("tiny_llm", "tiny offline LLM (HFPolicy, max_new_tokens=32)")):
        lines += [
            "",
            f"## Tree with N={cfg['leaves']} leaves vs N independent rollouts: {title}",
            "",
            "Sums over the tasks' trees (one tree per task per algorithm, same tasks and pool); "
            "ratio = tree / independent (per leaf in brackets: a tree cut short by an episode "
            "that ends before its branch points has fewer leaves)."
            + (" A tabular action is one generated token and a scored context one prefill token." if policy == "uniform" else ""),
            "",
            "| env | algorithm | trees | leaves | env steps | gen tokens | prefill tokens | policy calls | s | env steps ratio | gen tokens ratio | prefill ratio | calls ratio |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for env in report["envs"].values():
            section = env.get("tree_vs_independent", {}).get(policy)
            if section is None or "algorithms" not in section:
                continue
            for algo, row in section["algorithms"].items():
                ratio = row.get("ratio_to_independent")
                per = row.get("ratio_to_independent_per_leaf")
                cells = ["1"] * 4 if ratio is None else [f"{_fmt(ratio[f])} ({_fmt(per[f])})" for f in RATIO_FIELDS]
                lines.append(
                    f"| {env['env_id']} | {algo} | {row['trees']} | {row['leaves']} | {row['env_steps']} | "
                    f"{row['gen_tokens']} | {row['prefill_tokens']} | {row['policy_calls']} | "
                    f"{_fmt(row['seconds'], 2)} | " + " | ".join(cells) + " |"
                )
    notes = []
    for env in report["envs"].values():
        if "skipped" in env:
            notes.append(f"- {env['env_id']}: skipped: {env['skipped']}")
        for policy, section in env.get("tree_vs_independent", {}).items():
            if "skipped" in section:
                notes.append(f"- {env['env_id']}, {policy}: skipped: {section['skipped']}")
            elif "note" in section:
                notes.append(f"- {env['env_id']}, {policy}: {section['note']}")
        for where, error in env.get("errors", {}).items():
            notes.append(f"- {env['env_id']}, {where}: ERROR {error}")
    if notes:
        lines += ["", "## Notes and skipped parts", "", *notes]
    return "\n".join(lines) + "\n"


# ---- main ----------------------------------------------------------------------------------
def _guard(errors: dict[str, str], where: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; an exception is recorded in ``errors[where]`` (the other parts still run)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported in the output
        errors[where] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        return None


@functools.cache
def _shared_llm() -> tuple[Any, str | None]:
    """The tiny LLM, loaded once, or (None, why it cannot load)."""
    try:
        return tiny_llm(seed=0), None
    except Exception as exc:  # noqa: BLE001 - transformers (the hf extra) is missing
        return None, f"the tiny LLM cannot load: {type(exc).__name__}: {exc}; pip install 'bpo-gym[hf]'"


def bench_env(name: str, args: argparse.Namespace, llm: bool) -> dict[str, Any]:
    """Everything measured for one env (see the module docstring)."""
    case = ENVS[name]
    out: dict[str, Any] = {"env_id": case.env_id, "make_kwargs": case.kwargs}
    print(f"[{name}] checking", flush=True)
    start = time.perf_counter()
    why = unavailable(case)
    if why is not None:
        print(f"[{name}] skipped: {why}", flush=True)
        return {**out, "skipped": why}
    errors: dict[str, str] = {}
    print(f"[{name}] costs", flush=True)
    costs = _guard(errors, "costs", env_costs, case, args.depth, args.quick)
    if costs is not None:
        out["costs"] = costs
    make = make_factory(case, **case.tree_kwargs)
    if case.tree_kwargs:
        out["tree_make_kwargs"] = {**case.kwargs, **case.tree_kwargs}
    comparisons: dict[str, Any] = {}
    out["tree_vs_independent"] = comparisons
    probe = make()
    admissible = bool(probe.reset(seed=0)[1].get("admissible_actions"))
    probe.close()
    if admissible:
        print(f"[{name}] tree vs independent, uniform policy", flush=True)
        tasks = task_list(case, 2 if args.quick else case.tasks)
        result = _guard(errors, "uniform", tree_vs_independent, make, tasks, UniformPolicy(seed=0), args.leaves, args.pool)
        if result is not None:
            comparisons["uniform"] = result
    else:
        comparisons["uniform"] = {"skipped": "the env lists no admissible actions (a tabular policy needs them)"}
    policy, why = _shared_llm() if llm else (None, "not run with --quick" if args.quick else LLM_SKIP_REASON.get(name, "not in --llm-envs"))
    if policy is None:
        comparisons["tiny_llm"] = {"skipped": why}
    else:
        print(f"[{name}] tree vs independent, tiny LLM", flush=True)
        tasks = task_list(case, 1 if args.quick else case.llm_tasks)
        result = _guard(errors, "tiny_llm", tree_vs_independent, make, tasks, policy, args.leaves, args.pool)
        if result is not None:
            comparisons["tiny_llm"] = result
            if case.tree_kwargs:
                result["note"] = f"episodes made with {case.tree_kwargs} to bound the run time"
    if errors:
        out["errors"] = errors
    out["seconds"] = time.perf_counter() - start
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.torch_threads)
    start = time.perf_counter()
    llm_envs = set(args.llm_envs if args.llm_envs is not None else [n for n, c in ENVS.items() if c.llm])
    if args.quick and args.llm_envs is None:
        llm_envs &= {"treemdp"}
    envs = {name: bench_env(name, args, name in llm_envs) for name in args.envs}
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": _cpus()},
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "envs": envs,
        "seconds": time.perf_counter() - start,
    }


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for bench_envs.json and bench_envs.md")
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--leaves", type=int, default=8, help="N: leaves per tree and independent rollouts per task")
    parser.add_argument("--pool", type=int, default=8, help="envs in the EnvPool")
    parser.add_argument("--depth", type=int, default=8, help="steps before the timed snapshot/restore/replay")
    parser.add_argument("--llm-envs", nargs="*", choices=list(ENVS), default=None,
                        help="envs for the tiny-LLM comparison (default: all but alfworld; with --quick: treemdp)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch threads (1: the tiny model's small matmuls only lose from more)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and tasks (about a minute)")
    args = parser.parse_args(argv)
    tree_shapes(args.leaves)  # validate early
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "bench_envs.json", json.dumps(report, indent=2, default=str))
    text = markdown(report)
    atomic_write(out / "bench_envs.md", text)
    print(text)
    print(f"wrote {out / 'bench_envs.json'} and {out / 'bench_envs.md'}")
    return report


@ends_on_ctrl_c("bpo-bench")
def cli() -> None:
    """Console entry point (``bpo-bench``): exits 1 when an env's benchmark raised."""
    report = main()
    sys.exit(1 if any("errors" in env for env in report["envs"].values()) else 0)


if __name__ == "__main__":
    cli()
