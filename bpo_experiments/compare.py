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
import dataclasses
import importlib
import importlib.util
import json
import os
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bpo_algos import data_parallel as dp
from bpo_algos.algorithm import AlgorithmConfig, Options
from bpo_algos.compute import Budget
from bpo_algos.memory_plan import check_preset_fits
from bpo_algos.policy.base import check_entropy_mode
from bpo_algos.registry import algorithm_factory, registered_algorithms
from bpo_algos.trainer_config import TrainerConfig
from bpo_envs.files import (
    FolderLock,
    FolderLockedError,
    atomic_write,
    read_json_or_redo,
    write_json,
)
from bpo_envs.sealed import SealError, seal, unseal
from bpo_experiments.flags import add_flags, given
from bpo_experiments.parallel import check_ray_address, execute
from bpo_experiments.presets import (
    PER_ENV_FIELDS,
    PRESETS,
    RUN_FIELDS,
    EnvSetup,
    Preset,
    preset_dict,
    with_server,
)
from bpo_experiments.report import example_trees, markdown, plots
from bpo_experiments.runner import (
    algorithm_class,
    build_algorithm,
    initial_dir,
    initial_job,
    option_kinds,
    run_dir,
    run_one,
    task_order,
    task_split_with_provenance,
)
from bpo_experiments.stats import METRICS, aggregate, run_metrics
from bpo_experiments.tuning import (
    DEFAULTS_SUFFIX,
    TuningConfig,
    candidate_options,
    check_tuning,
    choose,
    tuning_tasks,
)
from bpo_experiments.tuning import label as tuning_label

PRESET_FLAG_SKIP = ("envs", "trainer", "shared", "options", "algorithm_options", "algorithms", "treatment", "tuning")
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
    for url in args.env_server or ():
        preset.envs = with_server(preset.envs, url)
    check_comparison(preset)
    apply_tuning_flags(preset, args)
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
    try:  # a GPU preset must fit the GPUs it is given (bpo-memory-plan), before anything runs
        check_entropy_mode(preset.decision_entropy, preset.probe_samples)
        if preset.eval_temperature is not None:
            temperatures = preset.eval_temperature.values() if isinstance(preset.eval_temperature, dict) else [preset.eval_temperature]
            if any(t is not None and not t >= 0 for t in temperatures):
                raise ValueError(f"--eval-temperature must be >= 0 (0: greedy), got {preset.eval_temperature}")
        check_preset_fits(preset, name)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    return preset


def apply_tuning_flags(preset: Preset, args: argparse.Namespace) -> None:
    """``--tune`` / ``--no-tune``, ``--tuning-seeds``, ``--tuning-grid KIND=JSON`` and
    ``--allow-unequal-grids`` on ``preset.tuning``, then :func:`~bpo_experiments.tuning.check_tuning`:
    a bad tuning setting is an error before any run."""
    tune = getattr(args, "tune", None)
    seeds = getattr(args, "tuning_seeds", None)
    grids = getattr(args, "tuning_grid", None) or ()
    unequal = bool(getattr(args, "allow_unequal_grids", False))
    if tune is False:
        if seeds is not None or grids or unequal:
            raise SystemExit("--no-tune with --tuning-seeds / --tuning-grid / --allow-unequal-grids: choose one")
        preset.tuning = None
        return
    if preset.tuning is None and (tune or seeds is not None or grids or unequal):
        preset.tuning = TuningConfig()
    if preset.tuning is None:
        return
    if seeds is not None:
        preset.tuning.seeds = tuple(seeds)
    for item in grids:
        kind, sep, raw = item.partition("=")
        try:
            grid = json.loads(raw) if sep else None
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--tuning-grid {item!r}: VALUE is not JSON ({exc})") from None
        if not kind or not isinstance(grid, list) or not all(isinstance(c, dict) for c in grid):
            raise SystemExit(f"--tuning-grid takes KIND=[{{option: value, ...}}, ...] (a JSON list of option dicts), got {item!r}")
        preset.tuning.grids[kind] = tuple(grid)
    if unequal:
        preset.tuning.allow_unequal_grids = True
    try:
        check_tuning(preset, option_classes(), option_kinds(preset.algorithms, preset))
    except ValueError as exc:
        raise SystemExit(f"bpo-compare --tune: {exc}") from exc


def check_comparison(preset: Preset) -> None:
    """The headline's settings, before any run: a registered comparator that is trained and is
    not the treatment, and a known primary metric."""
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
    if preset.primary_metric not in METRICS:
        raise SystemExit(f"--primary-metric {preset.primary_metric!r}: one of {', '.join(METRICS)}")


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
            if option == "instances":
                setup.kwargs.pop("instance_ids", None)  # a preset's pick among the bundled rows
    swe = [s for s in preset.envs.values() if s.env_id == "BPO-SWEBench-v0"]
    apply_swe_train_rows(preset, args, swe)
    if name.startswith("gpu") and swe and not (swe[0].eval_kwargs.get("instances") and swe[0].kwargs.get("backend") == "docker"):
        raise SystemExit(
            "the gpu preset runs SWE-bench Verified in its official images: give --swe-instances PATH_OR_NAME "
            "(a Verified .parquet/.jsonl, or princeton-nlp/SWE-bench_Verified from the local Hugging Face cache) "
            "and --swe-backend docker (images: --swe-images-dir, or built with swebench's prepare_images); "
            "or leave SWE-bench out with --envs alfworld webshop"
        )


def check_launch_fits(preset: Preset, name: str) -> None:
    """Before training on GPUs: the launch must have the GPUs the preset is planned for. A preset
    planned for several GPUs (the full fine-tune of ``--preset gpu``, FSDP over 8) runs under
    ``torchrun`` with one rank per GPU; say so, with the way out, when it is launched otherwise."""
    if not preset.gpus or not torch.cuda.is_available():
        return
    have = torch.cuda.get_device_properties(0).total_memory / 1e9
    if preset.gpus > 1 and dp.world_size() != preset.gpus:
        raise SystemExit(
            f"the {name} preset is planned for {preset.gpus} GPUs (a full fine-tune, FSDP over {preset.gpus}) and this "
            f"launch has {dp.world_size()} rank(s): run torchrun --nproc_per_node={preset.gpus} -m "
            f"bpo_experiments.compare --preset {name} ..., or --preset gpu-lora on one GPU"
        )
    if have < preset.gpu_gb - 1:
        try:
            check_preset_fits(dataclasses.replace(preset, gpu_gb=have), name)
        except ValueError as exc:
            raise SystemExit(f"this GPU has {have:.0f} GB: {exc}") from exc


def apply_swe_train_rows(preset: Preset, args: argparse.Namespace, setups: list[Any]) -> None:
    """``--swe-train-instances``: SWE-bench trains on those rows and evaluates on
    ``--swe-instances`` (all its rows, in order, up to ``eval_tasks``), which must share no
    instance id (and, with ``--swe-disjoint-repos``, no repo): checked here, before training.
    A preset whose SWE-bench evaluates on separate rows (the gpu presets) needs both."""
    from bpo_envs.swebench.instances import InstanceError, check_disjoint, load_instances

    train = getattr(args, "swe_train_instances", None)
    disjoint_repos = bool(getattr(args, "swe_disjoint_repos", False))
    if train is None:
        if disjoint_repos:
            raise SystemExit("--swe-disjoint-repos needs --swe-train-instances (the training rows)")
        for setup in setups:
            if setup.eval_split == "rows":
                raise SystemExit(
                    "this preset trains SWE-bench off its evaluation rows: give --swe-train-instances (SWE-Gym, "
                    "SWE-smith or other SWE-bench-format rows: a file, folder or cached dataset name) and "
                    "--swe-instances (the evaluation rows, e.g. princeton-nlp/SWE-bench_Verified)"
                )
        return
    if not setups:
        raise SystemExit("--swe-train-instances is given but no env of this comparison is BPO-SWEBench-v0 (choose it with --envs)")
    evaluation = getattr(args, "swe_instances", None)
    if evaluation is None:
        raise SystemExit("--swe-train-instances needs --swe-instances: the evaluation rows (e.g. princeton-nlp/SWE-bench_Verified)")
    try:
        check_disjoint(load_instances(str(train)), load_instances(str(evaluation)), disjoint_repos=disjoint_repos)
    except InstanceError as exc:
        raise SystemExit(f"--swe-train-instances / --swe-instances: {exc}") from exc
    for setup in setups:
        setup.kwargs["instances"] = str(train)
        setup.kwargs.pop("instance_ids", None)
        setup.eval_kwargs["instances"] = str(evaluation)
        setup.eval_split = "rows"


def _jobs(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--jobs takes a whole number >= 1, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"--jobs must be >= 1 (the number of worker processes), got {n}")
    return n


def check_same_settings(out: Path, preset: Preset, saved_preset: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Each env's setting (:func:`env_setting`), after checking it against the one ``out`` was
    made with: cached runs are only valid for the setting that made them, per env (an env added
    to a comparison later joins it; a changed one is refused, naming what differs)."""
    current = preset_dict(preset)
    settings = {e: env_setting(current, e) for e in preset.envs}
    for env_name, setting in settings.items():
        path = out / "runs" / env_name / "setting.json"
        saved_setting = read_json_or_redo(path)
        if saved_setting is None and saved_preset is not None and env_name in saved_preset.get("envs", {}):
            saved_setting = env_setting(saved_preset, env_name)  # a folder written before per-env settings
        if saved_setting is None:
            continue
        if isinstance(saved_setting.get("envs"), dict):  # fields EnvSetup gained since count at their defaults
            saved_setting["envs"] = {**_env_setup_defaults(), **saved_setting["envs"]}
        defaults = env_setting(preset_dict(Preset(envs={env_name: preset.envs[env_name]})), env_name)
        changed = sorted(
            k for k in set(saved_setting) | set(setting)
            if saved_setting.get(k, defaults.get(k)) != setting.get(k, defaults.get(k))
        )
        if changed:
            raise SystemExit(
                f"{out} holds a comparison with another setting for {env_name} (differs in: {', '.join(changed)}); choose another --out"
            )
    return settings


def check_same_data(out: Path, data: dict[str, Any]) -> None:
    """The same preset on other data (a new generator version, other files) is another setting:
    refuse a folder whose ``data.json`` names other data for an env."""
    previous = out / "data.json"
    saved = read_json_or_redo(previous)
    if saved is None:
        return
    moved = sorted(e for e in data if e in saved and _data_identity(saved[e]) != _data_identity(data[e]))
    if moved:
        raise SystemExit(f"{out} holds a comparison made from other data for {', '.join(moved)} (see {previous}); choose another --out")


def command_parser() -> argparse.ArgumentParser:
    """``bpo-compare``'s own flags (the config dataclasses' flags are added to it by
    :func:`add_config_flags`)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/compare", help="output folder")
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    parser.add_argument("--smoke", action="store_true", help="the smoke preset (< 2 min; CI)")
    parser.add_argument("--envs", nargs="+", help="env names (default: the preset's)")
    parser.add_argument("--algorithms", nargs="+", help="registered algorithm names (default: the preset's; see --list-algorithms)")
    parser.add_argument("--import", dest="import_modules", nargs="+", metavar="MODULE",
                        help="modules to import first (they register algorithms with bpo_algos.register_algorithm)")
    parser.add_argument("--treatment", help="the algorithm of the headline, compared with --comparator (default: the preset's, bpo)")
    parser.add_argument("--algorithm-option", action="append", metavar="NAME.KEY=VALUE",
                        help="a constructor option of one algorithm, VALUE as JSON (e.g. bpo.max_depth=2); repeatable")
    parser.add_argument("--list-algorithms", action="store_true", help="print the registered algorithms and exit")
    parser.add_argument("--swe-instances", help="SWE-bench rows: a .parquet/.jsonl/.json, a task-repo folder, or a "
                        "dataset name in the local Hugging Face cache (default: the bundled repos)")
    parser.add_argument("--swe-train-instances", help="SWE-bench training rows (SWE-Gym, SWE-smith or other SWE-bench-format "
                        "rows: a file, a folder or a cached dataset name); --swe-instances then gives the evaluation rows, "
                        "which must share no instance id")
    parser.add_argument("--swe-disjoint-repos", action="store_true", help="also forbid a repo with both training and evaluation rows")
    parser.add_argument("--swe-backend", choices=("local", "docker"), help="SWE-bench sandbox (the gpu preset: docker)")
    parser.add_argument("--swe-images-dir", help="folder of `docker save` tarballs of the SWE-bench instance images")
    parser.add_argument("--webshop-data", help="WebShop data folder (default: the bundled catalog)")
    parser.add_argument("--alfworld-data", help="ALFWorld data folder (default: $ALFWORLD_DATA, the cache, or generated games)")
    parser.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                        help="tune every algorithm's shape options by the fixed protocol first (docs/main-job.md, 'Tuning'); "
                        "default: the preset's (the cpu preset tunes WebShop)")
    parser.add_argument("--tuning-seeds", type=int, nargs="+", help="tuning seeds (disjoint from the evaluation seeds)")
    parser.add_argument("--tuning-grid", action="append", metavar="KIND=JSON",
                        help='one kind\'s candidates, e.g. rloo=\'[{"group_size": 2}, {"group_size": 4}]\'; repeatable')
    parser.add_argument("--allow-unequal-grids", action="store_true", help="allow tuning grids of different sizes")
    parser.add_argument("--env-server", action="append", metavar="URL",
                        help="step the env that a bpo-serve server at URL serves there (docs/serving.md); repeatable")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    parser.add_argument("--report-only", action="store_true", help="with --resume: run nothing, report the seeds whose runs "
                        "have all finished (an interrupted comparison; results.json names the unfinished seeds)")
    parser.add_argument("--jobs", type=_jobs, default=None,
                        help="independent runs in this many worker processes (default: the number of cores); the results of --jobs 1")
    parser.add_argument("--ray", metavar="ADDRESS", help="run the runs as Ray tasks on the cluster at ADDRESS (HOST:PORT, "
                        "ray://HOST:PORT, auto, or local to start one here)")
    parser.add_argument("--plan", action="store_true", help="print the runs, their expected compute and wall time and the "
                        "effect the preset can detect, without training")
    parser.add_argument("--plan-from", metavar="RESULTS_JSON", help="--plan: size the run from this saved results.json "
                        "(default: the preset's recorded results, else a short pilot)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run ``bpo-compare`` holding the lock on ``--out`` (``--out/.lock``): a second comparison
    into the same folder refuses at once, naming the holder's pid (docs/main-job.md)."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--out", default=command_parser().get_default("out"))
    for flag in ("--plan", "--list-algorithms", "-h", "--help"):
        early.add_argument(flag, action="store_true")
    known = early.parse_known_args(argv)[0]
    reads_only = known.plan or known.list_algorithms or known.h or known.help
    if reads_only or int(os.environ.get("RANK", "0")) != 0:  # under torchrun rank 0 holds it
        return _main(argv)
    try:
        lock = FolderLock(known.out, "another bpo-compare")
        lock.acquire()
    except FolderLockedError as exc:
        raise SystemExit(str(exc)) from None
    try:
        return _main(argv)
    finally:
        lock.release()


def _main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = command_parser()
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
    # under torchrun every rank runs every run together (data-parallel or FSDP training,
    # evaluations split over the ranks); rank 0 writes the files
    ranks = dp.world_size() if dp.init_from_env() else 1
    if ranks > 1 and ((args.jobs or 1) != 1 or args.ray is not None):
        raise SystemExit(f"under torchrun ({ranks} ranks) every rank takes part in every run: leave --jobs at 1 and --ray unset")
    jobs = 1 if ranks > 1 else (args.jobs or os.cpu_count() or 1)
    if args.ray is not None:
        check_ray_address(args.ray)  # before any run starts
    if args.plan:
        from bpo_experiments.plan import plan

        return plan(preset, jobs, Path(args.plan_from) if args.plan_from else None, progress=not args.no_progress)
    check_launch_fits(preset, "smoke" if args.smoke else args.preset)
    out = Path(args.out)
    if out.exists() and any(p.name != FolderLock.NAME for p in out.iterdir()) and not args.resume:
        raise SystemExit(f"{out} is not empty: pass --resume to continue it, or choose another --out")
    dp.barrier()  # every rank has looked at --out before rank 0 writes into it
    writer = dp.rank() == 0
    out.mkdir(parents=True, exist_ok=True)
    previous_preset = out / "preset.json"
    saved_preset = read_json_or_redo(previous_preset)
    if saved_preset is not None:
        wandb_group = preset.trainer.wandb_group or saved_preset.get("trainer", {}).get("wandb_group")
        preset.trainer = replace(preset.trainer, wandb_group=wandb_group)
    settings = check_same_settings(out, preset, saved_preset)
    if preset.trainer.wandb_project and preset.trainer.wandb_group is None:
        # one W&B group per comparison, kept when it resumes
        preset.trainer = replace(preset.trainer, wandb_group=f"{out.resolve().name}-{uuid.uuid4().hex[:8]}")
    if preset.torch_threads:
        torch.set_num_threads(preset.torch_threads)
    started = time.perf_counter()
    # the tasks, and which data and split make these numbers (generator + version, or files +
    # hash): the same for every seed and algorithm, so drawn once per env
    splits = {env_name: task_split_with_provenance(setup) for env_name, setup in preset.envs.items()}
    data = {env_name: split[2] for env_name, split in splits.items()}
    previous_data = out / "data.json"
    check_same_data(out, data)
    if writer:
        write_json(out / "preset.json", preset_dict(preset), indent=2)
        for env_name, setting in settings.items():
            (out / "runs" / env_name).mkdir(parents=True, exist_ok=True)
            write_json(out / "runs" / env_name / "setting.json", setting, indent=2)
        write_json(previous_data, {**read_json_or_redo(previous_data, {}), **data}, indent=2)

    from tqdm.auto import tqdm

    modules = tuple(args.import_modules or ())
    progress = not args.no_progress and sys.stderr.isatty()
    workers = 1 if args.ray is None and jobs == 1 else jobs
    session = start_session(out, workers, bool(args.resume)) if writer else None
    kinds = option_kinds(preset.algorithms, preset)
    tuning = preset.tuning
    tuned_envs = [e for e in preset.envs if tuning is not None and tuning.tunes(e)]
    # the tuning criterion's held-out training tasks (never an evaluation task) and its setting
    tune_tasks = {e: tuning_tasks(task_order(preset.envs[e]), splits[e][0], splits[e][1], tuning.tasks) for e in tuned_envs}
    tune_preset = {e: tuning_preset(preset, e) for e in tuned_envs}
    pairs = [(e, s) for e in preset.envs for s in preset.for_env("seeds", e)]
    tune_pairs = [(e, s) for e in tuned_envs for s in tuning.seeds]
    # 1. the initial policies and their evaluation (the warm start), one per (env, seed): the
    #    evaluation seeds' on the evaluation tasks, the tuning seeds' on the held-out training tasks
    initials: dict[tuple[str, int], dict[str, Any]] = {}
    todo = []
    for env_name, seed in pairs + tune_pairs:
        folder = initial_dir(out, env_name, seed)
        loaded = _load_initial(folder)
        if loaded is not None:
            initials[(env_name, seed)] = loaded
        else:
            tuning_seed = (env_name, seed) in tune_pairs
            train_tasks, eval_tasks = splits[env_name][0], tune_tasks[env_name] if tuning_seed else splits[env_name][1]
            job_preset = tune_preset[env_name] if tuning_seed else preset
            todo.append(((env_name, seed), (initial_job, (job_preset, env_name, seed, train_tasks, eval_tasks))))
    bar = tqdm(total=len(todo), desc="initial policies", disable=args.no_progress or not todo)

    def initial_done(i: int, value: dict[str, Any]) -> None:
        key = todo[i][0]
        if writer:
            _save_initial(initial_dir(out, *key), value)
        initials[key] = value
        bar.update(1)
        note_session(out, session)

    if not args.report_only:
        execute([call for _, call in todo], workers, args.ray, modules, initial_done)
    bar.close()
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}

    def run_call(env_name: str, label: str, seed: int, run_preset: Preset, eval_tasks: list[Any]) -> Any:
        init = initials[(env_name, seed)]
        return (run_one, (out, run_preset, env_name, label, seed, init["policy"], init["warm"], init["reference"],
                          splits[env_name][0], eval_tasks, progress and workers == 1))

    def run_all(keys: list[tuple[tuple[str, str, int], Preset, list[Any]]], desc: str) -> None:
        calls = []
        for key, run_preset, eval_tasks in keys:
            done = run_dir(out, *key) / "run.json"
            saved_run = read_json_or_redo(done)
            if saved_run is not None:
                runs[key] = saved_run
            else:
                calls.append((key, run_call(*key, run_preset, eval_tasks)))
        if args.report_only:  # nothing new runs
            return
        calls.sort(key=lambda item: -_expected_cost(preset, *item[0]))
        bar = tqdm(total=len(calls), desc=desc, disable=args.no_progress or not calls)

        def run_done(i: int, value: dict[str, Any]) -> None:
            key = calls[i][0]
            done = run_dir(out, *key) / "run.json"
            if writer and not done.exists():  # a run on another machine (Ray): its result comes back here
                done.parent.mkdir(parents=True, exist_ok=True)
                write_json(done, value)
            runs[key] = value
            bar.set_postfix(env=key[0], algorithm=key[1], seed=key[2])
            bar.update(1)
            note_session(out, session)

        execute([call for _, call in calls], workers, args.ray, modules, run_done)
        bar.close()

    # 2. tuning: every candidate on every tuning seed; beside them (independent of the choice)
    #    the treatment and the comparator at their defaults on the evaluation seeds
    tuned_kinds = [k for k in dict.fromkeys(kinds.values()) if tuning is not None and k in tuning.grids]
    candidates = {(e, k): list(tuning.grids[k]) for e in tuned_envs for k in tuned_kinds}
    phase: list[tuple[tuple[str, str, int], Preset, list[Any]]] = []
    for (env_name, kind), grid in candidates.items():
        for i, candidate in enumerate(grid):
            run_preset = with_options(tune_preset[env_name], env_name, kind, candidate)
            phase += [((env_name, tuning_label(kind, i), s), run_preset, tune_tasks[env_name]) for s in tuning.seeds]
    run_all(phase, "tuning runs")
    missing = [key for key, _, _ in phase if key not in runs]
    if missing:
        raise SystemExit(f"--report-only: the tuning has not finished ({len(missing)} tuning run(s) missing, e.g. {missing[0]})")
    tuned = copy.deepcopy(preset)
    tuning_results: dict[str, dict[str, Any]] = {}
    for (env_name, kind), grid in candidates.items():
        per_seed = [[run_metrics(runs[(env_name, tuning_label(kind, i), s)], tune_preset[env_name], preset.budget_unit)[tuning.criterion]
                     for s in tuning.seeds] for i in range(len(grid))]
        best, scores = choose(per_seed)
        tuned = with_options(tuned, env_name, kind, grid[best])
        tuning_results.setdefault(env_name, {})[kind] = {
            "algorithms": [a for a, k in kinds.items() if k == kind],
            "candidates": grid, "scores": scores, "scores_per_seed": per_seed, "chosen": grid[best], "chosen_index": best,
            "seeds": list(tuning.seeds), "criterion": f"{tuning.criterion} of evaluated success on {len(tune_tasks[env_name])} held-out "
            f"training tasks x {tuning.episodes} episode(s)", "tasks": len(tune_tasks[env_name]),
        }
    # 3. the comparison: every algorithm at its tuned options (the controls at their algorithm's),
    #    and the treatment and the comparator at their defaults (a default equal to the tuned
    #    choice is the tuned run itself)
    default_labels = [a + DEFAULTS_SUFFIX for a in (preset.treatment, preset.comparator) if kinds.get(a) in tuned_kinds]
    default_seeds = {e: list(preset.for_env("seeds", e))[: tuning.default_seeds] for e in tuned_envs}
    same = {(e, a) for e in tuned_envs for a in default_labels
            if build_algorithm(a.split("@")[0], preset, 0, e).config() == build_algorithm(a.split("@")[0], tuned, 0, e).config()}
    # seed by seed (the runs start in this order: an interrupted comparison has whole seeds)
    work = []
    for e, s in pairs:
        work += [((e, a, s), tuned, splits[e][1]) for a in preset.algorithms]
        work += [((e, a, s), preset, splits[e][1]) for a in default_labels if s in default_seeds.get(e, ()) and (e, a) not in same]
    run_all(work, "runs")
    for e, s in pairs:
        for a in default_labels:
            if (e, a) in same and s in default_seeds[e] and (e, a.split("@")[0], s) in runs:
                runs[(e, a, s)] = {**runs[(e, a.split("@")[0], s)], "algorithm": a, "same_as_tuned": True}
    finished = {e: [s for s in preset.for_env("seeds", e) if all((e, a, s) in runs for a in preset.algorithms)] for e in preset.envs}
    if args.report_only:  # the seeds whose every run has finished
        unfinished = {e: [s for s in preset.for_env("seeds", e) if s not in finished[e]] for e in preset.envs}
        if not all(len(v) >= 2 for v in finished.values()):
            raise SystemExit(f"--report-only: fewer than 2 finished seeds per env ({finished})")
        tuned.seeds = {**({e: tuned.for_env("seeds", e) for e in tuned.envs}), **{e: tuple(v) for e, v in finished.items()}}
    keys = [(e, a, s) for e in preset.envs for s in finished[e] for a in preset.algorithms]
    default_keys = [(e, a, s) for e in tuned_envs for a in default_labels for s in default_seeds[e] if (e, a, s) in runs and s in finished[e]]
    labels = [*preset.algorithms, *default_labels]
    ordered = [runs[k] for k in keys] + [runs[k] for k in default_keys]
    results = aggregate(ordered, tuned, list(preset.envs), labels)
    if args.report_only:
        results["unfinished_seeds"] = unfinished
    if not writer:  # rank 0 reports
        return results
    results["preset"] = preset_dict(preset)  # as given (the tuned options are under per_env[env]["tuning"])
    results["example_trees"] = example_trees([runs[k] for k in keys], out)
    for env_name in preset.envs:
        results["per_env"][env_name]["data"] = data[env_name]
        if env_name in tuning_results:
            results["per_env"][env_name]["tuning"] = tuning_results[env_name]
    tuning_runs = [r for k, r in runs.items() if "@tune" in k[1]]
    results["code_versions"] = code_versions(initials.values(), [*ordered, *tuning_runs], out)
    sessions = note_session(out, session)
    results["timing"] = {
        "wall_seconds": time.perf_counter() - started,
        "total_wall_seconds": float(sum(s["wall_seconds"] for s in sessions)),
        "sessions": sessions,
        "jobs": workers,
        "ranks": ranks,
        "ray": args.ray,
        "cpu_count": os.cpu_count(),
        "resumed": len(sessions) > 1,
        "run_seconds_total": float(sum(r["seconds"] for r in ordered)),
        "tuning_run_seconds_total": float(sum(r["seconds"] for r in tuning_runs)),
        "initial_seconds_total": float(sum(i["warm"].get("seconds_build", 0.0) + i["warm"].get("seconds_eval", 0.0)
                                           + i["warm"].get("seconds_reference", 0.0) for i in initials.values())),
    }
    write_report(results, out)
    return results


def tuning_preset(preset: Preset, env: str) -> Preset:
    """The setting of ``env``'s tuning runs: ``preset`` with the tuning's episodes per
    evaluation (the held-out tasks are passed to the runs)."""
    out = copy.deepcopy(preset)
    out.envs[env].eval_split = "held-out"  # the held-out tasks are the training env's
    out.envs[env].extra_eval = {}  # the criterion reads the held-out tasks only
    episodes = dict(out.eval_episodes) if isinstance(out.eval_episodes, dict) else {e: out.eval_episodes for e in out.envs}
    episodes[env] = preset.tuning.episodes
    out.eval_episodes = episodes
    return out


def with_options(preset: Preset, env: str, kind: str, candidate: dict[str, Any]) -> Preset:
    """A copy of ``preset`` whose ``env`` runs ``kind``'s algorithms (its variants and the
    controls that collect as it) with ``candidate`` over its current options."""
    out = copy.deepcopy(preset)
    setup = out.envs[env]
    base = setup.options.get(kind) or out.options.get(kind) or option_classes()[kind]()
    setup.options[kind] = candidate_options(base, candidate)
    return out


def start_session(out: Path, jobs: int, resumed: bool) -> dict[str, Any]:
    """Record this invocation in ``out/sessions.json`` (its start, jobs, the machine's load) and
    return its entry; :func:`note_session` keeps its wall time current, so an interrupted session
    still counts in the total across resumes."""
    entry = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wall_seconds": 0.0, "jobs": jobs,
             "resume_flag": resumed, "load_start": list(os.getloadavg()), "_t0": time.perf_counter()}
    path = out / "sessions.json"
    sessions = read_json_or_redo(path, [])
    entry["index"] = len(sessions)
    _write_sessions(path, [*sessions, entry])
    return entry


def note_session(out: Path, entry: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Update this session's wall time and load in ``out/sessions.json``; returns every session."""
    path = out / "sessions.json"
    sessions = read_json_or_redo(path, [])
    if entry is not None:
        entry["wall_seconds"] = time.perf_counter() - entry["_t0"]
        entry["load_now"] = list(os.getloadavg())
        sessions = [s for s in sessions if s.get("index") != entry["index"]] + [entry]
        sessions.sort(key=lambda s: s.get("index", 0))
        _write_sessions(path, sessions)
    return [{k: v for k, v in s.items() if not k.startswith("_")} for s in sessions]


def _write_sessions(path: Path, sessions: list[dict[str, Any]]) -> None:
    write_json(path, [{k: v for k, v in s.items() if not k.startswith("_")} for s in sessions], indent=2)


def write_report(results: dict[str, Any], out: Path) -> None:
    """``results.json``, ``results.md`` and the plots into ``out``; the Markdown is printed too."""
    write_json(out / "results.json", results, indent=2)
    atomic_write(out / "results.md", markdown(results))
    written = plots(results, out) + [out / p for pictures in results["example_trees"].values() for p in pictures.values()]
    print(markdown(results))
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, " + ", ".join(str(p) for p in written))


def code_versions(initials: Any, runs: Any, out: Path) -> list[str]:
    """The code versions (:func:`~bpo_algos.run_log.code_version`) that made the initial jobs and
    runs of the comparison in ``out``, sorted (``"unrecorded"`` for results written before
    versions were); a warning when there are several (a folder resumed after the code changed)."""
    made = sorted({i["warm"].get("code", "unrecorded") for i in initials} | {r.get("code", "unrecorded") for r in runs})
    if len(made) > 1:
        print(f"warning: {out} holds results of {len(made)} code versions (a folder resumed after the code changed): "
              f"{'; '.join(made)}. For results of one version, run into a new --out.", file=sys.stderr)
    return made


def _expected_cost(preset: Preset, env: str, algorithm: str, seed: int) -> float:
    """A rough relative cost of a run, to start the longest first (order never changes results)."""
    tree_heavy = 3.0 if "tree" in algorithm else 1.0
    return preset.trainer_for(env).updates * preset.budget[env] * tree_heavy * (3.0 if "alfworld" in env else 1.0)


def _save_initial(folder: Path, value: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("policy", "reference"):
        if value[name] is not None:
            # policy.pt pickles a whole policy object: sealed, so only this user's files load
            data = seal(value[name], POLICY_SEAL) if name == "policy" else value[name]
            atomic_write(folder / f"{name}.pt", data)
    write_json(folder / "initial.json", value["warm"])  # last: it marks the job done


POLICY_SEAL = "bpo-compare-initial-policy"


def _load_initial(folder: Path) -> dict[str, Any] | None:
    """The saved initial job in ``folder``; None when it is to be (re)done."""
    warm = read_json_or_redo(folder / "initial.json")
    if warm is None:
        return None

    def read(name: str) -> bytes | None:
        path = folder / f"{name}.pt"
        return path.read_bytes() if path.exists() else None

    policy = read("policy")
    if policy is not None:
        try:
            policy = unseal(policy, POLICY_SEAL, str(folder / "policy.pt"))
        except SealError as exc:
            print(f"warning: {exc}; redoing it", file=sys.stderr)
            return None
    return {"warm": warm, "policy": policy, "reference": read("reference")}


_LOGGING_FIELDS = ("tensorboard", "wandb_project", "wandb_group", "progress")
"""TrainerConfig fields that change where a run logs, not what it computes."""


def _setting(preset: dict[str, Any]) -> dict[str, Any]:
    """A preset's JSON without the logging fields (what a resumed comparison must match), its
    training and shared algorithm settings as ``trainer.FIELD`` / ``shared.FIELD`` keys."""
    out = {k: v for k, v in preset.items() if k not in ("trainer", "shared")}
    out.update({f"trainer.{k}": v for k, v in preset.get("trainer", {}).items() if k not in _LOGGING_FIELDS})
    out.update({f"shared.{k}": v for k, v in preset.get("shared", {}).items()})
    return out

def _env_setup_defaults() -> dict[str, Any]:
    """:class:`EnvSetup`'s defaults as :func:`preset_dict` writes them."""
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(EnvSetup)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    return json.loads(json.dumps(defaults, default=str))


def env_setting(saved: dict[str, Any], env: str) -> dict[str, Any]:
    """What of a preset (as :func:`preset_dict` data) env ``env``'s runs depend on: its own
    ``EnvSetup``, its entry of every per-env field, and every other field but the loggers'
    (:func:`_setting`)."""
    out: dict[str, Any] = {}
    for key, value in _setting(saved).items():
        if key == "envs":
            out[key] = value.get(env)
        elif key in PER_ENV_FIELDS and isinstance(value, dict):
            default = Preset.__dataclass_fields__[key].default
            out[key] = value.get(env, None if key == "budget" else default)
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
