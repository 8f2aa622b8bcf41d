"""The jobs of the main job: one initial policy per (env, seed), one run per (env, algorithm, seed).

An *initial job* builds the (env, seed)'s initial policy (warm-started by behaviour cloning on
the env's expert trajectories where the preset says so), evaluates it (the warm start: update 0
of every algorithm's evaluated curve, the same for all of them) and, when gradient probes are
on, collects the pool of RLOO batches whose mean is the reference gradient at the warm start.
A *run* copies that policy, trains one algorithm with :class:`~bpo_algos.Trainer` under the
preset's optimizer, task sequence and per-update budget, evaluates the policy every
``eval_every`` updates on the fixed evaluation tasks with common random numbers, probes its
gradient's signal-to-noise ratio at the warm start and at mid-training, and caches its result
in ``run.json`` (evaluations and probes along the way in ``evals.json`` / ``probes.json``, the
trainer's state in its checkpoint) so an interrupted comparison resumes.

Each job is a function of its arguments only (its seeds, the initial policy's bytes, the
tasks), so the jobs run in any order, in this process, in worker processes (``--jobs``) or on a
Ray cluster (``--ray``) with the same results (:mod:`bpo_experiments.parallel`).
"""

from __future__ import annotations

import io
import itertools
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import bpo_envs  # noqa: F401 - registers the ids
from bpo_algos import data_parallel as dp
from bpo_algos.algorithm import Algorithm, AlgorithmConfig
from bpo_algos.compute import Budget
from bpo_algos.diagnostics import gradient_samples, signal_to_noise, variance_summary
from bpo_algos.mechanism import measure as measure_mechanism
from bpo_algos.policy import TabularPolicy
from bpo_algos.policy.base import evaluation_sampling
from bpo_algos.policy.weights import InitialWeights, fresh_copy, reusable
from bpo_algos.registry import algorithm_factory, make_algorithm
from bpo_algos.rollout import EnvPool, RolloutEngine, Topology
from bpo_algos.run_log import code_version
from bpo_algos.trainer import Trainer, TrainerConfig
from bpo_envs.files import read_json_or_redo, write_json
from bpo_experiments.presets import EnvSetup, Preset, preset_dict
from bpo_experiments.streams import (
    ALGORITHM,
    BOOTSTRAP,
    EVALUATION,
    MECHANISM,
    PROBE,
    PROBE_POINTS,
    REFERENCE,
    TRAINING,
    WARM_START,
    stream_seed,
)

SCORER_POLICIES: dict[str, tuple[str | None, int, int]] = {
    "scorer": (None, 32, 64),
    "scorer-memory": ("alfworld", 32, 64),
    "scorer-memory-wide": ("alfworld", 64, 256),
}
"""The text-scorer policies by name: ``(memory, dim, hidden)`` of
:class:`~bpo_algos.policy.scorer.TextScorerPolicy` (``-wide``: twice the embedding, four times the
hidden layer; docs/alfworld.md, "The learning curve")."""


def make_policy(preset: Preset, setup: EnvSetup, seed: int, tasks: list[Any]) -> Any:
    """The initial policy of one (env, seed): the same object state for every algorithm.

    ``scorer`` is the small :class:`~bpo_algos.policy.scorer.TextScorerPolicy` (``scorer-memory``:
    with its ALFWorld episode-memory features, ``memory="alfworld"``; ``scorer-memory-wide``: the
    same, larger; :data:`SCORER_POLICIES`); ``tabular``
    starts uniform; ``tabular-prior`` starts from the env's ``agent_prior()``
    (TreeMDP: confident on routine decisions, uniform on decisive ones, as an SFT-warmed agent
    is); anything else is an LLM (``tiny``, ``smollm2``, a model name or folder). Its
    randomness (initialisation, demos, cloning) is the seed's warm-start stream
    (:mod:`bpo_experiments.streams`).
    """
    seed = stream_seed(seed, WARM_START)
    name = setup.policy or preset.policy
    if name in SCORER_POLICIES:
        from bpo_algos.policy.scorer import TextScorerPolicy

        memory, dim, hidden = SCORER_POLICIES[name]
        policy = TextScorerPolicy(temperature=preset.temperature, seed=seed, memory=memory, dim=dim, hidden=hidden)
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
    from bpo_algos.policy import PromptConfig

    env_name = _env_name(preset, setup)
    options: dict[str, Any] = {
        "max_new_tokens": setup.max_new_tokens,
        "prompt": PromptConfig(reasoning=preset.reasoning),
        "decision_entropy": preset.decision_entropy,
        "probe_samples": preset.probe_samples,
        "reference_offload": preset.reference_offload and not preset.lora,
        "eval_temperature": preset.for_env("eval_temperature", env_name),
    }
    if preset.trainer.precision == "bf16":
        options["dtype"] = torch.bfloat16  # the frozen base; trainable weights are kept in fp32
        options["reference_dtype"] = torch.bfloat16
    max_model_len = preset.for_env("max_model_len", env_name)
    if preset.vllm:
        from bpo_algos.policy import VLLMPolicy

        policy = VLLMPolicy(model, temperature=preset.temperature, lora=preset.lora, seed=seed, max_model_len=max_model_len or 4096, **options)
    else:
        policy = HFPolicy(model, temperature=preset.temperature, lora=preset.lora, seed=seed, max_model_len=max_model_len, **options)
    return warm_start(policy, preset, setup, tasks, seed)


def _env_name(preset: Preset, setup: EnvSetup) -> str:
    """The preset's name of ``setup``'s env (its key in ``preset.envs``)."""
    for name, candidate in preset.envs.items():
        if candidate is setup:
            return name
    return next((name for name, candidate in preset.envs.items() if candidate == setup), setup.env_id)


def warm_start(policy: Any, preset: Preset, setup: EnvSetup, tasks: list[Any], seed: int) -> Any:
    """Behaviour cloning on the env expert's trajectories of ``tasks`` (``sft_epochs``)."""
    epochs = preset.sft_epochs if setup.sft_epochs is None else setup.sft_epochs
    if epochs:
        from bpo_algos.policy.sft import behaviour_cloning

        demos = _expert_demos(setup, tasks, seed)
        lr = preset.sft_lr if setup.sft_lr is None else setup.sft_lr
        behaviour_cloning(policy, demos, epochs=epochs, lr=lr, seed=seed)
    return policy


_DEMOS: dict[str, Any] = {}


def _expert_demos(setup: EnvSetup, tasks: list[Any], seed: int) -> Any:
    """The expert's demos of ``tasks``, kept per process: an expert whose episodes do not
    depend on the reset seed (ALFWorld's: a task id fixes the game) gives every seed the same
    demos, so they are collected once."""
    from bpo_algos.policy.sft import expert_demos

    seedless = setup.env_id == "BPO-ALFWorld-v0"
    key = repr((setup.env_id, sorted(setup.kwargs.items()), tasks, None if seedless else seed))
    if key not in _DEMOS:
        _DEMOS.clear()  # one env's demos at a time
        _DEMOS[key] = expert_demos(env_factory(setup), tasks, seed=seed)
    return _DEMOS[key]


def algorithm_class(factory: Any) -> type[Algorithm] | None:
    """The :class:`~bpo_algos.algorithm.Algorithm` subclass a factory builds: the factory
    itself, or the class a ``functools.partial`` wraps (None for any other callable)."""
    while isinstance(factory, partial):
        factory = factory.func
    return factory if isinstance(factory, type) and issubclass(factory, Algorithm) else None


def option_kinds(names: Any, preset: Preset | None = None) -> dict[str, str | None]:
    """``{registered name: the kind of algorithm whose options it takes}`` (``bpo-anchored``:
    ``bpo``; the controls ``frozen`` and ``rloo-2x``: the algorithm they collect as, ``rloo``;
    None for a factory that is no Algorithm subclass)."""
    kinds: dict[str, str | None] = {}
    for name in names:
        factory = algorithm_factory(name)
        options_of = getattr(factory, "options_of", None)  # a wrapper: the wrapped algorithm's options
        if callable(options_of):
            factory = algorithm_factory(options_of((preset.algorithm_options if preset else {}).get(name, {})))
        cls = algorithm_class(factory)
        kinds[name] = cls.name if cls is not None else None
    return kinds


def algorithm_options(name: str, preset: Preset, seed: int, env: str | None = None) -> dict[str, Any]:
    """The options the main job builds algorithm ``name`` with.

    The seed, ``aggregation`` and ``max_parallel_trees`` (default: a quarter of the env pool)
    and every other shared option the preset changes (:attr:`Preset.shared`); for a built-in
    kind of algorithm its own options (``preset.options[cls.name]``, all but those its variant
    fixes, e.g. ``bpo-anchored``'s ``baseline``; a control that collects as another algorithm,
    such as ``frozen``, takes that algorithm's; ``env``'s own, ``EnvSetup.options``, in place of
    the preset's); then ``preset.algorithm_options[name]``.
    """
    defaults = AlgorithmConfig().to_dict()
    shared = preset.shared.to_dict()
    options: dict[str, Any] = {"seed": seed, "aggregation": shared["aggregation"],
                               "max_parallel_trees": shared["max_parallel_trees"] or max(1, preset.pool_size // 4)}
    options.update({k: v for k, v in shared.items() if v != defaults[k] and k not in options})
    factory = algorithm_factory(name)
    explicit = preset.algorithm_options.get(name, {})
    options_of = getattr(factory, "options_of", None)
    if callable(options_of):  # a wrapper (the frozen control): the wrapped algorithm's options
        factory = algorithm_factory(options_of(explicit))
    cls = algorithm_class(factory)
    per_env = preset.envs[env].options if env is not None and env in preset.envs else {}
    own = (per_env.get(cls.name) or preset.options.get(cls.name)) if cls is not None else None
    if own is not None:
        if not isinstance(own, cls.Options):
            where = f"envs[{env!r}].options" if cls.name in per_env else "options"
            raise TypeError(f"preset.{where}[{cls.name!r}] must be a {cls.Options.__name__}, got {type(own).__name__}")
        fixed = factory.keywords if isinstance(factory, partial) else {}
        options.update({k: v for k, v in own.to_dict().items() if k not in fixed})
    options.update(explicit)
    return options


def build_algorithm(name: str, preset: Preset, seed: int, env: str | None = None) -> Algorithm:
    """Algorithm ``name`` from the registry, with :func:`algorithm_options` (for ``env``); ``seed``
    is the algorithm's own stream (the caller's key, :mod:`bpo_experiments.streams`)."""
    return make_algorithm(name, **algorithm_options(name, preset, seed, env))


def run_budget(preset: Preset, env_name: str, algorithm: Algorithm) -> Budget:
    """The per-update budget of ``algorithm`` on ``env_name``: the env's budget times the
    algorithm's :attr:`~bpo_algos.algorithm.Algorithm.budget_multiple` (2 for the calibration
    control ``rloo-2x``, 1 for every other)."""
    return Budget(preset.budget_unit, preset.budget[env_name] * algorithm.budget_multiple)


def trainer_config(preset: Preset, env_name: str, seed: int, tasks_per_update: int, budget: Budget | None = None,
                   **run: Any) -> TrainerConfig:
    """The :class:`TrainerConfig` of one run: the env's training settings
    (:meth:`Preset.trainer_for`) with the run's own fields (:data:`RUN_FIELDS`: its tasks, the
    budget (default: the env's), the seed's training stream, ``run`` such as ``out_dir``), the
    last batch's trees saved."""
    config = preset.trainer_for(env_name)
    fields = {
        "tasks_per_update": tasks_per_update,
        "budget": budget if budget is not None else Budget(preset.budget_unit, preset.budget[env_name]),
        "seed": stream_seed(seed, TRAINING),
        "save_trees_every": config.updates,  # the last batch's trees, for the report
        **run,
    }
    return replace(config, **fields)


def env_factory(setup: EnvSetup) -> Callable[[], gym.Env]:
    if setup.servers:  # sessions of bpo-serve servers, round robin
        turn = itertools.count()
        return lambda: gym.make("BPO-Remote-v0", base_url=setup.servers[next(turn) % len(setup.servers)])
    return lambda: gym.make(setup.env_id, **setup.kwargs)


def eval_env_factory(setup: EnvSetup) -> Callable[[], gym.Env]:
    """The envs the final policy is evaluated on: the training envs for ``"held-out"`` and
    ``"train"``, else envs made with ``split=setup.eval_split`` (a split of the env itself)."""
    if setup.eval_split in ("held-out", "train"):
        return env_factory(setup)
    if setup.servers:
        raise ValueError(f"{setup.env_id}: eval_split={setup.eval_split!r} makes other envs than the served ones; "
                         "use 'held-out' or 'train' with --env-server")
    kwargs = {**setup.kwargs, **setup.eval_kwargs}
    if setup.eval_split != "rows":
        kwargs["split"] = setup.eval_split
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


def task_order(setup: EnvSetup) -> list[Any]:
    """The training env's tasks in the fixed shuffle the training tasks are the first of (the
    tuning criterion's held-out training tasks come after them)."""
    return _shuffled_ids(env_factory(setup))[0]


def task_split(setup: EnvSetup) -> tuple[list[Any], list[Any]]:
    """Deterministic train and eval tasks (the same for every algorithm and seed).

    Train tasks: the first ``train_tasks`` of a fixed shuffle of the training env's tasks. Eval
    tasks: ``"held-out"``: the next ``eval_tasks`` of that shuffle; ``"train"``: the first
    ``eval_tasks`` train tasks; a split name: the first ``eval_tasks`` of a fixed shuffle of that
    split's tasks (disjoint from training when the env's splits are).
    """
    train, eval_tasks, _ = task_split_with_provenance(setup)
    return train, eval_tasks


def extra_eval_tasks(setup: EnvSetup) -> dict[str, list[Any]]:
    """The tasks of each further evaluation split (:attr:`EnvSetup.extra_eval`): the first ``n``
    of a fixed shuffle of that split (an error when it has fewer)."""
    out: dict[str, list[Any]] = {}
    for split, n in setup.extra_eval.items():
        kwargs = {**setup.kwargs, **setup.eval_kwargs, "split": split}
        order, _ = _shuffled_ids(lambda kwargs=kwargs: gym.make(setup.env_id, **kwargs), seed=54321)
        if len(order) < n:
            raise ValueError(f"{setup.env_id}: {n} {split} evaluation tasks asked, but that split has {len(order)}; lower extra_eval")
        out[split] = order[:n]
    return out


def evaluate_extra(policy: Any, preset: Preset, setup: EnvSetup, env_name: str, seed: int) -> dict[str, Any]:
    """``policy`` on every further evaluation split (:attr:`EnvSetup.extra_eval`), split ``k``
    (from 1) on its own evaluation streams: ``{split: {"success", "episodes", "wins"}}``."""
    out: dict[str, Any] = {}
    episodes = preset.for_env("eval_episodes", env_name)
    for k, (split, tasks) in enumerate(extra_eval_tasks(setup).items(), start=1):
        kwargs = {**setup.kwargs, **setup.eval_kwargs, "split": split}
        pool = EnvPool([lambda kwargs=kwargs: gym.make(setup.env_id, **kwargs)] * preset.pool_size, workers=setup.workers)
        try:
            wins = evaluate_episodes(policy, pool, tasks, episodes, seed, split=k)
        finally:
            pool.close()
        out[split] = {"success": float(np.mean(wins)), "episodes": len(wins), "wins": wins}
    return out


def task_split_with_provenance(setup: EnvSetup) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """:func:`task_split`, and what the results are made from: ``{"train": ..., "eval": ...}``,
    each the env's ``provenance()`` (data source, split, task count; see
    :mod:`bpo_envs.provenance`) plus ``tasks_used``, the tasks drawn from it."""
    order, train_prov = _shuffled_ids(env_factory(setup))
    if len(order) < setup.train_tasks:
        raise ValueError(
            f"{setup.env_id}: {setup.train_tasks} training tasks asked, but the training env has {len(order)} "
            f"({(train_prov or {}).get('data_source', 'its data')}); lower train_tasks or give it more tasks"
        )
    train = order[: setup.train_tasks]
    if setup.eval_split == "train":
        eval_tasks, eval_prov = train[: setup.eval_tasks], train_prov
    elif setup.eval_split == "held-out":
        eval_tasks, eval_prov = order[setup.train_tasks :][: setup.eval_tasks], train_prov
        overlap = set(eval_tasks) & set(train)
        if overlap:
            raise ValueError(f"{setup.env_id}: evaluation tasks {sorted(overlap)[:5]} are also training tasks")
    elif setup.eval_split == "rows":
        # every evaluation row in its source's order (the gpu preset: all of Verified's given)
        make = eval_env_factory(setup)
        env = make()
        try:
            eval_order = list(env.unwrapped.task_ids())
            provenance = getattr(env.unwrapped, "provenance", None)
            eval_prov = provenance() if callable(provenance) else None
        finally:
            env.close()
        eval_tasks = eval_order[: setup.eval_tasks]
        overlap = sorted(set(map(str, eval_order)) & set(map(str, order)))
        if overlap:
            raise ValueError(f"{setup.env_id}: {len(overlap)} evaluation task(s) are also training tasks: {overlap[:10]}")
    else:
        # another shuffle: ALFWorld's ids are per split, and equal names would look like one game
        eval_order, eval_prov = _shuffled_ids(eval_env_factory(setup), seed=54321)
        if len(eval_order) < setup.eval_tasks:
            raise ValueError(
                f"{setup.env_id}: {setup.eval_tasks} {setup.eval_split} evaluation tasks asked, but that split has "
                f"{len(eval_order)}; lower eval_tasks"
            )
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


def evaluate(policy: Any, pool: EnvPool, tasks: list[Any], episodes: int, seed: int, split: int = 0) -> float:
    """See :func:`evaluate_episodes`: the mean success."""
    wins = evaluate_episodes(policy, pool, tasks, episodes, seed, split)
    return float(np.mean(wins)) if wins else 0.0


def evaluate_episodes(policy: Any, pool: EnvPool, tasks: list[Any], episodes: int, seed: int, split: int = 0) -> list[float]:
    """Mean success of ``episodes`` sampled rollouts per eval task, on common random numbers.

    Episode ``j`` of task ``i`` resets with the env seed of the stream ``(seed, EVALUATION, i,
    j)`` (``split`` > 0: a further evaluation split's own streams, ``(seed, EVALUATION, i, j,
    split)``) and runs the policy's sampler from it, for every algorithm and at every evaluation point
    (the policy's own RNG state is put back afterwards), so two policies' successes differ by the
    policies, not by their luck; another ``seed`` shares no episode. Returns each episode's
    success (0 or 1), task by task.
    """
    if not tasks:
        raise ValueError("no evaluation tasks")
    state = policy.rng_state()
    per_task: dict[int, list[float]] = {}
    try:
        with evaluation_sampling(policy):  # the preset's evaluation temperature (0: greedy)
            # under torchrun each rank plays every world-size-th task (an episode depends only on
            # its seeds, so which rank plays it changes nothing), then the ranks share them
            for i in dp.shard_indices(len(tasks)):
                per_task[i] = []
                for j in range(max(episodes, 1)):
                    episode_seed = stream_seed(seed, EVALUATION, i, j, split)
                    policy.seed(episode_seed)
                    result = RolloutEngine(pool, max_parallel_trees=1, seed=episode_seed).run(policy, Topology(), [tasks[i]])  # one rollout from the root
                    per_task[i] += [float(e.won) for t in result.trees for e in t.leaf_edges()]
    finally:
        policy.set_rng_state(state)
    if dp.is_distributed():
        for part in dp.all_gather_objects(per_task):
            per_task.update(part)
    missing = [tasks[i] for i in sorted(per_task) if not per_task[i]]
    if missing:
        raise ValueError(f"evaluation tasks {missing[:5]} gave no episode (not tasks of the evaluation env?)")
    return [w for i in range(len(tasks)) for w in per_task[i]]


def run_dir(out: Path, env: str, algorithm: str, seed: int) -> Path:
    return out / "runs" / env / algorithm / f"seed{seed}"


def initial_dir(out: Path, env: str, seed: int) -> Path:
    """Where the (env, seed)'s initial job keeps its result (``initial.json``, ``policy.pt``)."""
    return out / "runs" / env / "_initial" / f"seed{seed}"


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


def eval_points(preset: Preset, env_name: str) -> list[int]:
    """The updates after which a run's policy is evaluated: 0 (the warm start), every
    ``eval_every``, and the last."""
    updates = preset.trainer_for(env_name).updates
    every = preset.for_env("eval_every", env_name) or updates
    return sorted({0, *range(every, updates + 1, every), updates})


def probe_points(preset: Preset, env_name: str) -> dict[str, int]:
    """Where a run probes its gradient: ``{"initial": 0, "mid": updates // 2}``."""
    return {"initial": 0, "mid": preset.trainer_for(env_name).updates // 2}


def probes_on(preset: Preset, env_name: str, seed: int) -> bool:
    """Whether the (env, seed)'s runs probe their gradients: the first ``grad_seeds`` seeds
    (all when None), and only with at least 2 batches."""
    if preset.for_env("grad_batches", env_name) < 2:
        return False
    seeds = list(preset.for_env("seeds", env_name))
    count = preset.for_env("grad_seeds", env_name)
    return seed in (seeds if count is None else seeds[:count])


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


class _RNGGuard:
    """Puts the policy's sampling RNG and torch's global RNG back after a measurement."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def __enter__(self) -> None:
        self.policy_state = self.policy.rng_state()
        self.torch_state = torch.get_rng_state()

    def __exit__(self, *exc: Any) -> None:
        self.policy.set_rng_state(self.policy_state)
        torch.set_rng_state(self.torch_state)


def _gradient_rows(name: str, preset: Preset, env: str, seed: int, policy: Any, pool: EnvPool, tasks: list[Any], budget: Budget, n: int) -> Any:
    """``n`` gradient samples of algorithm ``name`` at ``policy`` (kept: the bootstrap needs
    their Gram matrix). The probe is the estimator that trains: same settings, its adaptive
    state (BPO's threshold, the budget's tree-cost estimate) warmed by one discarded batch."""
    probe = build_algorithm(name, preset, seed, env)
    with _RNGGuard(policy):
        policy.seed(seed)
        probe.collect(policy, pool, tasks, budget)
        samples = gradient_samples(probe, policy, pool, tasks, n, budget, keep_grads=True)
    return samples


REFERENCE_ALGORITHM = "rloo"
"""The unbiased estimator whose large pool of batches gives the reference gradient."""


def reference_gradient(preset: Preset, env_name: str, seed: int, policy: Any, pool: EnvPool, tasks: list[Any], budget: Budget,
                       point: str = "initial") -> tuple[torch.Tensor, float]:
    """``(mean, signal)`` of ``reference_batches`` RLOO batches at ``policy`` (the seed's
    reference stream at probe ``point``): the reference the cosine of
    :func:`~bpo_algos.diagnostics.signal_to_noise` is taken against."""
    n = preset.for_env("reference_batches", env_name)
    key = stream_seed(seed, REFERENCE, PROBE_POINTS[point])
    samples = _gradient_rows(REFERENCE_ALGORITHM, preset, env_name, key, policy, pool, tasks, budget, n)
    rows = samples.grads.double()
    moments = signal_to_noise(rows, resamples=1)
    return rows.mean(dim=0).float(), float(moments["signal"])


def initial_job(preset: Preset, env_name: str, seed: int, train_tasks: list[Any], eval_tasks: list[Any]) -> dict[str, Any]:
    """The (env, seed)'s initial policy, its evaluation (the warm start) and, when probes are on,
    the warm start's reference gradient. Returns ``{"warm": {...}, "policy": bytes | None,
    "reference": bytes | None}``."""
    if preset.torch_threads:
        torch.set_num_threads(preset.torch_threads)
    setup = preset.envs[env_name]
    start = time.perf_counter()
    policy = make_policy(preset, setup, seed, train_tasks)
    built = time.perf_counter() - start
    pool = EnvPool([eval_env_factory(setup)] * preset.pool_size, workers=setup.workers)
    try:
        wins = evaluate_episodes(policy, pool, eval_tasks, preset.for_env("eval_episodes", env_name), seed)
    finally:
        pool.close()
    warm = {"success": float(np.mean(wins)), "episodes": len(wins), "wins": wins, "seconds_build": built,
            "seconds_eval": time.perf_counter() - start - built, "code": code_version()}
    if setup.extra_eval:
        warm["extra"] = evaluate_extra(policy, preset, setup, env_name, seed)
    reference = None
    if probes_on(preset, env_name, seed):
        pool = EnvPool([env_factory(setup)] * preset.pool_size, workers=setup.workers)
        try:
            t0 = time.perf_counter()
            mean, signal = reference_gradient(preset, env_name, seed, policy, pool, train_tasks, Budget(preset.budget_unit, preset.budget[env_name]))
            warm["seconds_reference"] = time.perf_counter() - t0
        finally:
            pool.close()
        buffer = io.BytesIO()
        torch.save({"mean": mean, "signal": signal}, buffer)
        reference = buffer.getvalue()
    return {"warm": warm, "policy": _save_policy(policy), "reference": reference}


_POLICIES: dict[tuple[str, int], Any] = {}
"""LLM initial policies built in this process, by (env, seed) (their weights restored per run)."""


def initial_policy(preset: Preset, env_name: str, seed: int, train_tasks: list[Any], data: bytes | None) -> Any:
    """The initial policy of a run: loaded from the initial job's bytes, or (an LLM policy)
    built once per process and restored per run."""
    if data is not None:
        return _load_policy(data)
    key = (env_name, seed)
    if key not in _POLICIES:
        _POLICIES.clear()  # one LLM at a time
        _POLICIES[key] = make_policy(preset, preset.envs[env_name], seed, train_tasks)
    initial = _POLICIES[key]
    return fresh_copy(initial, _initial_weights(initial))


def _read_json(path: Path, default: Any) -> Any:
    return read_json_or_redo(path, default)


def _write_json(path: Path, value: Any) -> None:
    """Write ``value`` atomically; rank 0 only under torchrun (every rank holds the same value)."""
    if dp.rank() != 0:
        return
    write_json(path, value)


def _compute_point(total: Any) -> dict[str, float]:
    return {k: float(v) for k, v in total.to_dict().items()}


def base_algorithm(label: str) -> str:
    """The registered algorithm of a run label: ``bpo`` for ``bpo``, ``bpo@default`` (the
    untuned defaults beside a tuned comparison) and ``bpo@tune2`` (tuning candidate 2)."""
    return label.split("@", 1)[0]


def mechanism_points(preset: Preset, env_name: str) -> dict[str, int]:
    """Where a run measures the mechanism (:mod:`bpo_algos.mechanism`) on its own training batch:
    ``{"warm": 1, "mid": updates // 2 + 1}``, the batches collected by the warm-start policy and
    by the policy after ``updates // 2`` updates (the gradient probes' points)."""
    return {"warm": 1, "mid": preset.trainer_for(env_name).updates // 2 + 1}


def run_one(
    out: Path,
    preset: Preset,
    env_name: str,
    algorithm_name: str,
    seed: int,
    initial: bytes | None,
    warm: dict[str, Any],
    reference: bytes | None,
    train_tasks: list[Any],
    eval_tasks: list[Any],
    progress: bool = False,
) -> dict[str, Any]:
    """Train one algorithm from the initial policy and measure it; cached in ``run.json``.

    ``algorithm_name`` is the run's label (:func:`base_algorithm`): its folder and its results'
    ``"algorithm"``; the algorithm built is the registered one it names, with ``preset``'s options
    (the caller passes the tuned, default or candidate options in ``preset``)."""
    folder = run_dir(out, env_name, algorithm_name, seed)
    done = folder / "run.json"
    saved = _read_json(done, None)
    if saved is not None:
        return saved
    if preset.torch_threads:
        torch.set_num_threads(preset.torch_threads)
    folder.mkdir(parents=True, exist_ok=True)
    setup = preset.envs[env_name]
    name = base_algorithm(algorithm_name)
    pool = EnvPool([env_factory(setup)] * preset.pool_size, workers=setup.workers)
    separate_eval = setup.eval_split not in ("held-out", "train")
    eval_pool = EnvPool([eval_env_factory(setup)] * preset.pool_size, workers=setup.workers) if separate_eval else pool
    policy = initial_policy(preset, env_name, seed, train_tasks, initial)
    episodes = preset.for_env("eval_episodes", env_name)
    points = eval_points(preset, env_name)
    probing = probes_on(preset, env_name, seed) and name == algorithm_name  # not the tuning and default runs
    probe_at = probe_points(preset, env_name)
    mechanism_at = mechanism_points(preset, env_name)
    ref0 = torch.load(io.BytesIO(reference), weights_only=True) if reference is not None else None  # tensors only
    evals: list[dict[str, Any]] = _read_json(folder / "evals.json", [])
    probes: dict[str, Any] = _read_json(folder / "probes.json", {})
    mechanism: dict[str, Any] = _read_json(folder / "mechanism.json", {})
    timing = _read_json(folder / "timing.json", {"eval": 0.0, "probe": 0.0})
    algorithm = build_algorithm(name, preset, stream_seed(seed, ALGORITHM), env_name)
    budget = run_budget(preset, env_name, algorithm)
    biased = not algorithm.unbiased
    start = time.perf_counter()

    def measure(trainer: Trainer) -> None:
        u = trainer.update
        if u in points and all(e["update"] != u for e in evals):
            t0 = time.perf_counter()
            if u == 0:  # the initial job's evaluation of this very policy
                success = warm["success"]
            else:
                trainer.parallel.gather_weights()  # FSDP: ranks play different episodes, so no collective forwards
                try:
                    success = float(np.mean(evaluate_episodes(policy, eval_pool, eval_tasks, episodes, seed)))
                finally:
                    trainer.parallel.shard_weights()
            evals.append({"update": u, "success": success, "compute": _compute_point(trainer.total_compute)})
            _write_json(folder / "evals.json", evals)
            timing["eval"] += time.perf_counter() - t0
            _write_json(folder / "timing.json", timing)
        for point, at in mechanism_at.items():
            if u == at and point not in mechanism and trainer.last_batch is not None:
                found = measure_mechanism([trainer.last_batch], seed=stream_seed(seed, MECHANISM, at))
                mechanism[point] = {**found.to_json(), "update": u}
                _write_json(folder / "mechanism.json", mechanism)
        for point, at in probe_at.items():
            if not probing or u != at or point in probes:
                continue
            t0 = time.perf_counter()
            n = preset.for_env("grad_batches", env_name)
            key = PROBE_POINTS[point]
            samples = _gradient_rows(name, preset, env_name, stream_seed(seed, PROBE, key), policy, pool, train_tasks, budget, n)
            ref = None
            if point == "initial" and ref0 is not None:
                ref = (ref0["mean"], ref0["signal"])
            elif point != "initial" and biased:
                ref = reference_gradient(preset, env_name, seed, policy, pool, train_tasks, budget, point)
            result = signal_to_noise(samples, ref, seed=stream_seed(seed, BOOTSTRAP, key))
            result.update({k: v for k, v in variance_summary(samples).items() if k in ("grad_norm_var", "grad_norm_mean")})
            result["update"] = u
            probes[point] = result
            _write_json(folder / "probes.json", probes)
            timing["probe"] += time.perf_counter() - t0
            _write_json(folder / "timing.json", timing)

    try:
        config = trainer_config(
            preset, env_name, seed, len(train_tasks), budget, out_dir=folder, progress=progress,
            wandb_name=f"{env_name}/{algorithm_name}/seed{seed}",
            wandb_config={"preset": preset_dict(preset), "env": env_name, "seed": seed},
        )
        history = Trainer(algorithm, policy, pool, train_tasks, config).train(after_update=measure)
    finally:
        pool.close()
        if separate_eval:
            eval_pool.close()
    extra = None
    if setup.extra_eval:
        t0 = time.perf_counter()
        extra = _read_json(folder / "extra_eval.json", None)
        if extra is None:
            extra = evaluate_extra(policy, preset, setup, env_name, seed)
            _write_json(folder / "extra_eval.json", extra)
        timing["eval"] += time.perf_counter() - t0
    norms = np.array([row["grad_norm"] for row in history])
    evals.sort(key=lambda e: e["update"])
    result = {
        "env": env_name,
        "algorithm": algorithm_name,
        "seed": seed,
        "options": algorithm.config(),
        "budget_multiple": algorithm.budget_multiple,
        "final_success": evals[-1]["success"],
        "warm_success": warm["success"],
        "evals": evals,
        "extra_eval": None if extra is None else {
            split: {"warm": warm["extra"][split]["success"], "final": v["success"], "episodes": v["episodes"]} for split, v in extra.items()
        },
        "curve": [row["success"] for row in history],
        "returns": [row["return"] for row in history],
        "compute_per_update": {k: float(np.mean([row["compute"][k] for row in history])) for k in history[0]["compute"]},
        "compute_cumulative": [row["compute_total"][preset.budget_unit] for row in history],
        "compute_total": {k: float(v) for k, v in history[-1]["compute_total"].items()},
        "probes": probes,
        "mechanism": mechanism,
        "grad_norm_var_train": float(norms.var(ddof=1)) if len(norms) > 1 else 0.0,
        "seconds": time.perf_counter() - start,
        "seconds_eval": timing["eval"],
        "seconds_probe": timing["probe"],
        "code": code_version(),
    }
    _write_json(done, result)
    return result
