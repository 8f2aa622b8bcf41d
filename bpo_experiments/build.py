"""A run's parts, built from the preset: policy and warm start, algorithm, budget, trainer config.

The initial policy (with its behaviour-cloning warm start), the algorithm with its options, its
per-update budget and the trainer's config of one run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from bpo_algos.algorithm import Algorithm, AlgorithmConfig, Options
from bpo_algos.compute import Budget
from bpo_algos.policy import TabularPolicy
from bpo_algos.registry import (
    AlgorithmFactory,
    algorithm_factory,
    make_algorithm,
    registered_algorithms,
)
from bpo_algos.trainer import TrainerConfig
from bpo_experiments.presets import EnvSetup, Preset
from bpo_experiments.streams import (
    TRAINING,
    WARM_START,
    stream_seed,
)
from bpo_experiments.tasks import env_factory

SCORER_POLICIES: dict[str, tuple[str | None, int, int]] = {
    "scorer": (None, 32, 64),
    "scorer-memory": ("alfworld", 32, 64),
    "scorer-memory-wide": ("alfworld", 64, 256),
}
"""The text-scorer policies by name: ``(memory, dim, hidden)`` of
:class:`~bpo_algos.policy.scorer.TextScorerPolicy` (``-wide``: twice the embedding, four times the
hidden layer; docs/alfworld.md, "The learning curve")."""


@dataclass(frozen=True)
class PolicySettings:
    """What the initial policy of an env is made with (:func:`make_policy`), resolved from the
    preset and the env's own fields (:func:`policy_settings`)."""

    policy: str
    """The policy's name (:func:`make_policy`)."""
    temperature: float
    sft_epochs: int
    sft_lr: float
    max_new_tokens: int
    reasoning: bool
    decision_entropy: str
    probe_samples: int
    reference_offload: bool
    lora: bool
    vllm: bool
    precision: str
    eval_temperature: float | None
    max_model_len: int | None


def policy_settings(preset: Preset, setup: EnvSetup) -> PolicySettings:
    """The :class:`PolicySettings` of ``setup``'s env in ``preset`` (the env's ``policy``,
    ``sft_epochs`` and ``sft_lr`` over the preset's; the per-env fields' values for it)."""
    env_name = _env_name(preset, setup)
    return PolicySettings(
        policy=setup.policy or preset.policy,
        temperature=preset.temperature,
        sft_epochs=preset.sft_epochs if setup.sft_epochs is None else setup.sft_epochs,
        sft_lr=preset.sft_lr if setup.sft_lr is None else setup.sft_lr,
        max_new_tokens=setup.max_new_tokens,
        reasoning=preset.reasoning,
        decision_entropy=preset.decision_entropy,
        probe_samples=preset.probe_samples,
        reference_offload=preset.reference_offload,
        lora=preset.lora,
        vllm=preset.vllm,
        precision=preset.trainer.precision,
        eval_temperature=preset.for_env("eval_temperature", env_name),
        max_model_len=preset.for_env("max_model_len", env_name),
    )


def make_policy(preset: Preset, setup: EnvSetup, seed: int, tasks: list[Any]) -> Any:
    """The initial policy of one (env, seed), made with :func:`policy_settings`: the same object
    state for every algorithm.

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
    s = policy_settings(preset, setup)
    if s.policy in SCORER_POLICIES:
        from bpo_algos.policy.scorer import TextScorerPolicy

        memory, dim, hidden = SCORER_POLICIES[s.policy]
        policy = TextScorerPolicy(temperature=s.temperature, seed=seed, memory=memory, dim=dim, hidden=hidden)
        return warm_start(policy, s, setup, tasks, seed)
    if s.policy == "tabular":
        return TabularPolicy(temperature=s.temperature, seed=seed)
    if s.policy == "tabular-prior":
        env = env_factory(setup)()
        prior = env.unwrapped.agent_prior()
        env.close()
        return TabularPolicy.from_logits(prior, temperature=s.temperature, seed=seed)
    from bpo_algos.policy import HFPolicy

    model = s.policy
    if model == "tiny":
        from bpo_algos.policy.tiny import tiny_model_path

        model = str(tiny_model_path())
    elif model == "smollm2":
        from bpo_algos.policy.tiny import smollm2_path

        model = str(smollm2_path())
    torch.manual_seed(seed)
    from bpo_algos.policy import PromptConfig

    options: dict[str, Any] = {
        "max_new_tokens": s.max_new_tokens,
        "prompt": PromptConfig(reasoning=s.reasoning),
        "decision_entropy": s.decision_entropy,
        "probe_samples": s.probe_samples,
        "reference_offload": s.reference_offload and not s.lora,
        "eval_temperature": s.eval_temperature,
    }
    if s.precision == "bf16":
        options["dtype"] = torch.bfloat16  # the frozen base; trainable weights are kept in fp32
        options["reference_dtype"] = torch.bfloat16
    if s.vllm:
        from bpo_algos.policy import VLLMPolicy

        policy = VLLMPolicy(model, temperature=s.temperature, lora=s.lora, seed=seed, max_model_len=s.max_model_len or 4096, **options)
    else:
        policy = HFPolicy(model, temperature=s.temperature, lora=s.lora, seed=seed, max_model_len=s.max_model_len, **options)
    return warm_start(policy, s, setup, tasks, seed)


def _env_name(preset: Preset, setup: EnvSetup) -> str:
    """The preset's name of ``setup``'s env (its key in ``preset.envs``)."""
    for name, candidate in preset.envs.items():
        if candidate is setup:
            return name
    return next((name for name, candidate in preset.envs.items() if candidate == setup), setup.env_id)


def warm_start(policy: Any, settings: PolicySettings, setup: EnvSetup, tasks: list[Any], seed: int) -> Any:
    """Behaviour cloning on the env expert's trajectories of ``tasks`` (``sft_epochs``)."""
    if settings.sft_epochs:
        from bpo_algos.policy.sft import behaviour_cloning

        demos = _expert_demos(setup, tasks, seed)
        behaviour_cloning(policy, demos, epochs=settings.sft_epochs, lr=settings.sft_lr, seed=seed)
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


def option_kinds(names: Any, preset: Preset | None = None) -> dict[str, str | None]:
    """``{registered name: the kind of algorithm whose options it takes}`` (``bpo-anchored``:
    ``bpo``; the controls ``frozen`` and ``rloo-2x``: the algorithm they wrap, ``rloo``; None for
    a factory that takes the shared options only), as each factory declares
    (:class:`~bpo_algos.registry.AlgorithmFactory`)."""
    kinds: dict[str, str | None] = {}
    for name in names:
        factory = algorithm_factory(name)
        inner = factory.wraps(_own_options(factory, preset) or factory.Options())
        kinds[name] = algorithm_factory(inner).kind if inner is not None else factory.kind
    return kinds


def _own_options(factory: AlgorithmFactory, preset: Preset | None, env: str | None = None) -> Options | None:
    """The options of ``factory``'s kind that ``preset`` gives (``env``'s own,
    ``EnvSetup.options``, in place of the preset's); None: the kind's defaults."""
    if factory.kind is None or preset is None:
        return None
    per_env = preset.envs[env].options if env is not None and env in preset.envs else {}
    own = per_env.get(factory.kind) or preset.options.get(factory.kind)
    if own is not None and not isinstance(own, factory.Options):
        where = f"envs[{env!r}].options" if factory.kind in per_env else "options"
        raise TypeError(f"preset.{where}[{factory.kind!r}] must be a {factory.Options.__name__}, got {type(own).__name__}")
    return own


def _kind_options(factory: AlgorithmFactory, preset: Preset, env: str | None) -> dict[str, Any]:
    """:func:`_own_options` as keywords, but those ``factory`` fixes."""
    own = _own_options(factory, preset, env)
    return {} if own is None else {k: v for k, v in own.to_dict().items() if k not in factory.fixed}


def algorithm_options(name: str, preset: Preset, seed: int, env: str | None = None) -> dict[str, Any]:
    """The options the main job builds algorithm ``name`` with.

    The seed, ``aggregation`` and ``max_parallel_trees`` (:meth:`Preset.max_parallel_trees`)
    and every other shared option the preset changes (:attr:`Preset.shared`); then the options of
    the kind the factory declares (:class:`~bpo_algos.registry.AlgorithmFactory`:
    ``preset.options[kind]``, all but those its variant fixes, e.g. ``bpo-anchored``'s
    ``baseline``; ``env``'s own, ``EnvSetup.options``, in place of the preset's). A control that
    wraps another algorithm (``frozen``) takes that algorithm's, and ``of``, its name.
    """
    defaults = AlgorithmConfig().to_dict()
    shared = preset.shared.to_dict()
    options: dict[str, Any] = {"seed": seed, "aggregation": shared["aggregation"], "max_parallel_trees": preset.max_parallel_trees()}
    options.update({k: v for k, v in shared.items() if v != defaults[k] and k not in options})
    factory = algorithm_factory(name)
    inner = factory.wraps(_own_options(factory, preset, env) or factory.Options())
    if inner is not None:
        options.update(_kind_options(algorithm_factory(inner), preset, env))
        options["of"] = inner
    else:
        options.update(_kind_options(factory, preset, env))
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


def option_classes() -> dict[str, type[Options]]:
    """``{algorithm kind: its Options dataclass}`` over the registered algorithms that declare
    options of their own (:class:`~bpo_algos.registry.AlgorithmFactory`)."""
    found: dict[str, type[Options]] = {}
    for name in registered_algorithms():
        factory = algorithm_factory(name)
        if factory.kind is not None and factory.Options.field_names():
            found.setdefault(factory.kind, factory.Options)
    return found
