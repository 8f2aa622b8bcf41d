"""One resolved configuration per run: :class:`RunConfig`, built once from the preset and the flags.

Every setting one run (env, algorithm, seed) uses is resolved here, once, from the preset the
flags were applied to (:mod:`bpo_experiments.command_line`, the tuned options included): the
algorithm's options, its per-update budget, the trainer's config, the initial policy's settings,
the evaluation and the probes. The runner reads its settings from it and from nothing else of
the preset. It is written beside the run's results, ``config.json`` in the run's folder when the
run starts and ``run.json``'s ``"config"`` when it ends, and a resumed comparison refuses a
run whose saved configuration differs from the one the flags resolve to now
(:func:`check_same_config`, docs/main-job.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bpo_algos.algorithm import Algorithm
from bpo_algos.compute import Budget
from bpo_algos.registry import make_algorithm
from bpo_algos.trainer_config import TrainerConfig
from bpo_envs.files import read_json_or_redo
from bpo_experiments.build import (
    PolicySettings,
    algorithm_options,
    build_algorithm,
    policy_settings,
    run_budget,
    trainer_config,
)
from bpo_experiments.evaluation import eval_points
from bpo_experiments.presets import EnvSetup, Preset
from bpo_experiments.probes import REFERENCE_ALGORITHM, mechanism_points, probe_points, probes_on
from bpo_experiments.streams import ALGORITHM, stream_seed

CONFIG_FILE = "config.json"
"""A run's :class:`RunConfig` in its folder, written when the run starts."""

LOGGING_FIELDS = ("tensorboard", "wandb_project", "wandb_group", "progress")
"""TrainerConfig fields that change where a run logs, not what it computes: a resumed run may
change them."""


@dataclass(frozen=True)
class RunConfig:
    """Everything one run is made with, resolved (:func:`run_config`)."""

    env: str
    """The env's name in the preset."""
    algorithm: str
    """The run's label: its folder and its results' ``"algorithm"`` (``bpo``, ``bpo@default``,
    ``bpo@tune2``)."""
    seed: int
    registered: str
    """The registered algorithm the label names."""
    options: dict[str, Any]
    """The keywords the algorithm is built with (:func:`~bpo_experiments.build.algorithm_options`;
    ``seed``: the run's algorithm stream)."""
    budget_unit: str
    budget: float
    """The per-update budget in ``budget_unit``, the algorithm's ``budget_multiple`` included."""
    trainer: TrainerConfig
    """The trainer's config but the run's folder and loggers' names (set when it runs)."""
    setup: EnvSetup
    """How the env is made and which tasks train and evaluate."""
    policy: PolicySettings
    """What the initial policy (the (env, seed)'s initial job's) is made with."""
    pool_size: int
    torch_threads: int | None
    eval_points: tuple[int, ...]
    """The updates after which the policy is evaluated (0: the warm start)."""
    eval_episodes: int
    probing: bool
    """Whether the run probes its gradient (the probed seeds' runs, not the tuning and default ones)."""
    probe_points: dict[str, int]
    mechanism_points: dict[str, int]
    grad_batches: int
    reference_batches: int
    grad_precision: float | None
    """The probes' precision target (``Preset.grad_precision``; None: ``grad_batches`` batches)."""
    reference_precision: float | None
    reference_options: dict[str, Any]
    """The options of the reference estimator (:data:`~bpo_experiments.probes.REFERENCE_ALGORITHM`)."""

    def per_update_budget(self) -> Budget:
        return Budget(self.budget_unit, self.budget)

    def build_algorithm(self, seed: int | None = None) -> Algorithm:
        """The run's algorithm (``seed``: another stream, e.g. a probe's, in place of the run's)."""
        return make_algorithm(self.registered, **{**self.options, **({} if seed is None else {"seed": seed})})

    def to_json(self) -> dict[str, Any]:
        """The configuration as plain JSON data (``config.json``)."""
        return json.loads(json.dumps(asdict(self), default=_plain))


def _plain(value: Any) -> Any:
    if isinstance(value, Budget):
        return {"unit": value.unit, "amount": value.amount}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def base_algorithm(label: str) -> str:
    """The registered algorithm of a run label: ``bpo`` for ``bpo``, ``bpo@default`` (the
    untuned defaults beside a tuned comparison) and ``bpo@tune2`` (tuning candidate 2)."""
    return label.split("@", 1)[0]


def run_config(preset: Preset, env: str, label: str, seed: int, tasks_per_update: int) -> RunConfig:
    """The :class:`RunConfig` of run ``label`` (:func:`base_algorithm` names the registered
    algorithm) on ``env`` with ``seed``, from ``preset`` (the flags applied,
    the run's tuned, default or candidate options in it)."""
    registered = base_algorithm(label)
    algorithm = build_algorithm(registered, preset, stream_seed(seed, ALGORITHM), env)
    budget = run_budget(preset, env, algorithm)
    return RunConfig(
        env=env,
        algorithm=label,
        seed=seed,
        registered=registered,
        options=algorithm_options(registered, preset, stream_seed(seed, ALGORITHM), env),
        budget_unit=budget.unit,
        budget=budget.amount,
        trainer=trainer_config(preset, env, seed, tasks_per_update, budget),
        setup=preset.envs[env],
        policy=policy_settings(preset, preset.envs[env]),
        pool_size=preset.pool_size,
        torch_threads=preset.torch_threads,
        eval_points=tuple(eval_points(preset, env)),
        eval_episodes=preset.for_env("eval_episodes", env),
        probing=probes_on(preset, env, seed) and registered == label,
        probe_points=probe_points(preset, env),
        mechanism_points=mechanism_points(preset, env),
        grad_batches=preset.for_env("grad_batches", env),
        reference_batches=preset.for_env("reference_batches", env),
        grad_precision=preset.for_env("grad_precision", env),
        reference_precision=preset.for_env("reference_precision", env),
        reference_options=algorithm_options(REFERENCE_ALGORITHM, preset, 0, env),
    )


def for_comparison(config: dict[str, Any]) -> dict[str, Any]:
    """A configuration's JSON without what a resumed run may change (its loggers)."""
    trainer = {k: v for k, v in config.get("trainer", {}).items() if k not in LOGGING_FIELDS}
    return {**config, "trainer": trainer}


def differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """The keys (``trainer.learning_rate``, ``options.group_size``) whose values differ."""
    out: list[str] = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(prefix + key)
    return out


def saved_config(folder: Path) -> dict[str, Any] | None:
    """The configuration a run in ``folder`` was made with: ``config.json``, else ``run.json``'s
    ``"config"``; None for a run not started, or started by a version that wrote none."""
    saved = read_json_or_redo(folder / CONFIG_FILE)
    if saved is None:
        saved = (read_json_or_redo(folder / "run.json") or {}).get("config")
    return saved


def check_same_config(folder: Path, config: RunConfig) -> None:
    """Refuse to resume (or reuse) the run in ``folder`` when it was made with another
    configuration than ``config``, naming what differs. A run started by an earlier version
    (no saved configuration) is left to the per-env setting check
    (:func:`~bpo_experiments.output.check_same_settings`)."""
    saved = saved_config(folder)
    if saved is None:
        return
    changed = differences(for_comparison(saved), for_comparison(config.to_json()))
    if changed:
        raise SystemExit(
            f"{folder} holds a run made with another configuration (differs in: {', '.join(changed)}; see "
            f"{folder / CONFIG_FILE}); choose another --out, or remove that run's folder to redo it"
        )


def with_run_fields(config: RunConfig, **run: Any) -> TrainerConfig:
    """The run's :class:`TrainerConfig` with its folder and loggers' names (``run``)."""
    return replace(config.trainer, **run)
