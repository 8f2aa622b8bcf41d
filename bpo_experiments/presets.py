"""Experiment settings of the main job: how each env is set up, and the presets.

A :class:`Preset` is a full setting: the envs (:class:`EnvSetup`: how each is made, its tasks,
and its own settings of the comparison: seeds, evaluation, probes), a
:class:`~bpo_algos.trainer_config.TrainerConfig`, the algorithms with their option dataclasses
(the shared :class:`~bpo_algos.algorithm.AlgorithmConfig` and each algorithm's own, e.g.
:class:`~bpo_algos.bpo.BPOOptions`), and the main job's own settings (policy, budgets). It is
read by :mod:`bpo_experiments.run_config` only, which resolves it into typed settings per env
and per run.
Nothing is declared twice: ``bpo-compare``'s flags are generated from these dataclasses
(:mod:`bpo_experiments.flags`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from baselines.gigpo import GiGPOOptions
from baselines.grpo import GRPOOptions
from baselines.rloo import RLOOOptions
from bpo_algos.algorithm import AlgorithmConfig, Options
from bpo_algos.bpo import BPOOptions
from bpo_algos.trainer_config import TrainerConfig
from bpo_envs.reward_settings import REWARD_SETTINGS
from bpo_experiments.tuning import TuningConfig


@dataclass
class EnvSetup:
    """How one env is made and which tasks train and evaluate."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    train_tasks: int = 16
    eval_tasks: int = 16
    workers: int = 1
    """Envs stepped in parallel threads (worth it where steps wait on subprocesses)."""
    policy: str | None = None
    """Overrides the preset's policy for this env."""
    sft_epochs: int | None = None
    """Overrides the preset's behaviour-cloning epochs for this env."""
    sft_lr: float | None = None
    """Overrides the preset's behaviour-cloning learning rate for this env."""
    eval_split: str = "held-out"
    """Where the final policy is evaluated: a split of the env (``"test"`` for WebShop's goals
    0-499, ``"valid_seen"`` / ``"valid_unseen"`` for ALFWorld: envs made with ``split=`` that
    name; train on ``kwargs["split"]``), or ``"held-out"`` (training-env tasks never trained
    on) or ``"train"`` (the train tasks, fresh rollouts), or ``"rows"`` (the first
    ``eval_tasks`` tasks, in their source's order, of the env made with ``eval_kwargs``: SWE-bench
    trained on ``--swe-train-instances`` and evaluated on ``--swe-instances``)."""
    extra_eval: dict[str, int] = field(default_factory=dict)
    """Further evaluation splits, ``{split: number of tasks}`` (ALFWorld: ``{"valid_unseen": 134}``
    beside ``eval_split="valid_seen"``): the warm start and every run's final policy are also
    evaluated on the first tasks of that split's fixed shuffle, ``eval_episodes`` each, on their
    own common random numbers; reported per split (``per_env[env]["splits"]``), not part of the
    headline."""
    eval_kwargs: dict[str, Any] = field(default_factory=dict)
    """Options over ``kwargs`` that the evaluation envs are made with (``eval_split="rows"``)."""
    max_new_tokens: int = 64
    """The longest answer an LLM policy generates here (a SWE-bench bash edit needs hundreds)."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """:class:`~bpo_algos.trainer_config.TrainerConfig` fields for this env only (e.g.
    ``{"updates": 12}``), over the preset's ``trainer``."""
    options: dict[str, Any] = field(default_factory=dict)
    """Algorithm options for this env only, in place of the preset's ``options`` of that kind of
    algorithm (e.g. ``{"gigpo": GiGPOOptions(scale="group")}``: verl-agent's GiGPO normalises
    by the group's standard deviation on ALFWorld, not on WebShop); ``--KIND.OPTION`` flags
    still win."""

    servers: tuple[str, ...] = ()
    """``bpo-serve`` servers of this env (docs/serving.md): the runs step ``BPO-Remote-v0``
    sessions of them, round robin, instead of envs in their own process (``--env-server``)."""

    # -- the comparison's settings on this env (a flag of the same name sets one for every env)
    budget: float | None = None
    """The per-update budget of every run on this env, in the preset's ``budget_unit`` (None:
    none, and a comparison of this env refuses to start)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """The evaluation seeds: one initial policy and one run per algorithm each."""
    eval_every: int = 5
    """Evaluate every run's policy on the evaluation tasks after every this many updates (and at
    update 0, the warm start, and after the last)."""
    eval_episodes: int = 2
    """Sampled episodes per evaluation task at every evaluation."""
    target_success: float = 1.0
    """``compute_to_threshold`` waits for the warm start plus ``threshold_fraction`` of the gap to
    this success."""
    grad_batches: int = 32
    """Independent batches of each gradient probe (warm start and mid-training; the bootstrap
    interval of the signal-to-noise ratio resamples them)."""
    grad_seeds: int | None = None
    """The first this many seeds probe their gradients (None: all)."""
    reference_batches: int = 64
    """RLOO batches whose mean is the reference gradient of the cosine diagnostic (at most this
    many where ``reference_precision`` is set)."""
    grad_precision: float | None = None
    """The precision target of each gradient probe: as many batches (at most ``grad_batches``)
    as make the relative standard error of its signal-to-noise ratio at most this, predicted from
    batches independent of the probe's (docs/main-job.md, "Gradient probes"); None:
    ``grad_batches`` batches."""
    reference_precision: float | None = None
    """The precision target of the reference gradient: as many batches (at most
    ``reference_batches``) as make the noise of their mean at most this squared of its signal;
    None: ``reference_batches`` batches."""
    eval_temperature: float | None = None
    """Sampling temperature of evaluation episodes (None: the preset's ``temperature``; 0: greedy)."""
    max_model_len: int | None = None
    """LLM policies: the longest prompt + answer (None: the model config's)."""
    recorded_results: str | None = None
    """A saved ``results.json`` of this setting (a path relative to the repository root) that
    ``bpo-compare --plan`` takes the env's costs and seed-to-seed spread from."""

    def __post_init__(self) -> None:
        self.servers = tuple(self.servers)
        self.seeds = tuple(self.seeds)
        if self.eval_temperature is not None and not self.eval_temperature >= 0:
            raise ValueError(f"--eval-temperature must be >= 0 (0: greedy), got {self.eval_temperature}")
        unknown = set(self.trainer) - set(TrainerConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"EnvSetup.trainer: {sorted(unknown)} are not TrainerConfig fields")
        wrong = sorted(k for k, v in self.options.items() if not isinstance(v, Options))
        if wrong:
            raise TypeError(f"EnvSetup.options: {wrong} must be algorithm option dataclasses (e.g. GiGPOOptions)")


ENV_SETTINGS: tuple[str, ...] = (
    "budget", "target_success", "eval_every", "seeds", "eval_episodes", "grad_batches", "grad_seeds", "reference_batches",
    "grad_precision", "reference_precision", "recorded_results", "max_model_len", "eval_temperature",
)
"""The comparison's settings that are each env's own (:class:`EnvSetup` fields): before they
were, each was a :class:`Preset` field holding one value or ``{env: value}`` (``budget``: always
``{env: value}``), as the files of earlier versions (``preset.json``, ``config.yaml``) still
write them (:func:`with_env_settings`)."""


def with_env_settings(envs: dict[str, EnvSetup], settings: dict[str, Any]) -> dict[str, EnvSetup]:
    """``envs`` with ``settings`` (:data:`ENV_SETTINGS` written as a preset field: one value for
    every env, or ``{env: value}``, whose envs not named get the field's default); the converter
    from the format of earlier versions, and ``--seeds`` and its kind (one value, every env)."""
    unknown = sorted(set(settings) - set(ENV_SETTINGS))
    if unknown:
        raise ValueError(f"{unknown} are not per-env settings ({', '.join(ENV_SETTINGS)})")
    defaults = {f.name: f.default for f in fields(EnvSetup) if f.name in ENV_SETTINGS}
    out = {}
    for name, setup in envs.items():
        changes = {key: (value.get(name, defaults[key]) if isinstance(value, dict) else value) for key, value in settings.items()}
        out[name] = replace(setup, **changes)
    return out


def setup_data(setup: EnvSetup) -> dict[str, Any]:
    """``setup`` as plain data without its :data:`ENV_SETTINGS`: how the env is made and which
    tasks train and evaluate (what a run's ``config.json`` and a recorded pilot hold as its
    ``setup``; the settings are beside it)."""
    return {k: v for k, v in asdict(setup).items() if k not in ENV_SETTINGS}


def with_server(envs: dict[str, EnvSetup], base_url: str) -> dict[str, EnvSetup]:
    """``envs`` with ``base_url`` added to the servers of every env it serves: those of the
    served env id, whose kwargs must be the ones the server made its envs with."""
    from bpo_envs.remote import describe_server  # the serve extra, only when asked for

    health = describe_server(base_url)
    served = [name for name, setup in envs.items() if setup.env_id == health["env_id"]]
    if not served:
        raise ValueError(f"{base_url} serves {health['env_id']}, which none of the envs {sorted(envs)} is")
    out = dict(envs)
    for name in served:
        setup = envs[name]
        if json.loads(json.dumps(setup.kwargs)) != health["env_kwargs"]:
            raise ValueError(
                f"{base_url} makes {health['env_id']} with {health['env_kwargs']}, but {name} needs "
                f"{setup.kwargs}: serve it with those kwargs"
            )
        out[name] = replace(setup, servers=(*setup.servers, base_url))
    return out


RUN_FIELDS = ("tasks_per_update", "budget", "seed", "out_dir", "resume", "progress", "wandb_name", "wandb_config", "save_trees_every")
"""TrainerConfig fields the main job sets per run (the train tasks, the env's budget, the seed,
the run folder, ...); a preset's values for them are not used."""


def _trainer(**changes: Any) -> TrainerConfig:
    return TrainerConfig(**{"updates": 30, "checkpoint_every": 1, **changes})


@dataclass
class Preset:
    """A full experiment setting; command-line flags override its fields.

    What is each env's own is an :class:`EnvSetup` field (its seeds, evaluation, probes:
    :data:`ENV_SETTINGS`; its training settings over the preset's :attr:`EnvSetup.trainer`). A
    preset is read by :mod:`bpo_experiments.run_config` only, which resolves each env's and each
    run's settings from it.
    """

    envs: dict[str, EnvSetup]
    trainer: TrainerConfig = field(default_factory=_trainer)
    """How every run trains (optimizer, learning rate, updates, precision, loggers, ...);
    :data:`RUN_FIELDS` are set per run."""
    algorithms: tuple[str, ...] = ("bpo", "grpo", "rloo")
    """Registered algorithm names (``bpo_algos.register_algorithm``) trained on every env."""
    shared: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The options every algorithm shares (loss, clipping, KL, aggregation)."""
    options: dict[str, Options] = field(default_factory=dict)
    """Each kind of algorithm's own options, keyed by the kind its factory declares
    (:class:`~bpo_algos.registry.AlgorithmFactory`; ``"bpo"``: a
    :class:`~bpo_algos.bpo.BPOOptions`, also for the ``bpo-anchored`` variants; ``"rloo"``: an
    ``RLOOOptions``, also for the controls that wrap RLOO; ``"frozen"``: the control's own
    ``ControlOptions``; ...), set on the command line by ``--KIND.OPTION``; a kind not named
    here gets its defaults."""
    treatment: str = "bpo"
    """The algorithm of the headline: compared, paired by seed, with the comparator."""
    comparator: str = "rloo"
    """The algorithm the treatment (and every other algorithm) is compared with, fixed before
    the run: the headline is treatment - comparator per env (docs/main-job.md)."""
    primary_metric: str = "auc"
    """The headline metric, fixed before the run: ``auc`` (area under the evaluated-success
    curve against the budget unit, normalised to [0, 1]), ``final`` (final evaluated success)
    or ``compute_to_threshold``; the other two are reported beside it."""
    competitors: tuple[str, ...] | None = None
    """The baselines of the secondary, post-hoc figure "the treatment against the best of the
    competitors" (None: every other algorithm but the controls)."""
    positive_control: str | None = "frozen"
    """The algorithm that must come out worse than the comparator (a learner that never moves);
    where it does not, every headline of that env is marked underpowered."""
    handicapped_control: str | None = "reinforce"
    """A learner with a known handicap: the report says whether it ranks below the comparator."""
    calibration_control: str | None = "rloo-2x"
    """The comparator's estimator at twice the budget per update (half the variance at the same
    number of updates): its difference to the comparator, reported beside the headline, says
    whether the instrument can see what halving the variance is worth."""
    tuning: TuningConfig | None = None
    """The tuning protocol (``bpo-compare --tune``; :mod:`bpo_experiments.tuning`), or None:
    every algorithm at the preset's options."""
    threshold_fraction: float = 0.5
    """The fraction of the gap from the warm start to ``target_success`` that
    ``compute_to_threshold`` waits for (per seed: each seed has its own warm start)."""
    budget_unit: str = "env_steps"
    """The compute unit of the budgets (each env's :attr:`EnvSetup.budget`;
    ``bpo_algos.COMPUTE_UNITS``); the others are reported."""
    recorded_pilots: str | None = None
    """The pilots of ``bpo-compare --plan`` measured for this preset (a JSON file relative to the
    repository root, written by ``--plan --pilot``): an env with no recorded results is sized
    from its recorded pilot instead of running one, while its settings are the pilot's."""
    policy: str = "tabular"
    """``scorer`` | ``tabular`` | ``tabular-prior`` | ``tiny`` | ``smollm2`` | a model name or folder."""
    sft_epochs: int = 0
    """Behaviour-cloning epochs on the env experts' trajectories of the train tasks."""
    sft_lr: float = 1e-3
    """Learning rate of behaviour cloning."""
    temperature: float = 1.0
    """Sampling temperature of the policy."""
    lora: bool = False
    """LLM policies: train LoRA adapters instead of every weight."""
    vllm: bool = False
    """LLM policies: generate with vLLM (training stays in transformers)."""
    pool_size: int = 4
    """Envs in each run's pool; the trees in flight are a quarter of it unless ``shared`` sets
    ``max_parallel_trees`` (:func:`~bpo_experiments.run_config.max_parallel_trees`)."""
    torch_threads: int | None = None
    """CPU threads for torch (None: torch's default). One thread makes small models faster
    (no synchronisation) and their training bit-reproducible."""
    reasoning: bool = False
    """LLM policies reply with reasoning in ``<think>...</think>``, then the action
    (``PromptConfig(reasoning=True)``, docs/paper-setting.md); give the envs room for it
    (``EnvSetup.max_new_tokens``: verl-agent's 512)."""
    prompt_layout: str = "summary"
    """LLM policies' prompt layout (``PromptConfig.layout``): ``summary`` (one user message: task,
    recent steps, current observation) or ``turns`` (a chat of turns, each step's prompt
    extending the one before, so a kept prompt's key-value cache serves the path's next
    decision; docs/training.md, "Prompt KV cache")."""
    decision_entropy: str = "exact"
    """LLM policies' decision entropy: ``exact`` (immediate answers scored at h; a proxy when the
    policy reasons) or ``probe`` (``probe_samples`` completions, parsed, charged as scoring)."""
    probe_samples: int = 4
    """Completions per ``probe`` decision entropy."""
    reference_offload: bool = False
    """A full fine-tune's KL reference kept in host memory, streamed to the GPU a module at a time."""
    gpus: int | None = None
    """GPUs the preset runs on (None: not a GPU preset); its memory plan must fit them."""
    gpu_gb: float = 80.0
    """Memory of each of those GPUs, GB."""


QWEN_7B_PARAMS = 7_615_616_512
"""Qwen2.5-7B-Instruct's parameters (its bundled config.json, :mod:`bpo_algos.memory_plan`)."""

GPU_EPISODE_SHAPE: dict[str, dict[str, float]] = {
    "alfworld": {"steps": 40, "prompt_tokens": 1200, "reply_tokens": 250},
    "webshop": {"steps": 10, "prompt_tokens": 2000, "reply_tokens": 250},
    "swebench": {"steps": 40, "prompt_tokens": 6000, "reply_tokens": 400},
}
"""Planning figures of one episode of the 7B reasoning policy early in training: steps (of 50,
15, 50), mean prompt tokens (task, two recent turns, admissible actions), mean reply tokens
(reasoning + action, of 512). Estimates that size the budget (docs/paper-setting.md); a pilot's
measured means replace them."""


def group_update_flops(params: int, steps: float, prompt_tokens: float, reply_tokens: float, tasks: int = 16, group: int = 8) -> float:
    """The cost model's flops (:mod:`bpo_algos.compute`: ``2P`` per prefilled and generated
    token, ``6P`` per trained token) of one update of a group method: ``tasks x group``
    episodes of ``steps`` steps, each prefilling its prompt, generating its reply and training
    on both."""
    per_step = 2 * params * (prompt_tokens + reply_tokens) + 6 * params * (prompt_tokens + reply_tokens)
    return float(tasks * group * steps * per_step)


GPU_UPDATE_FLOPS: dict[str, float] = {
    env: group_update_flops(QWEN_7B_PARAMS, **shape) for env, shape in GPU_EPISODE_SHAPE.items()
}
"""The gpu presets' per-update budget: verl-agent's 16 tasks x 8 rollouts, in flops."""

VERL_AGENT_REWARD = REWARD_SETTINGS["verl-agent"]


GPU_GIGPO_OPTIONS = GiGPOOptions(group_size=8, step_weight=1.0, gamma=0.95)
"""verl-agent's GiGPO (``step_advantage_w=1.0``, ``gamma=0.95``, ``mean_norm``: no std scaling)."""


def gpu_envs() -> dict[str, EnvSetup]:
    """The gpu presets' envs (a fresh dict: flags edit the env options of one preset only)."""
    return {
        "alfworld": EnvSetup(
            "BPO-ALFWorld-v0", {"max_episode_steps": 50, "split": "train", **VERL_AGENT_REWARD}, train_tasks=3553, eval_tasks=134,
            workers=8, eval_split="valid_unseen", max_new_tokens=512,
            # run_alfworld.sh's gigpo.mode=mean_std_norm (run_webshop.sh: mean_norm, the preset's)
            options={"gigpo": replace(GPU_GIGPO_OPTIONS, scale="group")},
        ),
        "webshop": EnvSetup(
            "BPO-WebShop-v0", {"max_episode_steps": 15, "split": "train", **VERL_AGENT_REWARD}, train_tasks=2048, eval_tasks=500,
            eval_split="test", max_new_tokens=512,
        ),
        # trained on --swe-train-instances (e.g. SWE-Gym), evaluated on --swe-instances (Verified)
        "swebench": EnvSetup(
            "BPO-SWEBench-v0", {"max_episode_steps": 50}, train_tasks=2438, eval_tasks=500, workers=8, eval_split="rows",
            max_new_tokens=2048,
        ),
    }


def _gpu_trainer(**changes: Any) -> TrainerConfig:
    return _trainer(**{
        "updates": 150, "optimizer": "adamw", "max_grad_norm": 1.0, "precision": "bf16", "micro_batch_tokens": 8192,
        "gradient_checkpointing": True, **changes,
    })


GPU_COMMON: dict[str, Any] = {
    "policy": "Qwen/Qwen2.5-7B-Instruct",
    # the treatment, the comparator, the published group methods, and the positive control
    # (frozen: RLOO's collection with a zero loss); no handicapped learner (a run costs days)
    "algorithms": ("bpo", "rloo", "grpo", "gigpo", "frozen"),
    "competitors": ("rloo", "grpo", "gigpo"),
    "comparator": "rloo",
    "handicapped_control": None,
    "shared": AlgorithmConfig(kl_coef=0.01),
    "options": {
        "grpo": GRPOOptions(group_size=8), "rloo": RLOOOptions(group_size=8),
        "gigpo": GPU_GIGPO_OPTIONS,
    },
    "budget_unit": "flops",
    "temperature": 1.0,
    "reasoning": True,
    "decision_entropy": "probe",
    "probe_samples": 4,
    "vllm": True,
    # paths decoding at once per process (per rank under torchrun): their KV cache is planned
    "pool_size": 32,
}

GPU_ENV_SETTINGS: dict[str, Any] = {
    "budget": GPU_UPDATE_FLOPS,
    "eval_temperature": {"alfworld": 0.4, "webshop": 0.4, "swebench": 0.0},
    # verl-agent's prompt limits (ALFWorld 2048, WebShop 4096) plus the 512-token response
    "max_model_len": {"alfworld": 2048 + 512, "webshop": 4096 + 512, "swebench": 8192},
    # the power plan (bpo_experiments.gpu_plan, docs/paper-setting.md): the cheapest seeds
    # and evaluation episodes whose detectable effect is <= 4 points on each env
    "seeds": {"alfworld": tuple(range(6)), "webshop": tuple(range(6)), "swebench": tuple(range(10))},
    "eval_episodes": {"alfworld": 16, "webshop": 4, "swebench": 1},
    "eval_every": 25,
    "grad_batches": 4,
    "grad_seeds": 1,
}
"""The gpu presets' per-env settings (:func:`with_env_settings`)."""


PRESETS: dict[str, Preset] = {
    # The CPU default (docs/main-job.md, "The CPU default"): the small text-scoring model
    # (TextScorerPolicy, ~1M parameters) warm-started by behaviour cloning on the env experts,
    # evaluated on the standard splits (WebShop: all 500 test goals at updates 0, 4, ..., 20;
    # ALFWorld valid_seen) with common random numbers. The treatment and the comparator (RLOO),
    # each tuned on WebShop by the fixed protocol (seeds 1000, 1001; four candidates each; AUC on
    # 64 held-out training goals), the positive control (frozen) and the calibration control
    # (rloo-2x: RLOO at twice the budget per update); 32 WebShop seeds (the headline's MDE at most
    # the calibration effect: docs/main-job.md, "The CPU default"), gradient probes of 16
    # batches on the first 3 (reference: 32 RLOO batches). WebShop's search candidates are the instruction's phrases
    # (search_actions="instruction": no hidden goal).
    "cpu": Preset(
        envs=with_env_settings({
            "webshop": EnvSetup(
                "BPO-WebShop-v0", {"max_episode_steps": 15, "split": "train"}, train_tasks=64, eval_tasks=500, eval_split="test",
            ),
            "alfworld": EnvSetup(
                "BPO-ALFWorld-v0", {"max_episode_steps": 50, "split": "train", "expert": "handcoded"},
                # docs/alfworld.md, "Many training games" and "The learning curve": the games come
                # from the shipped game index; each update trains on games no earlier update did;
                # both validation splits at ALFWorld's own sizes (140 and 134), one episode a game.
                # 10 cloning epochs and the preset's learning rate 1e-3 stay: a 2-epoch warm start
                # (at 1e-3 or 1e-2), 3e-3, and 3e-3 with a doubled budget all detect the positive
                # control with less power per seed; at this setting's spread 6 seeds give power 0.95
                # (docs/alfworld.md, "A control the default can see")
                train_tasks=1000, eval_tasks=140, eval_split="valid_seen", extra_eval={"valid_unseen": 134},
                policy="scorer-memory", sft_epochs=10, trainer={"updates": 12, "task_draw": "unseen-first"},
            ),
        }, dict(
            # ALFWorld: ~5 ms of CPU an env step with the policy and its training (3.3 ms the env:
            # textworld derives every admissible command's text); docs/alfworld.md sizes the runs and
            # their evaluations (140 valid_seen + 134 valid_unseen games x 1 episode)
            budget={"webshop": 256, "alfworld": 800},
            seeds={"webshop": tuple(range(32)), "alfworld": tuple(range(6))},
            # at least 6 evaluation points a run (docs/main-job.md, "Evaluation points"): WebShop at
            # updates 0, 4, ..., 20; ALFWorld at 0, 2, ..., 12
            eval_every={"webshop": 4, "alfworld": 2},
            eval_episodes=1,
            grad_batches=16,
            # probes on WebShop's first 3 seeds; on ALFWorld 2 x 32 batches of 800 env steps per
            # algorithm would cost about as much as the whole comparison there
            grad_seeds={"webshop": 3, "alfworld": 0},
            reference_batches=32,
            # each probe's SNR to +-35% (one standard error; 16 batches gave about +-25% on WebShop),
            # the reference's noise at most 6% of its signal (docs/main-job.md, "Gradient probes")
            grad_precision=0.35,
            reference_precision=0.25,
            # compute_to_threshold: halfway from the warm start to these
            target_success={"webshop": 0.6, "alfworld": 0.5},
            recorded_results={"webshop": "docs/results/compare-cpu-default/results.json",
                              "alfworld": "docs/results/compare-cpu-default/results.json"},
        )),
        trainer=_trainer(updates=20, learning_rate=1e-3),
        policy="scorer",
        algorithms=("bpo", "rloo", "frozen", "rloo-2x"),
        competitors=("rloo",),
        comparator="rloo",
        handicapped_control=None,
        tuning=TuningConfig(seeds=(1000, 1001), tasks=64, episodes=1, envs=("webshop",), default_seeds=10),
        sft_epochs=4,
        sft_lr=3e-3,
        torch_threads=1,
        recorded_pilots="docs/results/plan-pilots/cpu.json",
    ),
    # The first CPU setting: tabular policies, agent-like TreeMDP from its agent prior, WebShop from uniform.
    "cpu-tabular": Preset(
        envs={
            "treemdp": EnvSetup(
                "BPO-TreeMDP-v0",
                {"depth": 8, "n_actions": 3, "decisive_levels": (5,), "observe": "state", "n_tasks": 32, "seed": 0},
                train_tasks=16,
                eval_tasks=16,
                policy="tabular-prior",
                max_new_tokens=16,
                budget=512,
            ),
            "webshop": EnvSetup("BPO-WebShop-v0", {"max_episode_steps": 15, "split": "train"}, train_tasks=16, eval_tasks=16, eval_split="test",
                                budget=512),
        },
        trainer=_trainer(updates=40),
    ),
    # The tiny offline Qwen2 model, warm-started by behaviour cloning on WebShop's expert, with
    # short episodes: the LLM code path end to end on a CPU (about 20 s an update here).
    "cpu-llm": Preset(
        envs={"webshop": EnvSetup(
            "BPO-WebShop-v0", {"max_episode_steps": 8, "split": "train"}, train_tasks=8, eval_tasks=8, eval_split="test",
            seeds=(0, 1), grad_batches=3, eval_episodes=2, eval_every=1,  # 9 evaluation points
            budget=48,
        )},
        policy="tiny",
        trainer=_trainer(updates=8, learning_rate=1e-4, optimizer="adamw", max_grad_norm=1.0),
        options={"bpo": BPOOptions(backbones=2, branch_factor=2), "grpo": GRPOOptions(group_size=4), "rloo": RLOOOptions(group_size=4)},
        sft_epochs=2,
        pool_size=4,
    ),
    # SWE-bench end to end on a CPU: the tiny offline LLM behaviour-cloned on the bundled repos'
    # gold patches, 3-step episodes on the local sandbox, graded by the swebench harness; a few
    # updates, so the path runs in CI (a few minutes). `--swe-backend docker` runs it in Docker.
    "cpu-swe": Preset(
        envs={"swebench": EnvSetup(
            "BPO-SWEBench-v0", {"max_episode_steps": 2, "step_timeout": 15.0, "eval_timeout": 120.0,
                                # the three small bundled rows (romans' long test log is for tests)
                                "instance_ids": ["bpo-gym__textkit-1", "bpo-gym__intervals-1", "bpo-gym__inicfg-1"]},
            train_tasks=3, eval_tasks=3, eval_split="train", max_new_tokens=24, seeds=(0,), grad_batches=2, eval_episodes=1,
            reference_batches=2,  # (the default 64 RLOO batches of the tiny LLM in sandboxes: ~10 min)
            budget=4,
        )},
        policy="tiny",
        algorithms=("bpo", "grpo"),
        comparator="grpo",
        trainer=_trainer(updates=2, learning_rate=1e-4, optimizer="adamw", max_grad_norm=1.0),
        options={"bpo": BPOOptions(backbones=2, branch_factor=2), "grpo": GRPOOptions(group_size=2)},
        sft_epochs=1,
        pool_size=4,
    ),
    # CI-sized: every part of the main job (tuning on TreeMDP with two candidates per algorithm
    # on 4 held-out training tasks, the controls, the calibration control, probes, mechanism)
    "smoke": Preset(
        envs=with_env_settings({
            "treemdp": EnvSetup(
                "BPO-TreeMDP-v0",
                {"depth": 6, "n_actions": 3, "decisive_levels": (3,), "observe": "state", "n_tasks": 12, "seed": 0},
                train_tasks=4,
                eval_tasks=4,
                max_new_tokens=16,
            ),
            "webshop": EnvSetup(
                "BPO-WebShop-v0", {"max_episode_steps": 10, "split": "train"}, train_tasks=8, eval_tasks=8, policy="scorer",
                sft_epochs=2, eval_split="test",
            ),
        }, dict(budget=128, seeds=(0, 1), eval_every=2, grad_batches=3, grad_seeds=1, reference_batches=4, eval_episodes=1)),
        algorithms=("bpo", "grpo", "rloo", "frozen", "reinforce", "rloo-2x"),
        tuning=TuningConfig(
            seeds=(1000,), tasks=4, envs=("treemdp",),
            grids={"bpo": ({"backbones": 2, "branch_factor": 4}, {"backbones": 2, "branch_factor": 2, "max_branch_points": 2, "max_depth": 2}),
                   "rloo": ({"group_size": 4}, {"group_size": 8}), "grpo": ({"group_size": 4}, {"group_size": 8})},
        ),
        sft_lr=3e-3,
        trainer=_trainer(updates=4),
        torch_threads=1,
    ),
    # The paper's setting, after verl-agent's published GiGPO/GRPO recipes
    # (examples/gigpo_trainer/run_alfworld.sh, run_webshop.sh; docs/paper-setting.md has the
    # table with each row's source): Qwen2.5-7B-Instruct fully fine-tuned at lr 1e-6 under FSDP on
    # 8 x 80 GB, the k3 KL at 0.01 to a frozen reference kept in host memory, reward 10 x success
    # and -0.1 per invalid action, reasoning replies (think, then the action; 512 tokens),
    # groups of 8, 150 updates, evaluated at temperature 0.4 (SWE-bench: greedy, one episode on
    # each of Verified's rows given, 500 by default) on ALFWorld's 134 valid_unseen games and
    # WebShop's 500 test goals. Every algorithm gets the flops of 16 tasks x 8 rollouts per
    # update (GPU_UPDATE_FLOPS).
    "gpu": Preset(
        # no gradient probes: they need the whole policy on one process, not FSDP shards
        envs=with_env_settings(gpu_envs(), {**GPU_ENV_SETTINGS, "grad_seeds": 0}),
        trainer=_gpu_trainer(learning_rate=1e-6, fsdp=True),
        reference_offload=True,
        gpus=8,
        gpu_gb=80.0,
        **GPU_COMMON,
    ),
    # The same recipe on one H200 (141 GB): LoRA (r=8 on every linear map, lr 1e-5; verl-agent
    # publishes no LoRA recipe) instead of the full fine-tune; the KL reference is the base
    # model with the adapter off. bpo-memory-plan --model qwen2.5-7b-instruct --gpus 1
    # --gpu-gb 141 --lora --kl --vllm --decode-rows 32 --seq-len 8192: ~50 GB.
    "gpu-lora": Preset(
        envs=with_env_settings(gpu_envs(), GPU_ENV_SETTINGS),
        trainer=_gpu_trainer(learning_rate=1e-5),
        lora=True,
        gpus=1,
        gpu_gb=141.0,
        **GPU_COMMON,
    ),
}


PER_ENV_FIELDS: tuple[str, ...] = ENV_SETTINGS
"""The fields a preset's data (:func:`preset_dict`) of an earlier version keys by env name:
each of :data:`ENV_SETTINGS`, a dict or one value (``budget``: always a dict)."""


def preset_dict(preset: Preset) -> dict[str, Any]:
    """The preset as plain JSON data (for ``preset.json``, results and loggers)."""
    return json.loads(json.dumps(asdict(preset), default=str))


__all__ = ["EnvSetup", "Preset", "PRESETS", "TuningConfig", "GPU_UPDATE_FLOPS", "ENV_SETTINGS", "PER_ENV_FIELDS", "RUN_FIELDS", "BPOOptions", "GRPOOptions", "RLOOOptions", "GiGPOOptions", "preset_dict", "setup_data", "with_env_settings"]
