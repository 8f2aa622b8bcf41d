"""One resolved configuration: each env's settings and each run's, built once from the preset.

The preset (:class:`~bpo_experiments.presets.Preset`, after the configuration file, the flags and
the tuning's choice are applied to it by :mod:`bpo_experiments.config` and
:mod:`bpo_experiments.compare`) is read here and nowhere else of a comparison. It resolves into
typed, frozen objects, one per concern:

* :class:`AlgorithmSpec`: one algorithm as a run builds it, its options a typed
  :class:`~bpo_algos.algorithm.Options` instance until the factory is called;
* :class:`PolicySettings`: what an env's initial policy is made with;
* :class:`EvaluationSpec` and :class:`ProbeSpec`: how an env's runs are evaluated and probed;
* :class:`EnvConfig`: everything of one env (its setup, trainer, budget, seeds, initial policy,
  evaluation and probes), every setting at its value for that env;
* :class:`ComparisonConfig`: the comparison's own settings (the algorithms, the headline, the
  controls) and its envs' :class:`EnvConfig`;
* :class:`RunConfig`: one run (env, algorithm, seed): its env's config, its algorithm, its
  trainer's config.

The runner, the initial job, the statistics, the plan and the probes read these and never the
preset. A run's configuration is written beside its results, ``config.json`` in the run's folder
when the run starts and ``run.json``'s ``"config"`` when it ends, and a resumed comparison
refuses a run whose saved configuration differs from the one the flags resolve to now
(:func:`check_same_config`, docs/main-job.md).
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bpo_algos.algorithm import Algorithm, AlgorithmConfig, Options
from bpo_algos.compute import Budget
from bpo_algos.registry import (
    AlgorithmFactory,
    algorithm_factory,
    make_algorithm,
    registered_algorithms,
)
from bpo_algos.trainer_config import TrainerConfig
from bpo_envs.files import read_json_or_redo
from bpo_experiments.presets import EnvSetup, Preset, preset_dict, setup_data
from bpo_experiments.streams import ALGORITHM, TRAINING, stream_seed
from bpo_experiments.tuning import TuningConfig, candidate_options

CONFIG_FILE = "config.json"
"""A run's :class:`RunConfig` in its folder, written when the run starts."""

REFERENCE_ALGORITHM = "rloo"
"""The unbiased estimator whose large pool of batches gives the probes' reference gradient
(:func:`~bpo_experiments.probes.reference_gradient`)."""

LOGGING_FIELDS = ("tensorboard", "wandb_project", "wandb_group", "progress")
"""TrainerConfig fields that change where a run logs, not what it computes: a resumed run may
change them."""


# -- the preset: read here only ------------------------------------------------------------


def trainer_for(preset: Preset, env: str) -> TrainerConfig:
    """The training settings of ``env``: the preset's ``trainer`` with the env's own fields
    (:attr:`~bpo_experiments.presets.EnvSetup.trainer`)."""
    return replace(preset.trainer, **preset.envs[env].trainer)


def max_parallel_trees(preset: Preset) -> int:
    """The trees each run grows at once: ``shared.max_parallel_trees`` when the preset sets it,
    else a quarter of ``pool_size`` (at least 1), so that every tree in flight has envs to fork
    into."""
    return preset.shared.max_parallel_trees or max(1, preset.pool_size // 4)


# -- the algorithm ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AlgorithmSpec:
    """One registered algorithm as a run builds it: its options stay typed until the factory is
    called (:meth:`build`), which receives them as keyword arguments (:meth:`keywords`:
    ``bpo_algos.register_algorithm``'s contract)."""

    name: str
    """The registered algorithm (``bpo``, ``rloo-2x``, a user's)."""
    seed: int
    """The algorithm's own random stream (the caller's key, :mod:`bpo_experiments.streams`)."""
    shared: AlgorithmConfig
    """The options every algorithm shares (loss, clipping, KL, aggregation)."""
    max_parallel_trees: int
    """Trees in flight at once (:func:`max_parallel_trees`)."""
    options: Options | None = None
    """The options of the kind the algorithm takes options of (a control's: the algorithm it
    wraps, :attr:`of`); None: that kind's defaults, or a factory that takes the shared options only."""
    of: str | None = None
    """The algorithm a control wraps (``frozen``, ``rloo-2x``: ``rloo``), None for the others."""

    def __post_init__(self) -> None:
        if not isinstance(self.shared, AlgorithmConfig):
            raise TypeError(f"AlgorithmSpec.shared must be an AlgorithmConfig, got {type(self.shared).__name__}")
        if self.options is not None and not isinstance(self.options, Options):
            raise TypeError(f"AlgorithmSpec.options must be an algorithm option dataclass, got {type(self.options).__name__}")

    def keywords(self) -> dict[str, Any]:
        """The keyword arguments of the factory: the seed, ``aggregation``, ``max_parallel_trees``
        and every other shared option changed from its default; then the kind's options but those
        the factory fixes (``bpo-anchored``'s ``baseline``); a control's ``of``."""
        defaults = AlgorithmConfig().to_dict()
        shared = self.shared.to_dict()
        out: dict[str, Any] = {"seed": self.seed, "aggregation": shared["aggregation"], "max_parallel_trees": self.max_parallel_trees}
        out.update({k: v for k, v in shared.items() if v != defaults[k] and k not in out})
        if self.options is not None:
            fixed = algorithm_factory(self.of if self.of is not None else self.name).fixed
            out.update({k: v for k, v in self.options.to_dict().items() if k not in fixed})
        if self.of is not None:
            out["of"] = self.of
        return out

    def build(self, seed: int | None = None) -> Algorithm:
        """The algorithm (``seed``: another stream, e.g. a probe's, in place of :attr:`seed`)."""
        return make_algorithm(self.name, **{**self.keywords(), **({} if seed is None else {"seed": seed})})


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


def algorithm_spec(name: str, preset: Preset, seed: int, env: str | None = None) -> AlgorithmSpec:
    """The :class:`AlgorithmSpec` of algorithm ``name`` in ``preset`` (on ``env``): the shared
    options (:attr:`Preset.shared`) and those of the kind the factory declares
    (:class:`~bpo_algos.registry.AlgorithmFactory`: ``preset.options[kind]``; ``env``'s own,
    ``EnvSetup.options``, in place of the preset's). A control that wraps another algorithm
    (``frozen``) takes that algorithm's."""
    factory = algorithm_factory(name)
    inner = factory.wraps(_own_options(factory, preset, env) or factory.Options())
    source = algorithm_factory(inner) if inner is not None else factory
    return AlgorithmSpec(name=name, seed=seed, shared=preset.shared, max_parallel_trees=max_parallel_trees(preset),
                         options=_own_options(source, preset, env), of=inner)


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


def option_classes() -> dict[str, type[Options]]:
    """``{algorithm kind: its Options dataclass}`` over the registered algorithms that declare
    options of their own (:class:`~bpo_algos.registry.AlgorithmFactory`)."""
    found: dict[str, type[Options]] = {}
    for name in registered_algorithms():
        factory = algorithm_factory(name)
        if factory.kind is not None and factory.Options.field_names():
            found.setdefault(factory.kind, factory.Options)
    return found


def base_options(preset: Preset, env: str, kind: str) -> Options:
    """``kind``'s options on ``env`` before tuning: the env's, else the preset's, else the defaults."""
    return preset.envs[env].options.get(kind) or preset.options.get(kind) or option_classes()[kind]()


# -- the tuning's choice --------------------------------------------------------------------


def tuning_preset(preset: Preset, env: str) -> Preset:
    """The setting of ``env``'s tuning runs: ``preset`` with the tuning's episodes per evaluation,
    evaluated on held-out training tasks (passed to the runs) and no further split."""
    out = copy.deepcopy(preset)
    out.envs[env].eval_split = "held-out"  # the held-out tasks are the training env's
    out.envs[env].extra_eval = {}  # the criterion reads the held-out tasks only
    out.envs[env].eval_episodes = preset.tuning.episodes
    return out


def with_options(preset: Preset, env: str, kind: str, candidate: dict[str, Any]) -> Preset:
    """A copy of ``preset`` whose ``env`` runs ``kind``'s algorithms (its variants and the
    controls that collect as it) with ``candidate`` (a tuning candidate, or the tuning's choice)
    over its current options."""
    out = copy.deepcopy(preset)
    out.envs[env].options[kind] = candidate_options(base_options(out, env, kind), candidate)
    return out


# -- the initial policy ----------------------------------------------------------------------


@dataclass(frozen=True)
class PolicySettings:
    """What the initial policy of an env is made with (:func:`~bpo_experiments.build.make_policy`):
    the preset's policy settings with the env's own over them (:func:`policy_settings`)."""

    policy: str
    """The policy's name (:func:`~bpo_experiments.build.make_policy`)."""
    temperature: float
    sft_epochs: int
    sft_lr: float
    max_new_tokens: int
    reasoning: bool
    prompt_layout: str
    decision_entropy: str
    probe_samples: int
    reference_offload: bool
    lora: bool
    vllm: bool
    precision: str
    eval_temperature: float | None
    max_model_len: int | None


def policy_settings(preset: Preset, setup: EnvSetup) -> PolicySettings:
    """The :class:`PolicySettings` of the env of ``setup`` in ``preset``: the env's ``policy``,
    ``sft_epochs`` and ``sft_lr`` over the preset's, its evaluation temperature and longest
    sequence."""
    return PolicySettings(
        policy=setup.policy or preset.policy,
        temperature=preset.temperature,
        sft_epochs=preset.sft_epochs if setup.sft_epochs is None else setup.sft_epochs,
        sft_lr=preset.sft_lr if setup.sft_lr is None else setup.sft_lr,
        max_new_tokens=setup.max_new_tokens,
        reasoning=preset.reasoning,
        prompt_layout=preset.prompt_layout,
        decision_entropy=preset.decision_entropy,
        probe_samples=preset.probe_samples,
        reference_offload=preset.reference_offload,
        lora=preset.lora,
        vllm=preset.vllm,
        precision=preset.trainer.precision,
        eval_temperature=setup.eval_temperature,
        max_model_len=setup.max_model_len,
    )


# -- one env ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvaluationSpec:
    """How one env's runs are evaluated and their curves read (docs/main-job.md, "Evaluated
    learning curves", "The comparator and the three metrics"); ``__post_init__`` checks the counts."""

    every: int
    """Evaluate after every this many updates (and at update 0 and after the last; 0: those two)."""
    episodes: int
    """Sampled episodes per evaluation task at every evaluation."""
    target_success: float
    """``compute_to_threshold`` waits for the warm start plus ``threshold_fraction`` of the gap to this success."""
    threshold_fraction: float

    def __post_init__(self) -> None:
        if self.every < 0 or self.episodes < 1:
            raise ValueError(f"eval_every must be >= 0 and eval_episodes >= 1, got {self.every} and {self.episodes}")


@dataclass(frozen=True)
class ProbeSpec:
    """How one env's runs probe their gradients (docs/main-job.md, "Gradient probes");
    ``__post_init__`` checks the counts."""

    batches: int
    """Batches of each probe (``grad_batches``; at most this many with a precision target)."""
    seeds: int | None
    """The first this many seeds probe (``grad_seeds``; None: all)."""
    reference_batches: int
    precision: float | None
    """The probes' precision target (``grad_precision``; None: ``batches`` batches)."""
    reference_precision: float | None
    reference: AlgorithmSpec
    """The reference estimator of the probes' cosine (:data:`REFERENCE_ALGORITHM`)."""

    def __post_init__(self) -> None:
        if self.batches < 0 or self.reference_batches < 0 or (self.seeds is not None and self.seeds < 0):
            raise ValueError(f"grad_batches, reference_batches and grad_seeds must be >= 0, got {self.batches}, "
                             f"{self.reference_batches} and {self.seeds}")


@dataclass(frozen=True)
class EnvConfig:
    """Everything of one env in a comparison, resolved (:func:`env_config`): each of its settings
    at its value for this env, one class per concern.

    ``__post_init__`` derives the updates after which a run evaluates, probes and measures the
    mechanism (:attr:`eval_points`, :attr:`probe_points`, :attr:`mechanism_points`) and checks
    the seeds.
    """

    # -- the env
    name: str
    """The env's name in the comparison (``webshop``)."""
    setup: EnvSetup
    """How the env is made and which tasks train and evaluate."""

    # -- training
    trainer: TrainerConfig
    """The training settings (the preset's with the env's own), but those set per run
    (:data:`~bpo_experiments.presets.RUN_FIELDS`: :meth:`run_trainer`)."""
    budget_unit: str
    budget: float
    """The per-update budget in ``budget_unit`` (an algorithm's ``budget_multiple`` not included)."""
    seeds: tuple[int, ...]
    """The evaluation seeds: one initial policy and one run per algorithm each."""
    pool_size: int
    """Envs in each run's pool."""
    torch_threads: int | None
    """CPU threads for torch (None: torch's default)."""

    # -- the initial policy, its evaluation, the probes
    policy: PolicySettings
    evaluation: EvaluationSpec
    probes: ProbeSpec

    # -- planning
    recorded_results: str | None = None
    """A saved ``results.json`` that ``bpo-compare --plan`` sizes this env from."""

    # -- derived (``__post_init__``)
    eval_points: tuple[int, ...] = field(init=False)
    """The updates after which the policy is evaluated: 0 (the warm start), every ``eval_every``, the last."""
    probe_points: dict[str, int] = field(init=False)
    """Where a run probes its gradient: ``{"initial": 0, "mid": updates // 2}``."""
    mechanism_points: dict[str, int] = field(init=False)
    """Where a run measures the mechanism on its own training batch: ``{"warm": 1, "mid":
    updates // 2 + 1}``, the batches collected by the warm start and by the policy after
    ``updates // 2`` updates (the probes' points)."""

    def __post_init__(self) -> None:
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"{self.name}: the seeds {list(self.seeds)} repeat one")
        updates = self.trainer.updates
        every = self.evaluation.every or updates
        object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "eval_points", tuple(sorted({0, *range(every, updates + 1, every), updates})))
        object.__setattr__(self, "probe_points", {"initial": 0, "mid": updates // 2})
        object.__setattr__(self, "mechanism_points", {"warm": 1, "mid": updates // 2 + 1})

    @property
    def horizon(self) -> float:
        """A run's whole budget: updates x the per-update budget (the AUC's x range)."""
        return self.trainer.updates * self.budget

    def per_update_budget(self, multiple: float = 1.0) -> Budget:
        return Budget(self.budget_unit, self.budget * multiple)

    def probes_on(self, seed: int) -> bool:
        """Whether the seed's runs probe their gradients: the first ``grad_seeds`` seeds (all when
        None), and only with at least 2 batches."""
        if self.probes.batches < 2:
            return False
        return seed in (self.seeds if self.probes.seeds is None else self.seeds[: self.probes.seeds])

    def run_trainer(self, seed: int, tasks_per_update: int, budget: Budget | None = None, **run: Any) -> TrainerConfig:
        """The :class:`TrainerConfig` of one run: :attr:`trainer` with the run's own fields (its
        tasks, the budget (default: the env's), the seed's training stream, ``run`` such as
        ``out_dir``), the last batch's trees saved."""
        fields = {
            "tasks_per_update": tasks_per_update,
            "budget": budget if budget is not None else self.per_update_budget(),
            "seed": stream_seed(seed, TRAINING),
            "save_trees_every": self.trainer.updates,  # the last batch's trees, for the report
            **run,
        }
        return replace(self.trainer, **fields)


def env_config(preset: Preset, env: str) -> EnvConfig:
    """The :class:`EnvConfig` of ``env`` in ``preset``."""
    setup = preset.envs[env]
    if setup.budget is None:
        raise ValueError(f"no {preset.budget_unit} budget for env {env!r}")
    return EnvConfig(
        name=env,
        setup=setup,
        trainer=trainer_for(preset, env),
        budget_unit=preset.budget_unit,
        budget=setup.budget,
        seeds=tuple(setup.seeds),
        pool_size=preset.pool_size,
        torch_threads=preset.torch_threads,
        policy=policy_settings(preset, setup),
        evaluation=EvaluationSpec(every=setup.eval_every, episodes=setup.eval_episodes, target_success=setup.target_success,
                                  threshold_fraction=preset.threshold_fraction),
        probes=ProbeSpec(batches=setup.grad_batches, seeds=setup.grad_seeds, reference_batches=setup.reference_batches,
                         precision=setup.grad_precision, reference_precision=setup.reference_precision,
                         reference=algorithm_spec(REFERENCE_ALGORITHM, preset, 0, env)),
        recorded_results=setup.recorded_results,
    )


# -- the comparison --------------------------------------------------------------------------


@dataclass(frozen=True)
class ComparisonConfig:
    """The comparison's own settings and its envs', resolved (:func:`comparison_config`): what
    the statistics, the report and the plan read.

    ``__post_init__`` checks that every env is named as its :class:`EnvConfig` is, in one budget unit.
    """

    envs: dict[str, EnvConfig]
    """Every env's settings, by name."""

    # -- the algorithms and the headline
    algorithms: tuple[str, ...]
    treatment: str
    comparator: str
    primary_metric: str
    competitors: tuple[str, ...] | None
    positive_control: str | None
    handicapped_control: str | None
    calibration_control: str | None
    budget_unit: str
    shared: AlgorithmConfig
    """The options every algorithm shares (loss, clipping, KL, aggregation)."""
    tuning: TuningConfig | None
    kinds: dict[str, str | None]
    """``{algorithm: the kind whose options it takes}`` (:func:`option_kinds`)."""
    comparator_specs: dict[str, AlgorithmSpec]
    """The comparator as each env builds it (seed 0; a run's own seed replaces it)."""

    # -- planning
    policy: str
    """The preset's policy, before an env's own (what a recorded pilot was measured with)."""
    sft_epochs: int
    sft_lr: float
    recorded_pilots: str | None
    gpus: int | None
    """GPUs the preset runs on (None: not a GPU preset); its memory plan must fit them."""
    gpu_gb: float
    """Memory of each of those GPUs, GB."""

    settings: dict[str, Any] = field(default_factory=dict)
    """The settings as plain data (``results.json``'s ``"preset"``)."""

    def __post_init__(self) -> None:
        misnamed = sorted(name for name, env in self.envs.items() if env.name != name)
        if misnamed:
            raise ValueError(f"ComparisonConfig.envs: {misnamed} hold another env's settings")
        units = {env.budget_unit for env in self.envs.values()} - {self.budget_unit}
        if units:
            raise ValueError(f"ComparisonConfig: budgets in {sorted(units)} beside {self.budget_unit}")
        object.__setattr__(self, "algorithms", tuple(self.algorithms))

    @property
    def controls(self) -> set[str | None]:
        return {self.positive_control, self.handicapped_control, self.calibration_control}

    def with_seeds(self, seeds: dict[str, tuple[int, ...]]) -> ComparisonConfig:
        """The same comparison over other seeds per env (``--report-only``: the finished ones)."""
        envs = {name: replace(env, seeds=tuple(seeds.get(name, env.seeds))) for name, env in self.envs.items()}
        return replace(self, envs=envs)


def comparison_config(preset: Preset, envs: Any = None) -> ComparisonConfig:
    """The :class:`ComparisonConfig` of ``preset`` (``envs``: these of its envs; default all)."""
    names = list(preset.envs) if envs is None else list(envs)
    return ComparisonConfig(
        envs={name: env_config(preset, name) for name in names},
        algorithms=tuple(preset.algorithms),
        treatment=preset.treatment,
        comparator=preset.comparator,
        primary_metric=preset.primary_metric,
        competitors=preset.competitors,
        positive_control=preset.positive_control,
        handicapped_control=preset.handicapped_control,
        calibration_control=preset.calibration_control,
        budget_unit=preset.budget_unit,
        shared=preset.shared,
        tuning=preset.tuning,
        kinds=option_kinds(preset.algorithms, preset),
        comparator_specs={name: algorithm_spec(preset.comparator, preset, 0, name) for name in names},
        policy=preset.policy,
        sft_epochs=preset.sft_epochs,
        sft_lr=preset.sft_lr,
        recorded_pilots=preset.recorded_pilots,
        gpus=preset.gpus,
        gpu_gb=preset.gpu_gb,
        settings=preset_dict(preset),
    )


# -- one run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunConfig:
    """Everything one run (env, algorithm, seed) is made with, resolved (:func:`run_config`).

    Its JSON (:meth:`to_json`, the run's ``config.json``) is flat: the env's settings the run
    uses, the algorithm's keyword arguments, the trainer's config.
    """

    env: str
    """The env's name in the comparison."""
    algorithm: str
    """The run's label: its folder and its results' ``"algorithm"`` (``bpo``, ``bpo@default``,
    ``bpo@tune2``)."""
    seed: int
    settings: EnvConfig
    """The env's settings (setup, evaluation, probes, initial policy)."""
    spec: AlgorithmSpec
    """The algorithm the run trains (its options typed; the seed: the run's algorithm stream)."""
    trainer: TrainerConfig
    """The trainer's config but the run's folder and loggers' names (set when it runs); its
    ``budget`` is the run's per-update budget, the algorithm's ``budget_multiple`` included."""
    probing: bool
    """Whether the run probes its gradient (the probed seeds' runs, not the tuning and default ones)."""

    def __post_init__(self) -> None:
        if self.settings.name != self.env:
            raise ValueError(f"RunConfig of {self.env} with the settings of {self.settings.name}")
        if self.trainer.budget is None or self.trainer.budget.unit != self.settings.budget_unit:
            raise ValueError(f"RunConfig: the trainer's budget {self.trainer.budget} is not in {self.settings.budget_unit}")

    # the settings a run reads, by the names of its config.json
    @property
    def registered(self) -> str:
        """The registered algorithm the label names."""
        return self.spec.name

    @property
    def options(self) -> dict[str, Any]:
        """The keywords the algorithm is built with (:meth:`AlgorithmSpec.keywords`)."""
        return self.spec.keywords()

    @property
    def budget_unit(self) -> str:
        return self.settings.budget_unit

    @property
    def budget(self) -> float:
        """The per-update budget in ``budget_unit``, the algorithm's ``budget_multiple`` included."""
        return self.trainer.budget.amount

    @property
    def setup(self) -> EnvSetup:
        return self.settings.setup

    @property
    def policy(self) -> PolicySettings:
        return self.settings.policy

    def per_update_budget(self) -> Budget:
        return Budget(self.budget_unit, self.budget)

    def build_algorithm(self, seed: int | None = None) -> Algorithm:
        """The run's algorithm (``seed``: another stream, e.g. a probe's, in place of the run's)."""
        return self.spec.build(seed)

    def to_json(self) -> dict[str, Any]:
        """The configuration as plain JSON data (``config.json``)."""
        s = self.settings
        data = {
            "env": self.env, "algorithm": self.algorithm, "seed": self.seed, "registered": self.registered,
            "options": self.options, "budget_unit": self.budget_unit, "budget": self.budget, "trainer": asdict(self.trainer),
            "setup": setup_data(s.setup), "policy": asdict(s.policy), "pool_size": s.pool_size, "torch_threads": s.torch_threads,
            "eval_points": s.eval_points, "eval_episodes": s.evaluation.episodes, "probing": self.probing,
            "probe_points": s.probe_points, "mechanism_points": s.mechanism_points, "grad_batches": s.probes.batches,
            "reference_batches": s.probes.reference_batches, "grad_precision": s.probes.precision,
            "reference_precision": s.probes.reference_precision, "reference_options": s.probes.reference.keywords(),
        }
        return json.loads(json.dumps(data, default=_plain))


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
    algorithm) on ``env`` with ``seed``, from ``preset`` (the flags applied, the run's tuned,
    default or candidate options in it)."""
    settings = env_config(preset, env)
    spec = algorithm_spec(base_algorithm(label), preset, stream_seed(seed, ALGORITHM), env)
    budget = settings.per_update_budget(spec.build().budget_multiple)
    return RunConfig(env=env, algorithm=label, seed=seed, settings=settings, spec=spec,
                     trainer=settings.run_trainer(seed, tasks_per_update, budget),
                     probing=settings.probes_on(seed) and spec.name == label)


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
