"""One run of the main job: the initial policy, the algorithm, training and its measurements.

For every env and seed, one initial policy (warm-started by behaviour cloning on the env's
expert trajectories where the preset says so) is copied to each algorithm, which then trains
with :class:`~bpo_algos.Trainer` under the same optimizer, learning rate, task sequence and
per-update budget. A run measures the gradient variance at the initial policy (the same probe
for every algorithm), trains, and evaluates the final policy on the evaluation tasks; its
result is cached in ``run.json`` so an interrupted comparison resumes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import bpo_envs  # noqa: F401 - registers the ids
from bpo_algos.algorithm import Algorithm, AlgorithmConfig
from bpo_algos.compute import Budget
from bpo_algos.diagnostics import gradient_samples, variance_summary
from bpo_algos.experiments.presets import EnvSetup, Preset, preset_dict
from bpo_algos.policy import TabularPolicy
from bpo_algos.policy.weights import InitialWeights, fresh_copy, reusable
from bpo_algos.registry import algorithm_factory, make_algorithm
from bpo_algos.rollout import EnvPool, RolloutEngine
from bpo_algos.trainer import Trainer, TrainerConfig


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
    options: dict[str, Any] = {"max_new_tokens": setup.max_new_tokens}
    if preset.trainer.precision == "bf16":
        options["dtype"] = torch.bfloat16  # the frozen base; trainable weights are kept in fp32
    if preset.vllm:
        from bpo_algos.policy import VLLMPolicy

        policy = VLLMPolicy(
            model, temperature=preset.temperature, lora=preset.lora, seed=seed,
            max_model_len=preset.max_model_len or 4096, **options,
        )
    else:
        policy = HFPolicy(model, temperature=preset.temperature, lora=preset.lora, seed=seed, max_model_len=preset.max_model_len, **options)
    return warm_start(policy, preset, setup, tasks, seed)


def warm_start(policy: Any, preset: Preset, setup: EnvSetup, tasks: list[Any], seed: int) -> Any:
    """Behaviour cloning on the env expert's trajectories of ``tasks`` (``sft_epochs``)."""
    epochs = preset.sft_epochs if setup.sft_epochs is None else setup.sft_epochs
    if epochs:
        from bpo_algos.policy.sft import behaviour_cloning, expert_demos

        demos = expert_demos(env_factory(setup), tasks, seed=seed)
        behaviour_cloning(policy, demos, epochs=epochs, lr=preset.sft_lr, seed=seed)
    return policy


def algorithm_class(factory: Any) -> type[Algorithm] | None:
    """The :class:`~bpo_algos.algorithm.Algorithm` subclass a factory builds: the factory
    itself, or the class a ``functools.partial`` wraps (None for any other callable)."""
    while isinstance(factory, partial):
        factory = factory.func
    return factory if isinstance(factory, type) and issubclass(factory, Algorithm) else None


def algorithm_options(name: str, preset: Preset, seed: int) -> dict[str, Any]:
    """The options the main job builds algorithm ``name`` with.

    The seed, ``aggregation`` and ``max_parallel_trees`` (default: a quarter of the env pool)
    and every other shared option the preset changes (:attr:`Preset.shared`); for a built-in
    kind of algorithm its own options (``preset.options[cls.name]``, all but those its variant
    fixes, e.g. ``bpo-anchored``'s ``baseline``); then ``preset.algorithm_options[name]``.
    """
    defaults = AlgorithmConfig().to_dict()
    shared = preset.shared.to_dict()
    options: dict[str, Any] = {"seed": seed, "aggregation": shared["aggregation"],
                               "max_parallel_trees": shared["max_parallel_trees"] or max(1, preset.pool_size // 4)}
    options.update({k: v for k, v in shared.items() if v != defaults[k] and k not in options})
    factory = algorithm_factory(name)
    cls = algorithm_class(factory)
    own = preset.options.get(cls.name) if cls is not None else None
    if own is not None:
        if not isinstance(own, cls.Options):
            raise TypeError(f"preset.options[{cls.name!r}] must be a {cls.Options.__name__}, got {type(own).__name__}")
        fixed = factory.keywords if isinstance(factory, partial) else {}
        options.update({k: v for k, v in own.to_dict().items() if k not in fixed})
    options.update(preset.algorithm_options.get(name, {}))
    return options


def build_algorithm(name: str, preset: Preset, seed: int) -> Algorithm:
    """Algorithm ``name`` from the registry, with :func:`algorithm_options`."""
    return make_algorithm(name, **algorithm_options(name, preset, seed))


def trainer_config(preset: Preset, env_name: str, seed: int, tasks_per_update: int, **run: Any) -> TrainerConfig:
    """The :class:`TrainerConfig` of one run: the env's training settings
    (:meth:`Preset.trainer_for`) with the run's own fields (:data:`RUN_FIELDS`: its tasks, the
    env's budget, the seed, ``run`` such as ``out_dir``), the last batch's trees saved."""
    config = preset.trainer_for(env_name)
    fields = {
        "tasks_per_update": tasks_per_update,
        "budget": Budget(preset.budget_unit, preset.budget[env_name]),
        "seed": seed,
        "save_trees_every": config.updates,  # the last batch's trees, for the report
        **run,
    }
    return replace(config, **fields)


def env_factory(setup: EnvSetup) -> Callable[[], gym.Env]:
    return lambda: gym.make(setup.env_id, **setup.kwargs)


def eval_env_factory(setup: EnvSetup) -> Callable[[], gym.Env]:
    """The envs the final policy is evaluated on: the training envs for ``"held-out"`` and
    ``"train"``, else envs made with ``split=setup.eval_split`` (a split of the env itself)."""
    if setup.eval_split in ("held-out", "train"):
        return env_factory(setup)
    kwargs = {**setup.kwargs, "split": setup.eval_split}
    return lambda: gym.make(setup.env_id, **kwargs)


def _shuffled_ids(make: Callable[[], gym.Env], seed: int = 12345) -> tuple[list[Any], dict[str, Any] | None]:
    env = make()
    try:
        ids = list(env.unwrapped.task_ids())
        provenance = getattr(env.unwrapped, "provenance", None)
        info = provenance() if callable(provenance) else None
    finally:
        env.close()
    rng = np.random.default_rng(seed)
    return [ids[i] for i in rng.permutation(len(ids))], info


def task_split(setup: EnvSetup) -> tuple[list[Any], list[Any]]:
    """Deterministic train and eval tasks (the same for every algorithm and seed).

    Train tasks: the first ``train_tasks`` of a fixed shuffle of the training env's tasks. Eval
    tasks: ``"held-out"``: the next ``eval_tasks`` of that shuffle; ``"train"``: the first
    ``eval_tasks`` train tasks; a split name: the first ``eval_tasks`` of a fixed shuffle of that
    split's tasks (disjoint from training when the env's splits are).
    """
    train, eval_tasks, _ = task_split_with_provenance(setup)
    return train, eval_tasks


def task_split_with_provenance(setup: EnvSetup) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """:func:`task_split`, and what the results are made from: ``{"train": ..., "eval": ...}``,
    each the env's ``provenance()`` (data source, split, task count; see
    :mod:`bpo_envs.provenance`) plus ``tasks_used``, the tasks drawn from it."""
    order, train_prov = _shuffled_ids(env_factory(setup))
    train = order[: setup.train_tasks]
    if setup.eval_split == "train":
        eval_tasks, eval_prov = train[: setup.eval_tasks], train_prov
    elif setup.eval_split == "held-out":
        eval_tasks, eval_prov = order[setup.train_tasks :][: setup.eval_tasks], train_prov
        overlap = set(eval_tasks) & set(train)
        if overlap:
            raise ValueError(f"{setup.env_id}: evaluation tasks {sorted(overlap)[:5]} are also training tasks")
    else:
        # another shuffle: ALFWorld's ids are per split, and equal names would look like one game
        eval_order, eval_prov = _shuffled_ids(eval_env_factory(setup), seed=54321)
        eval_tasks = eval_order[: setup.eval_tasks]
    if not eval_tasks:
        raise ValueError(
            f"{setup.env_id}: no {setup.eval_split} evaluation task ({len(order)} training task(s), "
            f"{setup.train_tasks} used for training); lower train_tasks or choose another eval_split"
        )
    data = {
        "train": {**(train_prov or {"env": setup.env_id}), "tasks_used": len(train)},
        "eval": {**(eval_prov or {"env": setup.env_id}), "tasks_used": len(eval_tasks), "eval_split": setup.eval_split},
    }
    return train, eval_tasks, data


class _Episode:
    """A topology of one rollout from the root (an evaluation episode)."""

    root_branches = 1

    def wants_entropy(self, path: Any) -> bool:
        return False

    def fork_count(self, path: Any, entropy: float | None) -> int:
        return 1


def evaluate(policy: Any, pool: EnvPool, tasks: list[Any], episodes: int, seed: int) -> float:
    """Mean success of ``episodes`` sampled rollouts per eval task, on common random numbers.

    Episode ``j`` of task ``i`` resets with the same env seed and runs the policy's sampler from
    the same seed for every algorithm (the policy's own RNG state is put back afterwards), so
    two algorithms' successes differ by their policies, not by their luck.
    """
    if not tasks:
        raise ValueError("no evaluation tasks")
    state = policy.rng_state() if hasattr(policy, "rng_state") else None
    wins: list[float] = []
    try:
        for i, task in enumerate(tasks):
            for j in range(max(episodes, 1)):
                episode_seed = seed + 1000 * i + j
                policy.seed(episode_seed)
                result = RolloutEngine(pool, max_parallel_trees=1, seed=episode_seed).run(policy, _Episode(), [task])
                wins += [float(e.won) for t in result.trees for e in t.leaf_edges()]
    finally:
        if state is not None:
            policy.set_rng_state(state)
    return float(np.mean(wins)) if wins else 0.0


def run_dir(out: Path, env: str, algorithm: str, seed: int) -> Path:
    return out / "runs" / env / algorithm / f"seed{seed}"


def _initial_weights(initial: Any) -> InitialWeights | None:
    """The initial weights of an LLM policy, saved on its first run (then restored in place per
    run instead of deep-copying the model, or a vLLM engine); None for small policies."""
    if not reusable(initial):
        return None
    saved = getattr(initial, "_initial_weights", None)
    if saved is None:
        saved = InitialWeights(initial)
        initial._initial_weights = saved
    return saved


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
    separate_eval = setup.eval_split not in ("held-out", "train")
    config = trainer_config(
        preset, env_name, seed, len(train_tasks), out_dir=folder, progress=progress,
        wandb_name=f"{env_name}/{algorithm_name}/seed{seed}",
        wandb_config={"preset": preset_dict(preset), "env": env_name, "seed": seed},
    )
    budget = config.budget
    policy = fresh_copy(initial, _initial_weights(initial))
    start = time.perf_counter()
    try:
        # gradient variance at the initial policy, the same measurement for every algorithm
        # the probe is the estimator that trains: same settings, and its adaptive state (BPO's
        # threshold, the budget's tree-cost estimate) warmed by one batch that is discarded
        probe = build_algorithm(algorithm_name, preset, seed + 1000)
        probe.collect(policy, pool, train_tasks, budget)
        grads = variance_summary(gradient_samples(probe, policy, pool, train_tasks, preset.for_env("grad_batches", env_name), budget))
        algorithm = build_algorithm(algorithm_name, preset, seed)
        history = Trainer(algorithm, policy, pool, train_tasks, config).train()
        if separate_eval:  # another split: its own envs (task ids are per split)
            pool.close()
            pool = EnvPool([eval_env_factory(setup)] * preset.pool_size, workers=setup.workers)
        final_success = evaluate(policy, pool, eval_tasks, preset.for_env("eval_episodes", env_name), seed + 2000)
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
