"""The jobs of the main job: one initial policy per (env, seed), one run per (env, algorithm, seed).

An *initial job* builds the (env, seed)'s initial policy (warm-started by behaviour cloning on
the env's expert trajectories where the preset says so), evaluates it (the warm start: update 0
of every algorithm's evaluated curve, the same for all of them) and, when gradient probes are
on, collects the pool of RLOO batches whose mean is the reference gradient at the warm start.
Both read only their resolved settings (:mod:`bpo_experiments.run_config`: the initial job its
env's :class:`~bpo_experiments.run_config.EnvConfig`, a run its
:class:`~bpo_experiments.run_config.RunConfig`), never the preset. A *run* copies that policy and trains one algorithm with :class:`~bpo_algos.Trainer` under the same
optimizer, task sequence and per-update budget, evaluates the policy at the configured updates
on the fixed evaluation tasks with common random numbers, probes its gradient's
signal-to-noise ratio at the warm start and at mid-training, and caches its result in
``run.json`` (its configuration in ``config.json`` from the start, evaluations and probes along
the way in ``evals.json`` / ``probes.json``, the trainer's state in its checkpoint) so an
interrupted comparison resumes.

Each job is a function of its arguments only (its seeds, the initial policy's bytes, the
tasks), so the jobs run in any order, in this process, in worker processes (``--jobs``) or on a
Ray cluster (``--ray``) with the same results (:mod:`bpo_experiments.parallel`).

What a job is made of lives beside it: its configuration (:mod:`bpo_experiments.run_config`),
the policy, the algorithm and the trainer's config (:mod:`bpo_experiments.build`), the tasks (:mod:`bpo_experiments.tasks`), the evaluation
(:mod:`bpo_experiments.evaluation`), the gradient probes and the mechanism
(:mod:`bpo_experiments.probes`) and where its files go (:mod:`bpo_experiments.output`).
"""

from __future__ import annotations

import functools
import gc
import io
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bpo_envs  # noqa: F401 - registers the ids
from bpo_algos.algorithm import Algorithm
from bpo_algos.diagnostics import signal_to_noise, variance_summary
from bpo_algos.mechanism import measure as measure_mechanism
from bpo_algos.policy.weights import InitialWeights, fresh_copy, reusable, state_digest
from bpo_algos.rollout import EnvPool
from bpo_algos.run_log import code_version
from bpo_algos.trainer import Trainer
from bpo_envs.files import read_json_or_redo
from bpo_experiments.build import make_policy
from bpo_experiments.evaluation import evaluate_episodes, evaluate_extra
from bpo_experiments.output import run_dir, write_on_rank0
from bpo_experiments.presets import EnvSetup
from bpo_experiments.probes import (
    batches_for_error,
    gradient_rows,
    reference_gradient,
    sized_batches,
)
from bpo_experiments.run_config import (
    CONFIG_FILE,
    EnvConfig,
    RunConfig,
    base_algorithm,
    with_run_fields,
)
from bpo_experiments.streams import (
    BOOTSTRAP,
    MECHANISM,
    PROBE,
    PROBE_POINTS,
    stream_seed,
)
from bpo_experiments.tasks import env_factory, eval_env_factory, steps_inline

__all__ = ["base_algorithm", "initial_job", "initial_policy", "run_one"]

_INITIAL_WEIGHTS: weakref.WeakKeyDictionary[Any, InitialWeights] = weakref.WeakKeyDictionary()
"""The saved initial weights of each reusable initial policy, for as long as the policy lives."""


def _initial_weights(initial: Any) -> InitialWeights | None:
    """The initial weights of an LLM policy, saved on its first run (then restored in place per
    run instead of deep-copying the model, or a vLLM engine); None for small policies."""
    if not reusable(initial):
        return None
    saved = _INITIAL_WEIGHTS.get(initial)
    if saved is None:
        saved = _INITIAL_WEIGHTS[initial] = InitialWeights(initial)
    return saved


def _save_policy(policy: Any) -> bytes | None:
    """The initial policy as bytes another process loads, or None for an LLM policy (rebuilt
    from its model and warm start in each process: its weights are gigabytes)."""
    if reusable(policy):
        return None
    buffer = io.BytesIO()
    torch.save(policy, buffer)
    return buffer.getvalue()


def _load_policy(data: bytes) -> Any:
    # a whole policy object (a pickle): bytes of this comparison, from the initial job or a
    # policy.pt whose seal compare checked (docs/snapshots.md#trust)
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


JOB_GC_THRESHOLD = 5000
"""The garbage collector's first threshold while a job or a comparison runs (Python's: 700)."""


@contextmanager
def collector_for_jobs(freeze: bool = True) -> Iterator[None]:
    """The garbage collector's first threshold at :data:`JOB_GC_THRESHOLD` inside, and with
    ``freeze`` every object that exists on entry (modules, the env's data, caches) out of its
    view (``gc.freeze``), put back on exit (``gc.unfreeze``, so nothing is kept for good).

    A job makes trees, contexts and pages by the hundred thousand and keeps many of them for a
    while; with Python's defaults each full collection walks the whole heap again and the young
    generations are swept every 700 allocations: a seventh of a small WebShop job's CPU time,
    a third of that with these (docs/main-job.md, "Where the time goes"). It changes when
    memory is freed, never a result."""
    threshold = gc.get_threshold()
    if freeze:
        gc.freeze()
    gc.set_threshold(max(threshold[0], JOB_GC_THRESHOLD), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if freeze:
            gc.unfreeze()


def long_lived_frozen(job: Callable[..., Any]) -> Callable[..., Any]:
    """``job`` run inside :func:`collector_for_jobs` (what exists when it starts frozen)."""

    @functools.wraps(job)
    def run(*args: Any, **kwargs: Any) -> Any:
        with collector_for_jobs():
            return job(*args, **kwargs)

    return run


INLINE_EVAL_ENVS = 64
"""Envs of an evaluation pool where the env steps inline (:func:`~bpo_experiments.tasks.steps_inline`;
else the preset's ``pool_size``): the episodes advance that many at a time, one policy pass per
step over all of them. Each episode draws from its own streams, so the wins are those of any
pool size (docs/main-job.md, "Where the time goes")."""

LOCKSTEP_PROBE_BATCHES = 16
"""Probe and reference batches collected together at most (each on a pool of ``pool_size`` envs
of its own), where the env steps inline; elsewhere one batch at a time (a blocking env's pool
holds sandboxes). See :func:`~bpo_experiments.probes.gradient_rows`' ``pools``."""


def evaluation_pool_size(setup: EnvSetup, pool_size: int) -> int:
    """The envs an evaluation of ``setup``'s env runs on (:data:`INLINE_EVAL_ENVS`)."""
    return max(pool_size, INLINE_EVAL_ENVS) if steps_inline(setup) else pool_size


def lockstep_pools(setup: EnvSetup, pool_size: int) -> list[EnvPool]:
    """The pools probe batches are collected on together (:data:`LOCKSTEP_PROBE_BATCHES`; none
    where the env may block); the caller closes them. Envs are made on first use."""
    if not steps_inline(setup):
        return []
    return [EnvPool([env_factory(setup)] * pool_size, workers=setup.workers) for _ in range(LOCKSTEP_PROBE_BATCHES)]


def _close(pools: list[EnvPool]) -> None:
    for pool in pools:
        pool.close()


@long_lived_frozen
def initial_job(env: EnvConfig, seed: int, train_tasks: list[Any], eval_tasks: list[Any]) -> dict[str, Any]:
    """The (env, seed)'s initial policy, its evaluation (the warm start) and, when probes are on,
    the warm start's reference gradient, with the env's resolved settings ``env``. Returns
    ``{"warm": {...}, "policy": bytes | None, "reference": bytes | None}``."""
    if env.torch_threads:
        torch.set_num_threads(env.torch_threads)
    setup = env.setup
    start = time.perf_counter()
    policy = make_policy(env.policy, setup, seed, train_tasks)
    built = time.perf_counter() - start
    pool = EnvPool([eval_env_factory(setup)] * evaluation_pool_size(setup, env.pool_size), workers=setup.workers)
    try:
        wins = evaluate_episodes(policy, pool, eval_tasks, env.evaluation.episodes, seed)
    finally:
        pool.close()
    warm = {"success": float(np.mean(wins)), "episodes": len(wins), "wins": wins, "seconds_build": built,
            "seconds_eval": time.perf_counter() - start - built, "code": code_version()}
    if setup.extra_eval:
        warm["extra"] = evaluate_extra(policy, setup, env.evaluation.episodes, evaluation_pool_size(setup, env.pool_size), seed)
    reference = None
    if env.probes_on(seed):
        pool = EnvPool([env_factory(setup)] * env.pool_size, workers=setup.workers)
        pools = lockstep_pools(setup, env.pool_size)
        try:
            t0 = time.perf_counter()
            mean, signal, sizing = reference_gradient(env.probes.reference, env.probes.reference_batches, seed, policy, pool, train_tasks,
                                                      env.per_update_budget(), precision=env.probes.reference_precision, pools=pools)
            warm["seconds_reference"] = time.perf_counter() - t0
            warm["reference_sizing"] = sizing
        finally:
            pool.close()
            _close(pools)
        buffer = io.BytesIO()
        torch.save({"mean": mean, "signal": signal}, buffer)
        reference = buffer.getvalue()
    return {"warm": warm, "policy": _save_policy(policy), "reference": reference}


_POLICIES: dict[tuple[str, int], Any] = {}
"""LLM initial policies built in this process, by (env, seed) (their weights restored per run)."""


def initial_policy(key: tuple[str, int], data: bytes | None, rebuild: Callable[[], Any] | None) -> Any:
    """The initial policy of a run of the (env, seed) ``key``: loaded from the initial job's
    bytes, or (an LLM policy) made by ``rebuild`` once per process and restored per run."""
    if data is not None:
        return _load_policy(data)
    if rebuild is None:
        raise ValueError(f"the initial policy of {key} has no bytes (an LLM policy): pass rebuild, the call that makes it")
    if key not in _POLICIES:
        _POLICIES.clear()  # one LLM at a time
        _POLICIES[key] = rebuild()
    initial = _POLICIES[key]
    return fresh_copy(initial, _initial_weights(initial))


class _Measurements:
    """What a run measures after each update (the ``after_update`` hook of
    :meth:`~bpo_algos.trainer.Trainer.train`): the evaluations at ``config.settings.eval_points``, the
    mechanism at ``config.settings.mechanism_points`` and the gradient probes at ``config.settings.probe_points``,
    each written to its file in the run's folder when taken (a resumed run keeps those it has)."""

    def __init__(self, folder: Path, config: RunConfig, policy: Any, pool: EnvPool, eval_pool: EnvPool, train_tasks: list[Any],
                 eval_tasks: list[Any], warm: dict[str, Any], reference: bytes | None, algorithm: Algorithm,
                 probe_pools: list[EnvPool] | None = None) -> None:
        self.folder, self.config, self.seed = folder, config, config.seed
        self.policy, self.pool, self.eval_pool = policy, pool, eval_pool
        self.probe_pools = probe_pools or []
        """Pools the probes collect their batches on together (:func:`lockstep_pools`)."""
        self.train_tasks, self.eval_tasks, self.warm = train_tasks, eval_tasks, warm
        self.budget, self.biased = config.per_update_budget(), not algorithm.unbiased
        self.reference = torch.load(io.BytesIO(reference), weights_only=True) if reference is not None else None  # tensors only
        self.evals: list[dict[str, Any]] = read_json_or_redo(folder / "evals.json", [])
        self.probes: dict[str, Any] = read_json_or_redo(folder / "probes.json", {})
        self.mechanism: dict[str, Any] = read_json_or_redo(folder / "mechanism.json", {})
        self.timing: dict[str, float] = read_json_or_redo(folder / "timing.json", {"eval": 0.0, "probe": 0.0})
        self.probe_rows: torch.Tensor | None = None
        """The last probe's batch gradients (this process's): the next probe is sized on them."""
        self.initial_digest = state_digest(policy)

    def unchanged(self) -> bool:
        """Whether the policy's whole state is still the warm start's (:func:`state_digest`):
        then every evaluation of it equals the initial job's, episode by episode, and is not
        played again. The positive control ``frozen`` (a zero gradient: Adam's step is zero)
        is; a learner after its first update is not."""
        return self.initial_digest is not None and state_digest(self.policy) == self.initial_digest

    def __call__(self, trainer: Trainer) -> None:
        self.evaluate(trainer)
        self.measure_mechanism(trainer)
        self.probe(trainer)

    def evaluate(self, trainer: Trainer) -> None:
        u = trainer.update
        if u not in self.config.settings.eval_points or any(e["update"] == u for e in self.evals):
            return
        t0 = time.perf_counter()
        same = u > 0 and self.unchanged()  # still the warm start's very state (frozen): its evaluation is the warm start's
        if u == 0 or same:  # the initial job's evaluation of this very policy
            success = self.warm["success"]
        else:
            trainer.gather_weights()  # FSDP: ranks play different episodes, so no collective forwards
            try:
                wins = evaluate_episodes(self.policy, self.eval_pool, self.eval_tasks, self.config.settings.evaluation.episodes, self.seed)
                success = float(np.mean(wins))
            finally:
                trainer.shard_weights()
        compute = {k: float(v) for k, v in trainer.total_compute.to_dict().items()}
        self.evals.append({"update": u, "success": success, "compute": compute, **({"warm_start_state": True} if same else {})})
        write_on_rank0(self.folder / "evals.json", self.evals)
        self.timing["eval"] += time.perf_counter() - t0
        write_on_rank0(self.folder / "timing.json", self.timing)

    def measure_mechanism(self, trainer: Trainer) -> None:
        u = trainer.update
        for point, at in self.config.settings.mechanism_points.items():
            if u == at and point not in self.mechanism and trainer.last_batch is not None:
                found = measure_mechanism([trainer.last_batch], seed=stream_seed(self.seed, MECHANISM, at))
                self.mechanism[point] = {**found.to_json(), "update": u}
                write_on_rank0(self.folder / "mechanism.json", self.mechanism)

    def probe(self, trainer: Trainer) -> None:
        u = trainer.update
        for point, at in self.config.settings.probe_points.items():
            if not self.config.probing or u != at or point in self.probes:
                continue
            t0 = time.perf_counter()
            key = PROBE_POINTS[point]
            probe = self.config.build_algorithm(seed=stream_seed(self.seed, PROBE, key))
            samples, sizing = gradient_rows(probe, self.policy, self.pool, self.train_tasks, self.budget, self.config.settings.probes.batches,
                                            *self._sizing(point), pools=self.probe_pools)
            self.probe_rows = samples.grads
            ref = None
            if point == "initial" and self.reference is not None:
                ref = (self.reference["mean"], self.reference["signal"])
            elif point != "initial" and self.biased:
                *ref, _ = reference_gradient(self.config.settings.probes.reference, self.config.settings.probes.reference_batches, self.seed, self.policy,
                                             self.pool, self.train_tasks, self.budget, point, self.config.settings.probes.reference_precision,
                                             pools=self.probe_pools)
                ref = tuple(ref)
            result = signal_to_noise(samples, ref, seed=stream_seed(self.seed, BOOTSTRAP, key))
            result.update({k: v for k, v in variance_summary(samples).items() if k in ("grad_norm_var", "grad_norm_mean")})
            result["update"] = u
            result["sizing"] = sizing
            self.probes[point] = result
            write_on_rank0(self.folder / "probes.json", self.probes)
            self.timing["probe"] += time.perf_counter() - t0
            write_on_rank0(self.folder / "timing.json", self.timing)

    def _sizing(self, point: str) -> tuple[Any, Any]:
        """``(precision, sizing)`` of :func:`~bpo_experiments.probes.gradient_rows` at probe
        ``point``, from evidence independent of that probe's batches: the run's previous probe
        (same estimator), else at the warm start the reference pool's measured error (the same
        policy), else the probe's own pilot; ``(None, None)`` without a precision target."""
        target = self.config.settings.probes.precision
        if target is None:
            return None, None
        rule = partial(sized_batches, target=target, most=self.config.settings.probes.batches)
        if self.probe_rows is not None:
            return rule, self.probe_rows
        sizing = self.warm.get("reference_sizing") or {}
        if point == "initial" and "snr_relative_error" in sizing:
            return rule, batches_for_error(sizing["snr_relative_error"], sizing["batches"], target, self.config.settings.probes.batches)
        return rule, None


@long_lived_frozen
def run_one(
    out: Path,
    config: RunConfig,
    initial: bytes | None,
    warm: dict[str, Any],
    reference: bytes | None,
    train_tasks: list[Any],
    eval_tasks: list[Any],
    progress: bool = False,
    rebuild: Callable[[], Any] | None = None,
    skip_zero_loss_collection: bool = True,
) -> dict[str, Any]:
    """Train one algorithm from the initial policy and measure it, with the settings of
    ``config`` (:class:`~bpo_experiments.run_config.RunConfig`: written to the run's folder as
    ``config.json`` when it starts); cached in ``run.json`` (with its ``"config"``).

    ``config.algorithm`` is the run's label (:func:`base_algorithm`): its folder and its results'
    ``"algorithm"``. The initial policy is ``initial``'s bytes, or (an LLM policy) ``rebuild()``'s,
    made once per process and restored per run.

    ``skip_zero_loss_collection`` (the main job's default): a run of an algorithm with a zero
    loss (``frozen``) collects and checks its first update and skips the later ones'
    collection, reporting their budget as spent
    (:meth:`~bpo_algos.trainer.Trainer.train`; docs/main-job.md, "Scheduling"): its
    evaluations, budget and final state are those of the run that collects; its training curve
    has one point and its mechanism only the warm start's batch. No effect on any other run."""
    folder = run_dir(out, config.env, config.algorithm, config.seed)
    done = folder / "run.json"
    saved = read_json_or_redo(done, None)
    if saved is not None:
        return saved
    if config.settings.torch_threads:
        torch.set_num_threads(config.settings.torch_threads)
    folder.mkdir(parents=True, exist_ok=True)
    write_on_rank0(folder / CONFIG_FILE, config.to_json())
    setup = config.setup
    pool = EnvPool([env_factory(setup)] * config.settings.pool_size, workers=setup.workers)
    eval_size = evaluation_pool_size(setup, config.settings.pool_size)
    separate_eval = setup.eval_split not in ("held-out", "train") or eval_size != config.settings.pool_size
    eval_pool = EnvPool([eval_env_factory(setup)] * eval_size, workers=setup.workers) if separate_eval else pool
    probe_pools = lockstep_pools(setup, config.settings.pool_size) if config.probing else []
    policy = initial_policy((config.env, config.seed), initial, rebuild)
    algorithm = config.build_algorithm()
    measure = _Measurements(folder, config, policy, pool, eval_pool, train_tasks, eval_tasks, warm, reference, algorithm, probe_pools)
    start, start_cpu = time.perf_counter(), time.process_time()
    try:
        trainer = with_run_fields(config, out_dir=folder, progress=progress,
                                  wandb_name=f"{config.env}/{config.algorithm}/seed{config.seed}", wandb_config=config.to_json())
        history = Trainer(algorithm, policy, pool, train_tasks, trainer).train(after_update=measure,
                                                                               skip_zero_loss_collection=skip_zero_loss_collection)
    finally:
        pool.close()
        _close(probe_pools)
        if separate_eval:
            eval_pool.close()
    extra = None
    if setup.extra_eval:
        t0 = time.perf_counter()
        extra = read_json_or_redo(folder / "extra_eval.json", None)
        if extra is None:
            if measure.unchanged() and "extra" in warm:  # the warm start's policy: its evaluation
                extra = warm["extra"]
            else:
                extra = evaluate_extra(policy, setup, config.settings.evaluation.episodes, eval_size, config.seed)
            write_on_rank0(folder / "extra_eval.json", extra)
        measure.timing["eval"] += time.perf_counter() - t0
    result = _run_result(config, algorithm, warm, measure, extra, history)
    result["seconds"] = time.perf_counter() - start
    # the run's own process's CPU (a run never shares its process with another): what the run
    # costs on an idle core, whatever else loaded the machine (bpo-compare --plan reads it)
    result["seconds_cpu"] = time.process_time() - start_cpu
    result["seconds_eval"] = measure.timing["eval"]
    result["seconds_probe"] = measure.timing["probe"]
    result["code"] = code_version()
    write_on_rank0(done, result)
    return result


def _run_result(config: RunConfig, algorithm: Algorithm, warm: dict[str, Any], measure: _Measurements,
                extra: dict[str, Any] | None, history: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's ``run.json`` but its timing and code version: its evaluated curve, its training
    batches' curve, its compute, its probes and mechanism, and its configuration."""
    norms = np.array([row["grad_norm"] for row in history])
    evals = sorted(measure.evals, key=lambda e: e["update"])
    return {
        "env": config.env,
        "algorithm": config.algorithm,
        "seed": config.seed,
        "options": algorithm.config(),
        "budget_multiple": algorithm.budget_multiple,
        "final_success": evals[-1]["success"],
        "warm_success": warm["success"],
        "evals": evals,
        "extra_eval": None if extra is None else {
            split: {"warm": warm["extra"][split]["success"], "final": v["success"], "episodes": v["episodes"]} for split, v in extra.items()
        },
        "curve": [row["success"] for row in history],  # NaN where an update collected nothing
        "collected_updates": sum(bool(row.get("collected", True)) for row in history),
        "returns": [row["return"] for row in history],
        "compute_per_update": {k: float(np.mean([row["compute"][k] for row in history])) for k in history[0]["compute"]},
        "compute_cumulative": [row["compute_total"][config.budget_unit] for row in history],
        "compute_total": {k: float(v) for k, v in history[-1]["compute_total"].items()},
        "probes": measure.probes,
        "mechanism": measure.mechanism,
        "grad_norm_var_train": float(norms.var(ddof=1)) if len(norms) > 1 else 0.0,
        "config": config.to_json(),
    }
