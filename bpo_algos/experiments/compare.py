"""``bpo-compare``: the main job. BPO and the baselines at matched compute, over envs and seeds.

For every env and seed, one initial policy (warm-started by behaviour cloning on the env's
expert trajectories where the preset says so) is copied to each algorithm, which then trains
with ``bpo_algos.Trainer`` under the same optimizer, learning rate, task sequence and per-update
budget in one compute unit (``--budget-unit``; the others, flops included, are reported). Every
run's policy is evaluated at update 0 (the warm start) and every ``eval_every`` updates on the
same evaluation episodes (common random numbers). The headline per env is the treatment minus
the comparator fixed before the run (``--comparator``, default rloo), paired by seed, on three
metrics fixed before the run (area under the evaluated-success curve against compute, final
evaluated success, compute to a threshold), each with its 95% interval and minimal detectable
effect; a positive control (``frozen``: a learner with a zero loss) must be detected, and a
handicapped learner (``reinforce``: no baseline) is ranked. Gradient signal-to-noise ratios with
bootstrap intervals are measured at the warm start and mid-training. The formulas:
docs/main-job.md.

Algorithms are looked up by name in ``bpo_algos``'s registry (``--algorithms``; a user's own
with ``--import MODULE`` after ``bpo_algos.register_algorithm``). Writes to ``--out``:
``results.json``, ``results.md`` (controls first, then the headline), PNG plots and one
example rollout tree per env and algorithm (``trees/ENV-ALGORITHM.png``, linked from
``results.md``). ``--jobs N`` runs the independent runs in N processes and ``--ray ADDRESS`` on a
Ray cluster, with the results of ``--jobs 1``; ``--resume`` continues an interrupted run (finished
runs are kept, unfinished ones resume from their last checkpoint); ``--plan`` prints the runs,
their cost and wall time and the effect the preset can detect, without training.

    bpo-compare --plan                           # size the CPU default first
    bpo-compare --out results/compare --jobs 2   # CPU default (see docs/main-job.md for its wall time)
    bpo-compare --smoke --out /tmp/compare       # < 2 min (CI)
    bpo-compare --preset cpu-swe --out /tmp/swe  # SWE-bench end to end on a CPU (tiny LLM)
    bpo-compare --preset gpu --out results/gpu \
        --swe-instances princeton-nlp/SWE-bench_Verified --swe-backend docker   # the paper's setting

Data sources: ``--swe-instances`` (a Verified parquet/jsonl/json, a task-repo folder, or a dataset
name read from the local Hugging Face cache), ``--swe-backend``, ``--swe-images-dir`` (image
tarballs), ``--webshop-data`` and ``--alfworld-data`` (data folders) set the envs' options; the
gpu preset needs the first two (SWE-bench Verified on the docker backend).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from bpo_algos.compute import COMPUTE_UNITS, Budget
from bpo_algos.experiments.parallel import check_ray_address, execute
from bpo_algos.experiments.presets import PER_ENV_FIELDS, PRESETS, Preset, preset_dict
from bpo_algos.experiments.report import example_trees, markdown, plots
from bpo_algos.experiments.runner import (
    initial_dir,
    initial_job,
    run_dir,
    run_one,
    task_split_with_provenance,
)
from bpo_algos.experiments.stats import METRICS, aggregate
from bpo_algos.registry import registered_algorithms


def build_preset(args: argparse.Namespace) -> Preset:
    name = "smoke" if args.smoke else args.preset
    preset = copy.deepcopy(PRESETS[name])
    if args.envs:
        unknown = [e for e in args.envs if e not in preset.envs and e not in PRESETS["gpu"].envs]
        if unknown:
            raise SystemExit(f"unknown env(s) {unknown}; known: {sorted(set(preset.envs) | set(PRESETS['gpu'].envs))}")
        preset.envs = {e: preset.envs.get(e) or PRESETS["gpu"].envs[e] for e in args.envs}
    if args.algorithms:
        for module in args.import_modules or ():
            importlib.import_module(module)  # registers the user's algorithms
        known = registered_algorithms()
        unknown = [a for a in args.algorithms if a not in known]
        if unknown:
            raise SystemExit(f"unknown algorithm(s) {unknown}; registered: {known} (a user's algorithm: --import MODULE)")
        preset.algorithms = tuple(args.algorithms)
    if args.treatment:
        preset.treatment = args.treatment
    if preset.treatment not in preset.algorithms:
        raise SystemExit(f"--treatment {preset.treatment!r} is not among the algorithms {list(preset.algorithms)}")
    if args.comparator:
        preset.comparator = args.comparator
    known = registered_algorithms()
    if preset.comparator not in known:
        raise SystemExit(f"unknown comparator {preset.comparator!r}; registered: {known}")
    if preset.comparator not in preset.algorithms:
        raise SystemExit(
            f"--comparator {preset.comparator!r} is not among the algorithms {list(preset.algorithms)}: "
            "the headline is treatment - comparator, so the comparator must be trained too (add it to --algorithms)"
        )
    if preset.comparator == preset.treatment:
        raise SystemExit(f"the treatment and the comparator are both {preset.treatment!r}: choose another --comparator")
    if args.primary_metric:
        preset.primary_metric = args.primary_metric
    if args.algorithms and preset.baselines is not None:
        # the preset's baselines that are still trained (an explicit list changes what is compared)
        preset.baselines = tuple(b for b in preset.baselines if b in preset.algorithms) or None
    for item in args.algorithm_option or ():
        name, key, value = _parse_algorithm_option(item)
        preset.algorithm_options.setdefault(name, {})[key] = value
    for key in ("policy", "updates", "budget_unit", "learning_rate", "group_size", "backbones", "branch_factor", "sft_epochs", "grad_batches",
                "eval_every", "eval_episodes", "grad_seeds"):
        value = getattr(args, key)
        if value is not None:
            setattr(preset, key, value)
    if args.seeds is not None:
        preset.seeds = tuple(args.seeds)
    preset.tensorboard = preset.tensorboard or args.tensorboard
    preset.wandb_project = args.wandb_project or preset.wandb_project
    for wanted, package in ((preset.tensorboard, "tensorboard"), (preset.wandb_project, "wandb")):
        if wanted and importlib.util.find_spec(package) is None:  # fail before hours of training, not after
            raise SystemExit(f"logging to {package} needs `pip install {package}`")
    if args.budget is not None:
        preset.budget = {e: args.budget for e in preset.envs}
    elif args.budget_unit is not None and args.budget_unit != PRESETS[name].budget_unit:
        raise SystemExit(
            f"the {name} preset's budgets are in {PRESETS[name].budget_unit}; with --budget-unit {args.budget_unit} "
            f"give --budget in {args.budget_unit}"
        )
    missing = [e for e in preset.envs if e not in preset.budget]
    if missing:
        raise SystemExit(
            f"no {preset.budget_unit} budget for env(s) {missing} in the {name} preset; give --budget in {preset.budget_unit}"
        )
    Budget(preset.budget_unit, 1)  # validates the unit
    apply_data_sources(preset, args, name)
    return preset


_DATA_FLAGS = {
    # flag attribute: (env id it applies to, env option)
    "swe_instances": ("BPO-SWEBench-v0", "instances"),
    "swe_backend": ("BPO-SWEBench-v0", "backend"),
    "swe_images_dir": ("BPO-SWEBench-v0", "images_dir"),
    "webshop_data": ("BPO-WebShop-v0", "data_dir"),
    "alfworld_data": ("BPO-ALFWorld-v0", "data_dir"),
}


def apply_data_sources(preset: Preset, args: argparse.Namespace, name: str) -> None:
    """Put the data-source flags into the env options; the gpu preset's SWE-bench needs them."""
    for attr, (env_id, option) in _DATA_FLAGS.items():
        value = getattr(args, attr, None)
        if value is None:
            continue
        setups = [s for s in preset.envs.values() if s.env_id == env_id]
        if not setups:
            flag = "--" + attr.replace("_", "-")
            raise SystemExit(f"{flag} is given but no env of this comparison is {env_id} (choose it with --envs)")
        for setup in setups:
            setup.kwargs[option] = str(value)
    swe = [s for s in preset.envs.values() if s.env_id == "BPO-SWEBench-v0"]
    if name == "gpu" and swe and not (swe[0].kwargs.get("instances") and swe[0].kwargs.get("backend") == "docker"):
        raise SystemExit(
            "the gpu preset runs SWE-bench Verified in its official images: give --swe-instances PATH_OR_NAME "
            "(a Verified .parquet/.jsonl, or princeton-nlp/SWE-bench_Verified from the local Hugging Face cache) "
            "and --swe-backend docker (images: --swe-images-dir, or built with swebench's prepare_images); "
            "or leave SWE-bench out with --envs alfworld webshop"
        )


def _jobs(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--jobs takes a whole number >= 1, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"--jobs must be >= 1 (the number of worker processes), got {n}")
    return n


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/compare", help="output folder")
    p.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    p.add_argument("--smoke", action="store_true", help="the smoke preset (< 2 min; CI)")
    p.add_argument("--envs", nargs="+", help="env names (default: the preset's)")
    p.add_argument("--algorithms", nargs="+", help="registered algorithm names (default: the preset's; see --list-algorithms)")
    p.add_argument("--import", dest="import_modules", nargs="+", metavar="MODULE",
                   help="modules to import first (they register algorithms with bpo_algos.register_algorithm)")
    p.add_argument("--treatment", help="the algorithm of the headline (default: the preset's, bpo)")
    p.add_argument("--comparator", help="the algorithm every other is compared with, paired by seed (default: the preset's, rloo)")
    p.add_argument("--primary-metric", choices=METRICS, help="the headline metric (default: the preset's, auc)")
    p.add_argument("--algorithm-option", action="append", metavar="NAME.KEY=VALUE",
                   help="a constructor option of one algorithm, VALUE as JSON (e.g. bpo.max_depth=2); repeatable")
    p.add_argument("--list-algorithms", action="store_true", help="print the registered algorithms and exit")
    p.add_argument("--seeds", nargs="+", type=int)
    p.add_argument("--updates", type=int)
    p.add_argument("--budget-unit", choices=COMPUTE_UNITS)
    p.add_argument("--budget", type=float, help="per-update budget (every env)")
    p.add_argument("--policy", help="scorer | tabular | tiny | smollm2 | a model name or folder")
    p.add_argument("--learning-rate", type=float)
    p.add_argument("--group-size", type=int, help="GRPO/RLOO N")
    p.add_argument("--backbones", type=int, help="BPO K0")
    p.add_argument("--branch-factor", type=int, help="BPO K")
    p.add_argument("--sft-epochs", type=int, help="behaviour-cloning epochs before RL (scorer and LLM policies)")
    p.add_argument("--grad-batches", type=int, help="batches per gradient probe (warm start and mid-training)")
    p.add_argument("--grad-seeds", type=int, help="the first this many seeds of each env probe their gradients")
    p.add_argument("--eval-every", type=int, help="evaluate every this many updates (and at 0 and the last)")
    p.add_argument("--eval-episodes", type=int, help="episodes per evaluation task")
    p.add_argument("--tensorboard", action="store_true", help="also log to TensorBoard (needs tensorboard)")
    p.add_argument("--wandb-project", help="also log to this W&B project (needs wandb)")
    p.add_argument("--swe-instances", help="SWE-bench rows: a .parquet/.jsonl/.json, a task-repo folder, or a "
                   "dataset name in the local Hugging Face cache (default: the bundled repos)")
    p.add_argument("--swe-backend", choices=("local", "docker"), help="SWE-bench sandbox (the gpu preset: docker)")
    p.add_argument("--swe-images-dir", help="folder of `docker save` tarballs of the SWE-bench instance images")
    p.add_argument("--webshop-data", help="WebShop data folder (default: the bundled catalog)")
    p.add_argument("--alfworld-data", help="ALFWorld data folder (default: $ALFWORLD_DATA, the cache, or generated games)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    p.add_argument("--jobs", type=_jobs, default=None,
                   help="independent runs in this many worker processes (default: the number of cores); the results of --jobs 1")
    p.add_argument("--ray", metavar="ADDRESS", help="run the runs as Ray tasks on the cluster at ADDRESS (HOST:PORT, ray://HOST:PORT, auto, "
                   "or local to start one here)")
    p.add_argument("--plan", action="store_true", help="print the runs, their expected compute and wall time and the effect the "
                   "preset can detect, without training")
    p.add_argument("--plan-from", metavar="RESULTS_JSON", help="--plan: size the run from this saved results.json (default: the "
                   "preset's recorded results, else a short pilot)")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.list_algorithms:
        for module in args.import_modules or ():
            importlib.import_module(module)
        print("\n".join(registered_algorithms()))
        return {}
    preset = build_preset(args)
    jobs = args.jobs or os.cpu_count() or 1
    if args.ray is not None:
        check_ray_address(args.ray)  # before any run starts
    if args.plan:
        from bpo_algos.experiments.plan import plan

        return plan(preset, jobs, Path(args.plan_from) if args.plan_from else None, progress=not args.no_progress)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise SystemExit(f"{out} is not empty: pass --resume to continue it, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    previous_preset = out / "preset.json"
    saved_preset = json.loads(previous_preset.read_text()) if previous_preset.exists() else None
    if saved_preset is not None:
        preset.wandb_group = preset.wandb_group or saved_preset.get("wandb_group")
    # cached runs are only valid for the setting that made them: per env (an env added to a
    # comparison later joins it; a changed one is refused)
    current = preset_dict(preset)
    settings = {e: env_setting(current, e) for e in preset.envs}
    for env_name, setting in settings.items():
        path = out / "runs" / env_name / "setting.json"
        saved_setting = json.loads(path.read_text()) if path.exists() else None
        if saved_setting is None and saved_preset is not None and env_name in saved_preset.get("envs", {}):
            saved_setting = env_setting(saved_preset, env_name)  # a folder written before per-env settings
        if saved_setting is None:
            continue
        defaults = env_setting(preset_dict(Preset(envs={env_name: preset.envs[env_name]})), env_name)
        changed = sorted(
            k for k in set(saved_setting) | set(setting)
            if saved_setting.get(k, defaults.get(k)) != setting.get(k, defaults.get(k))
        )
        if changed:
            raise SystemExit(
                f"{out} holds a comparison with another setting for {env_name} (differs in: {', '.join(changed)}); choose another --out"
            )
    if preset.wandb_project and preset.wandb_group is None:
        # one W&B group per comparison, kept when it resumes
        preset.wandb_group = f"{out.resolve().name}-{uuid.uuid4().hex[:8]}"
    if preset.torch_threads:
        torch.set_num_threads(preset.torch_threads)
    started = time.perf_counter()
    # the tasks, and which data and split make these numbers (generator + version, or files +
    # hash): the same for every seed and algorithm, so drawn once per env
    splits = {env_name: task_split_with_provenance(setup) for env_name, setup in preset.envs.items()}
    data = {env_name: split[2] for env_name, split in splits.items()}
    previous_data = out / "data.json"
    if previous_data.exists():
        # the same preset on other data (a new generator version, other files) is another setting
        saved_data = json.loads(previous_data.read_text())
        moved = sorted(e for e in data if e in saved_data and _data_identity(saved_data[e]) != _data_identity(data[e]))
        if moved:
            raise SystemExit(f"{out} holds a comparison made from other data for {', '.join(moved)} (see {previous_data}); choose another --out")
    (out / "preset.json").write_text(json.dumps(preset_dict(preset), indent=2))
    for env_name, setting in settings.items():
        (out / "runs" / env_name).mkdir(parents=True, exist_ok=True)
        (out / "runs" / env_name / "setting.json").write_text(json.dumps(setting, indent=2))
    previous_data.write_text(json.dumps({**(json.loads(previous_data.read_text()) if previous_data.exists() else {}), **data}, indent=2))

    from tqdm.auto import tqdm

    modules = tuple(args.import_modules or ())
    progress = not args.no_progress and sys.stderr.isatty()
    workers = 1 if args.ray is None and jobs == 1 else jobs
    pairs = [(e, s) for e in preset.envs for s in preset.for_env("seeds", e)]
    # 1. the initial policies and their evaluation (the warm start), one per (env, seed)
    initials: dict[tuple[str, int], dict[str, Any]] = {}
    todo = []
    for env_name, seed in pairs:
        folder = initial_dir(out, env_name, seed)
        if (folder / "initial.json").exists():
            initials[(env_name, seed)] = _load_initial(folder)
        else:
            train_tasks, eval_tasks, _ = splits[env_name]
            todo.append(((env_name, seed), (initial_job, (preset, env_name, seed, train_tasks, eval_tasks))))
    bar = tqdm(total=len(todo), desc="initial policies", disable=args.no_progress or not todo)

    def initial_done(i: int, value: dict[str, Any]) -> None:
        key = todo[i][0]
        _save_initial(initial_dir(out, *key), value)
        initials[key] = value
        bar.update(1)

    execute([call for _, call in todo], workers, args.ray, modules, initial_done)
    bar.close()
    # 2. the runs, one per (env, algorithm, seed); the longest first (they are independent)
    keys = [(e, a, s) for e, s in pairs for a in preset.algorithms]
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    calls = []
    for env_name, algorithm, seed in keys:
        done = run_dir(out, env_name, algorithm, seed) / "run.json"
        if done.exists():
            runs[(env_name, algorithm, seed)] = json.loads(done.read_text())
            continue
        train_tasks, eval_tasks, _ = splits[env_name]
        init = initials[(env_name, seed)]
        run_args = (out, preset, env_name, algorithm, seed, init["policy"], init["warm"], init["reference"], train_tasks, eval_tasks,
                    progress and workers == 1)
        calls.append(((env_name, algorithm, seed), (run_one, run_args)))
    calls.sort(key=lambda item: -_expected_cost(preset, *item[0]))
    bar = tqdm(total=len(calls), desc="runs", disable=args.no_progress or not calls)

    def run_done(i: int, value: dict[str, Any]) -> None:
        key = calls[i][0]
        done = run_dir(out, *key) / "run.json"
        if not done.exists():  # a run on another machine (Ray): its result comes back here
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(json.dumps(value))
        runs[key] = value
        bar.set_postfix(env=key[0], algorithm=key[1], seed=key[2])
        bar.update(1)

    execute([call for _, call in calls], workers, args.ray, modules, run_done)
    bar.close()
    ordered = [runs[k] for k in keys]
    results = aggregate(ordered, preset, list(preset.envs))
    results["example_trees"] = example_trees(ordered, out)
    for env_name in preset.envs:
        results["per_env"][env_name]["data"] = data[env_name]
    results["timing"] = {
        "wall_seconds": time.perf_counter() - started,
        "jobs": workers,
        "ray": args.ray,
        "cpu_count": os.cpu_count(),
        "resumed": bool(args.resume),
        "run_seconds_total": float(sum(r["seconds"] for r in ordered)),
        "initial_seconds_total": float(sum(i["warm"].get("seconds_build", 0.0) + i["warm"].get("seconds_eval", 0.0)
                                           + i["warm"].get("seconds_reference", 0.0) for i in initials.values())),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))
    written = plots(results, out) + [out / p for pictures in results["example_trees"].values() for p in pictures.values()]
    print(markdown(results))
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, " + ", ".join(str(p) for p in written))
    return results


def _expected_cost(preset: Preset, env: str, algorithm: str, seed: int) -> float:
    """A rough relative cost of a run, to start the longest first (order never changes results)."""
    tree_heavy = 3.0 if "tree" in algorithm else 1.0
    return preset.for_env("updates", env) * preset.budget[env] * tree_heavy * (3.0 if "alfworld" in env else 1.0)


def _save_initial(folder: Path, value: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("policy", "reference"):
        if value[name] is not None:
            (folder / f"{name}.pt").write_bytes(value[name])
    (folder / "initial.json").write_text(json.dumps(value["warm"]))


def _load_initial(folder: Path) -> dict[str, Any]:
    def read(name: str) -> bytes | None:
        path = folder / f"{name}.pt"
        return path.read_bytes() if path.exists() else None

    return {"warm": json.loads((folder / "initial.json").read_text()), "policy": read("policy"), "reference": read("reference")}


_LOGGING_FIELDS = ("tensorboard", "wandb_project", "wandb_group")
"""Preset fields that change where a run logs, not what it computes."""


def env_setting(saved: dict[str, Any], env: str) -> dict[str, Any]:
    """What of a preset (as :func:`preset_dict` data) env ``env``'s runs depend on: its own
    ``EnvSetup``, its entry of every per-env field, and every other field but the loggers'."""
    out: dict[str, Any] = {}
    for key, value in saved.items():
        if key in _LOGGING_FIELDS:
            continue
        if key == "envs":
            out[key] = value.get(env)
        elif key in PER_ENV_FIELDS and isinstance(value, dict):
            out[key] = value.get(env, Preset.__dataclass_fields__[key].default if key != "budget" else None)
        else:
            out[key] = value
    return out

_DATA_COUNTERS = ("planner_timeouts",)
"""Provenance fields that count what one process did (not which data it is)."""


def _data_identity(provenance: Any) -> Any:
    """``provenance`` without the per-process counters."""
    if isinstance(provenance, dict):
        return {k: _data_identity(v) for k, v in provenance.items() if k not in _DATA_COUNTERS}
    return provenance


def _parse_algorithm_option(item: str) -> tuple[str, str, Any]:
    target, sep, raw = item.partition("=")
    name, dot, key = target.partition(".")
    if not (sep and dot and name and key):
        raise SystemExit(f"--algorithm-option takes NAME.KEY=VALUE, got {item!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare string
    return name, key, value


def cli() -> None:
    """Console entry point (``bpo-compare``)."""
    main()


if __name__ == "__main__":
    cli()
