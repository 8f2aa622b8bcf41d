"""``bpo-compare``: the main job. BPO and the baselines at matched compute, over envs and seeds.

For every env and seed, one initial policy (warm-started by behaviour cloning on the env's
expert trajectories where the preset says so) is copied to each algorithm, which then trains
with ``bpo_algos.Trainer`` under the same optimizer, learning rate, task sequence and per-update
budget in one compute unit (``--budget-unit``; the others are reported). Then:

* final success: every algorithm's final policy is evaluated on the same evaluation tasks;
* gradient-norm variance, measured the same way for every algorithm: at the initial policy,
  ``--grad-batches`` independent batches at the same budget (variance of the gradient vector,
  ``tr Cov(g)``, of its norm, and the scale-free noise-to-signal ``tr Cov(g) / ||E g||^2``),
  plus the variance of the logged gradient norms over training;
* ``updates_to_target``: updates each algorithm needs for its (seed-averaged, smoothed) batch
  success to reach the best baseline's final training success.

Algorithms are looked up by name in ``bpo_algos``'s registry (``--algorithms``): the built-in
ones and those of installed packages come through the entry-point group ``bpo_algos.algorithms``,
an unpackaged module's with ``--import MODULE`` (after ``bpo_algos.register_algorithm``). Every
field of the preset, of its ``TrainerConfig`` and of the algorithms' option dataclasses has a
flag (``--learning-rate``, ``--bpo.branch-factor``, ``--rloo.group-size``; ``--help`` lists
them with their documentation). Writes to ``--out``:
``results.json``, ``results.md`` (means and 95% intervals over seeds), PNG plots and one
example rollout tree per env and algorithm (``trees/ENV-ALGORITHM.png``, linked from
``results.md``).
``--resume`` continues an interrupted run: finished runs are kept, unfinished ones resume from
their last checkpoint.

    bpo-compare --out results/compare            # CPU default (~35 min on 2 cores)
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
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bpo_algos.algorithm import AlgorithmConfig, Options
from bpo_algos.compute import Budget
from bpo_algos.experiments.flags import add_flags, given
from bpo_algos.experiments.presets import PRESETS, RUN_FIELDS, Preset, preset_dict
from bpo_algos.experiments.report import example_trees, markdown, plots
from bpo_algos.experiments.runner import (
    algorithm_class,
    make_policy,
    run_dir,
    run_one,
    task_split_with_provenance,
)
from bpo_algos.experiments.stats import aggregate
from bpo_algos.registry import algorithm_factory, registered_algorithms
from bpo_algos.trainer_config import TrainerConfig

PRESET_FLAG_SKIP = ("envs", "trainer", "shared", "options", "algorithm_options", "algorithms", "treatment")
"""Preset fields with flags of their own (``--envs``, ``--algorithms``, ...) or none (dataclasses
whose fields get flags, tables)."""
OLD_FLAGS = {"group_size": "--ALGORITHM.group-size", "backbones": "--bpo.backbones", "branch_factor": "--bpo.branch-factor"}
"""Flags of earlier versions that set one option of every algorithm that has it."""


def option_classes() -> dict[str, type[Options]]:
    """``{algorithm kind: its Options dataclass}`` over the registered algorithms whose factory
    is an :class:`~bpo_algos.algorithm.Algorithm` subclass (or a partial of one)."""
    found: dict[str, type[Options]] = {}
    for name in registered_algorithms():
        cls = algorithm_class(algorithm_factory(name))
        if cls is not None and cls.Options.field_names():
            found.setdefault(cls.name, cls.Options)
    return found


def add_config_flags(parser: argparse.ArgumentParser) -> dict[str, dict[str, str]]:
    """The generated flags: the preset's own fields, its TrainerConfig, the shared algorithm
    options and every kind of algorithm's options. Returns ``{holder: {dest: field}}``."""
    taken = set(parser._option_string_actions)
    holders: dict[str, dict[str, str]] = {}
    group = parser.add_argument_group("the preset (one value sets a per-env field for every env)")
    holders["preset"] = add_flags(group, Preset, skip=PRESET_FLAG_SKIP, taken=taken)
    group = parser.add_argument_group("training (TrainerConfig)")
    holders["trainer"] = add_flags(group, TrainerConfig, skip=RUN_FIELDS, taken=taken)
    group = parser.add_argument_group("every algorithm (AlgorithmConfig)")
    holders["shared"] = add_flags(group, AlgorithmConfig, taken=taken)
    for kind, options in option_classes().items():
        group = parser.add_argument_group(f"{kind} ({options.__name__}; also its variants)")
        holders[f"options:{kind}"] = add_flags(group, options, prefix=f"{kind}.", taken=taken)
    group = parser.add_argument_group("earlier flags")
    for name, new in OLD_FLAGS.items():
        group.add_argument("--" + name.replace("_", "-"), dest=f"old__{name}", type=int, default=argparse.SUPPRESS,
                           help=f"{name} of every algorithm that has it (as {new})")
    return holders


def build_preset(args: argparse.Namespace, holders: dict[str, dict[str, str]] | None = None) -> Preset:
    name = "smoke" if args.smoke else args.preset
    preset = copy.deepcopy(PRESETS[name])
    holders = holders if holders is not None else add_config_flags(argparse.ArgumentParser())
    if args.envs:
        unknown = [e for e in args.envs if e not in preset.envs and e not in PRESETS["gpu"].envs]
        if unknown:
            raise SystemExit(f"unknown env(s) {unknown}; known: {sorted(set(preset.envs) | set(PRESETS['gpu'].envs))}")
        preset.envs = {e: preset.envs.get(e) or PRESETS["gpu"].envs[e] for e in args.envs}
    if args.algorithms:
        known = registered_algorithms()
        unknown = [a for a in args.algorithms if a not in known]
        if unknown:
            raise SystemExit(f"unknown algorithm(s) {unknown}; registered: {known} (a user's algorithm: --import MODULE)")
        preset.algorithms = tuple(args.algorithms)
    if args.treatment:
        preset.treatment = args.treatment
    if preset.treatment not in preset.algorithms:
        raise SystemExit(f"--treatment {preset.treatment!r} is not among the algorithms {list(preset.algorithms)}")
    if args.algorithms and preset.competitors is not None:
        # the preset's competitors that are still trained (an explicit list changes what is compared)
        preset.competitors = tuple(b for b in preset.competitors if b in preset.algorithms) or None
    for item in args.algorithm_option or ():
        algorithm, key, value = _parse_algorithm_option(item)
        preset.algorithm_options.setdefault(algorithm, {})[key] = value
    _apply_flags(preset, args, holders)
    for wanted, package in ((preset.trainer.tensorboard, "tensorboard"), (preset.trainer.wandb_project, "wandb")):
        if wanted and importlib.util.find_spec(package) is None:  # fail before hours of training, not after
            raise SystemExit(f"logging to {package} needs `pip install {package}`")
    if "budget" not in given(args, holders["preset"]) and preset.budget_unit != PRESETS[name].budget_unit:
        raise SystemExit(
            f"the {name} preset's budgets are in {PRESETS[name].budget_unit}; with --budget-unit {preset.budget_unit} "
            f"give --budget in {preset.budget_unit}"
        )
    missing = [e for e in preset.envs if e not in preset.budget]
    if missing:
        raise SystemExit(
            f"no {preset.budget_unit} budget for env(s) {missing} in the {name} preset; give --budget in {preset.budget_unit}"
        )
    try:
        Budget(preset.budget_unit, 1)  # validates the unit
    except ValueError as exc:
        raise SystemExit(f"--budget-unit: {exc}") from exc
    apply_data_sources(preset, args, name)
    return preset


def _apply_flags(preset: Preset, args: argparse.Namespace, holders: dict[str, dict[str, str]]) -> None:
    """Set the given generated flags on the preset's dataclasses (a check error is an exit)."""
    try:
        for key, value in given(args, holders["preset"]).items():
            if key == "budget":
                value = {e: value for e in preset.envs}
            elif isinstance(value, list):
                value = tuple(value)
            setattr(preset, key, value)
        trainer = given(args, holders["trainer"])
        if trainer:
            preset.trainer = replace(preset.trainer, **trainer)
            for setup in preset.envs.values():  # a flag sets the field for every env
                setup.trainer = {k: v for k, v in setup.trainer.items() if k not in trainer}
        shared = given(args, holders["shared"])
        if shared:
            preset.shared = replace(preset.shared, **shared)
        classes = option_classes()
        changes: dict[str, dict[str, Any]] = {kind: given(args, dests) for holder, dests in holders.items()
                                              if holder.startswith("options:") for kind in [holder.split(":", 1)[1]]}
        for name in OLD_FLAGS:
            if hasattr(args, f"old__{name}"):
                for kind, options in classes.items():
                    if name in options.field_names():
                        changes.setdefault(kind, {}).setdefault(name, getattr(args, f"old__{name}"))
        for kind, fields in changes.items():
            if fields:
                current = preset.options.get(kind) or classes[kind]()
                preset.options[kind] = replace(current, **fields)
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"bpo-compare: {exc}") from exc


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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/compare", help="output folder")
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    parser.add_argument("--smoke", action="store_true", help="the smoke preset (< 2 min; CI)")
    parser.add_argument("--envs", nargs="+", help="env names (default: the preset's)")
    parser.add_argument("--algorithms", nargs="+", help="registered algorithm names (default: the preset's; see --list-algorithms)")
    parser.add_argument("--import", dest="import_modules", nargs="+", metavar="MODULE",
                        help="modules to import first (they register algorithms with bpo_algos.register_algorithm)")
    parser.add_argument("--treatment", help="the algorithm compared with the best of the others (default: bpo)")
    parser.add_argument("--algorithm-option", action="append", metavar="NAME.KEY=VALUE",
                        help="a constructor option of one algorithm, VALUE as JSON (e.g. bpo.max_depth=2); repeatable")
    parser.add_argument("--list-algorithms", action="store_true", help="print the registered algorithms and exit")
    parser.add_argument("--swe-instances", help="SWE-bench rows: a .parquet/.jsonl/.json, a task-repo folder, or a "
                        "dataset name in the local Hugging Face cache (default: the bundled repos)")
    parser.add_argument("--swe-backend", choices=("local", "docker"), help="SWE-bench sandbox (the gpu preset: docker)")
    parser.add_argument("--swe-images-dir", help="folder of `docker save` tarballs of the SWE-bench instance images")
    parser.add_argument("--webshop-data", help="WebShop data folder (default: the bundled catalog)")
    parser.add_argument("--alfworld-data", help="ALFWorld data folder (default: $ALFWORLD_DATA, the cache, or generated games)")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    parser.add_argument("--no-progress", action="store_true")
    # modules named by --import register algorithms (and so flags of their options) first
    imports = argparse.ArgumentParser(add_help=False)
    imports.add_argument("--import", dest="import_modules", nargs="+", default=())
    for module in imports.parse_known_args(argv)[0].import_modules:
        importlib.import_module(module)
    holders = add_config_flags(parser)
    args = parser.parse_args(argv)
    if args.list_algorithms:
        print("\n".join(registered_algorithms()))
        return {}
    preset = build_preset(args, holders)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise SystemExit(f"{out} is not empty: pass --resume to continue it, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    previous_preset = out / "preset.json"
    if previous_preset.exists():
        # cached runs are only valid for the setting that made them
        saved = json.loads(previous_preset.read_text())
        wandb_group = preset.trainer.wandb_group or saved.get("trainer", {}).get("wandb_group")
        preset.trainer = replace(preset.trainer, wandb_group=wandb_group)
        current = _setting(preset_dict(preset))
        # a field newer than the saved run counts at its default
        defaults = _setting(preset_dict(Preset(envs={})))
        saved = _setting(saved)
        changed = sorted(
            k for k in set(saved) | set(current) if saved.get(k, defaults.get(k)) != current.get(k, defaults.get(k))
        )
        if changed:
            raise SystemExit(f"{out} holds a comparison with another setting (differs in: {', '.join(changed)}); choose another --out")
    if preset.trainer.wandb_project and preset.trainer.wandb_group is None:
        # one W&B group per comparison, kept when it resumes
        preset.trainer = replace(preset.trainer, wandb_group=f"{out.resolve().name}-{uuid.uuid4().hex[:8]}")
    if preset.torch_threads:
        torch.set_num_threads(preset.torch_threads)
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
    previous_data.write_text(json.dumps(data, indent=2))

    from tqdm.auto import tqdm

    progress = not args.no_progress and sys.stderr.isatty()
    jobs = [(e, s) for e in preset.envs for s in preset.for_env("seeds", e)]
    runs: list[dict[str, Any]] = []
    bar = tqdm(total=len(jobs) * len(preset.algorithms), desc="runs", disable=args.no_progress)
    for env_name, seed in jobs:
        setup = preset.envs[env_name]
        train_tasks, eval_tasks, _ = splits[env_name]
        initial = None
        for algorithm in preset.algorithms:
            bar.set_postfix(env=env_name, seed=seed, algorithm=algorithm)
            if not (run_dir(out, env_name, algorithm, seed) / "run.json").exists() and initial is None:
                initial = make_policy(preset, setup, seed, train_tasks)
            runs.append(run_one(out, preset, env_name, algorithm, seed, initial, train_tasks, eval_tasks, progress))
            bar.update(1)
    bar.close()
    results = aggregate(runs, preset, list(preset.envs))
    results["example_trees"] = example_trees(runs, out)
    for env_name in preset.envs:
        results["per_env"][env_name]["data"] = data[env_name]
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))
    written = plots(results, out) + [out / p for pictures in results["example_trees"].values() for p in pictures.values()]
    print(markdown(results))
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, " + ", ".join(str(p) for p in written))
    return results


_LOGGING_FIELDS = ("tensorboard", "wandb_project", "wandb_group", "progress")
"""TrainerConfig fields that change where a run logs, not what it computes."""


def _setting(preset: dict[str, Any]) -> dict[str, Any]:
    """A preset's JSON without the logging fields (what a resumed comparison must match), its
    training and shared algorithm settings as ``trainer.FIELD`` / ``shared.FIELD`` keys."""
    out = {k: v for k, v in preset.items() if k not in ("trainer", "shared")}
    out.update({f"trainer.{k}": v for k, v in preset.get("trainer", {}).items() if k not in _LOGGING_FIELDS})
    out.update({f"shared.{k}": v for k, v in preset.get("shared", {}).items()})
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
