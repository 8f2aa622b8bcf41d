"""``bpo-compare``'s flags and how each applies to the settings, and the checks before any run.

The flags generated from the config dataclasses (:mod:`bpo_experiments.flags`) and the
data-source flags, each applied to the settings by :mod:`bpo_experiments.config` (which
resolves the configuration file, the base preset and the flags in one place), and the checks a
setting must pass before any run starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import replace
from typing import Any

import torch

from bpo_algos import data_parallel as dp
from bpo_algos.algorithm import AlgorithmConfig
from bpo_algos.memory_plan import check_preset_fits
from bpo_algos.registry import registered_algorithms
from bpo_algos.trainer_config import TrainerConfig
from bpo_experiments.flags import add_flags, given
from bpo_experiments.presets import (
    ENV_SETTINGS,
    RUN_FIELDS,
    EnvSetup,
    Preset,
    with_env_settings,
)
from bpo_experiments.run_config import comparison_config, env_config, option_classes, option_kinds
from bpo_experiments.stats import METRICS
from bpo_experiments.tuning import (
    TuningConfig,
    check_tuning,
)

PRESET_FLAG_SKIP = ("envs", "trainer", "shared", "options", "algorithms", "treatment", "tuning")
"""Preset fields with flags of their own (``--envs``, ``--algorithms``, ...) or none (dataclasses
whose fields get flags, tables)."""


REMOVED_FLAGS = {"--group-size": "--KIND.group-size (e.g. --rloo.group-size 4)", "--backbones": "--bpo.backbones",
                 "--branch-factor": "--bpo.branch-factor",
                 "--algorithm-option": "--KIND.OPTION (e.g. --bpo.max-branch-points 2; a control's algorithm: --frozen.of grpo)"}
"""Flags of earlier versions that set an algorithm's option (one option of every algorithm that
has it; ``NAME.KEY=VALUE`` of one registered name), and the flag that sets it now: each kind of
algorithm's option has one flag, ``--KIND.OPTION``, that every registered algorithm of that kind
takes (:class:`~bpo_algos.registry.AlgorithmFactory`)."""


class _Removed(argparse.Action):
    """A removed flag: an error naming the flag that replaced it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        parser.error(f"{option_string} was removed: an algorithm's option is set by its kind's flag, "
                     f"{REMOVED_FLAGS[option_string or '']} (bpo-compare --help lists them)")


def add_config_flags(parser: argparse.ArgumentParser) -> dict[str, dict[str, str]]:
    """The generated flags: the preset's own fields, its TrainerConfig, the shared algorithm
    options and every kind of algorithm's options. Returns ``{holder: {dest: field}}``."""
    taken = set(parser._option_string_actions)
    holders: dict[str, dict[str, str]] = {}
    group = parser.add_argument_group("the preset")
    holders["preset"] = add_flags(group, Preset, skip=PRESET_FLAG_SKIP, taken=taken)
    group = parser.add_argument_group("every env (EnvSetup's settings of the comparison: one value sets it for every env)")
    holders["envs"] = add_flags(group, EnvSetup, skip=[f.name for f in dataclasses.fields(EnvSetup) if f.name not in ENV_SETTINGS],
                                taken=taken)
    group = parser.add_argument_group("training (TrainerConfig)")
    holders["trainer"] = add_flags(group, TrainerConfig, skip=RUN_FIELDS, taken=taken)
    group = parser.add_argument_group("every algorithm (AlgorithmConfig)")
    holders["shared"] = add_flags(group, AlgorithmConfig, taken=taken)
    for kind, options in option_classes().items():
        group = parser.add_argument_group(f"{kind} ({options.__name__}; also its variants)")
        holders[f"options:{kind}"] = add_flags(group, options, prefix=f"{kind}.", taken=taken)
    for flag in REMOVED_FLAGS:
        parser.add_argument(flag, action=_Removed, nargs="*", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return holders


def option_flags(args: argparse.Namespace, holders: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """``{kind: {option: value}}`` of the ``--KIND.OPTION`` flags given: the options the user set
    (pinned on a tuned env, :mod:`bpo_experiments.config`)."""
    changes = {holder.split(":", 1)[1]: given(args, dests) for holder, dests in holders.items() if holder.startswith("options:")}
    return {kind: {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()} for kind, fields in changes.items() if fields}


def apply_flags(preset: Preset, args: argparse.Namespace, holders: dict[str, dict[str, str]]) -> None:
    """Set the given generated flags on the preset's dataclasses (a check error is an exit)."""
    try:
        for key, value in given(args, holders["preset"]).items():
            if isinstance(value, list):
                value = tuple(value)
            setattr(preset, key, value)
        settings = given(args, holders["envs"])
        if settings:  # one value for every env
            preset.envs = with_env_settings(preset.envs, {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()})
        trainer = given(args, holders["trainer"])
        if trainer:
            preset.trainer = replace(preset.trainer, **trainer)
            for setup in preset.envs.values():  # a flag sets the field for every env
                setup.trainer = {k: v for k, v in setup.trainer.items() if k not in trainer}
        shared = given(args, holders["shared"])
        if shared:
            preset.shared = replace(preset.shared, **shared)
        classes = option_classes()
        for kind, fields in option_flags(args, holders).items():
            current = preset.options.get(kind) or classes[kind]()
            preset.options[kind] = replace(current, **fields)
            for setup in preset.envs.values():  # a flag sets the option for every env, its own options too
                if kind in setup.options:
                    setup.options[kind] = replace(setup.options[kind], **fields)
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"bpo-compare: {exc}") from exc


def apply_tuning_flags(preset: Preset, args: argparse.Namespace) -> None:
    """``--tune`` / ``--no-tune``, ``--tuning-seeds``, ``--tuning-grid KIND=JSON`` and
    ``--allow-unequal-grids`` on ``preset.tuning`` (:func:`check_tuning_setting` checks the result)."""
    tune, seeds, grids, unequal = args.tune, args.tuning_seeds, args.tuning_grid or (), args.allow_unequal_grids
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


def check_tuning_setting(preset: Preset) -> None:
    """:func:`~bpo_experiments.tuning.check_tuning` of ``preset``'s tuning, if any: a bad tuning
    setting is an error before any run."""
    if preset.tuning is None:
        return
    try:
        seeds = {e: env_config(preset, e).seeds for e in preset.envs if preset.tuning.tunes(e)}
        check_tuning(preset, option_classes(), option_kinds(preset.algorithms, preset), seeds)
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
        value = vars(args)[attr]
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


def apply_swe_train_rows(preset: Preset, args: argparse.Namespace, setups: list[Any]) -> None:
    """``--swe-train-instances``: SWE-bench trains on those rows and evaluates on
    ``--swe-instances`` (all its rows, in order, up to ``eval_tasks``), which must share no
    instance id (and, with ``--swe-disjoint-repos``, no repo): checked here, before training.
    A preset whose SWE-bench evaluates on separate rows (the gpu presets) needs both, from these
    flags or from a configuration file that names both (``kwargs.instances``,
    ``eval_kwargs.instances``: a results folder's ``config.yaml``)."""
    from bpo_envs.swebench.instances import (
        InstanceError,
        check_disjoint,
        load_instances,
    )

    train, disjoint_repos = args.swe_train_instances, args.swe_disjoint_repos
    if train is None:
        if disjoint_repos:
            raise SystemExit("--swe-disjoint-repos needs --swe-train-instances (the training rows)")
        for setup in setups:
            if setup.eval_split == "rows" and args.swe_instances is None and setup.kwargs.get("instances") \
                    and setup.eval_kwargs.get("instances"):
                try:  # both sets of rows from a configuration file (a results folder's config.yaml): checked again
                    check_disjoint(load_instances(str(setup.kwargs["instances"])), load_instances(str(setup.eval_kwargs["instances"])))
                except InstanceError as exc:
                    raise SystemExit(f"--config: the SWE-bench training and evaluation rows: {exc}") from exc
                continue
            if setup.eval_split == "rows":
                raise SystemExit(
                    "this preset trains SWE-bench off its evaluation rows: give --swe-train-instances (SWE-Gym, "
                    "SWE-smith or other SWE-bench-format rows: a file, folder or cached dataset name) and "
                    "--swe-instances (the evaluation rows, e.g. princeton-nlp/SWE-bench_Verified)"
                )
        return
    if not setups:
        raise SystemExit("--swe-train-instances is given but no env of this comparison is BPO-SWEBench-v0 (choose it with --envs)")
    evaluation = args.swe_instances
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
            check_preset_fits(comparison_config(dataclasses.replace(preset, gpu_gb=have)), name)
        except ValueError as exc:
            raise SystemExit(f"this GPU has {have:.0f} GB: {exc}") from exc
