"""Experiment settings of the main job: how each env is set up, and the presets.

A :class:`Preset` is a full setting (envs, policy, algorithms, seeds, budget, optimizer);
``bpo-compare`` flags override its fields. Fields may be per env (a dict keyed by env name,
e.g. ``updates={"webshop": 30}``); :meth:`Preset.for_env` reads them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from bpo_envs.reward_settings import REWARD_SETTINGS


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
    eval_split: str = "held-out"
    """Where the final policy is evaluated: a split of the env (``"test"`` for WebShop's goals
    0-499, ``"valid_seen"`` / ``"valid_unseen"`` for ALFWorld: envs made with ``split=`` that
    name; train on ``kwargs["split"]``), or ``"held-out"`` (training-env tasks never trained
    on) or ``"train"`` (the train tasks, fresh rollouts), or ``"rows"`` (the first
    ``eval_tasks`` tasks, in their source's order, of the env made with ``eval_kwargs``: SWE-bench
    trained on ``--swe-train-instances`` and evaluated on ``--swe-instances``)."""
    eval_kwargs: dict[str, Any] = field(default_factory=dict)
    """Options over ``kwargs`` that the evaluation envs are made with (``eval_split="rows"``)."""


@dataclass
class Preset:
    """A full experiment setting; command-line flags override its fields."""

    envs: dict[str, EnvSetup]
    policy: str = "tabular"
    algorithms: tuple[str, ...] = ("bpo", "grpo", "rloo")
    """Registered algorithm names (``bpo_algos.register_algorithm``) trained on every env."""
    treatment: str = "bpo"
    """The algorithm compared, paired by seed, against the best of the baselines."""
    baselines: tuple[str, ...] | None = None
    """The algorithms the treatment is compared with (None: every other one; a preset that also
    trains variants of the treatment names the baselines proper)."""
    algorithm_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Extra constructor options per algorithm name (over the shared fields below)."""
    seeds: tuple[int, ...] | dict[str, tuple[int, ...]] = (0, 1, 2)
    """Seeds of every env, or per env (as ``updates``, ``eval_episodes`` and ``grad_batches``)."""
    updates: int | dict[str, int] = 30
    budget_unit: str = "env_steps"
    budget: dict[str, float] = field(default_factory=dict)
    """Per-update budget per env (in ``budget_unit``)."""
    # shared algorithm fields: passed to every algorithm whose factory names the parameter
    group_size: int = 8
    backbones: int = 2
    branch_factor: int = 4
    entropy_quantile: float = 0.8
    max_branch_points: int = 1
    learning_rate: float = 0.1
    optimizer: str = "adam"
    max_grad_norm: float | None = None
    aggregation: str = "token-mean"
    eval_episodes: int | dict[str, int] = 2
    grad_batches: int | dict[str, int] = 8
    sft_epochs: int = 0
    """Behaviour-cloning epochs on the env experts' trajectories of the train tasks."""
    sft_lr: float = 1e-3
    temperature: float = 1.0
    max_new_tokens: int | None = None
    """The longest answer an LLM policy generates (None: the policy's default)."""
    lora: bool = False
    vllm: bool = False
    pool_size: int = 4
    tensorboard: bool = False
    """Also log every run to TensorBoard (``runs/<env>/<algorithm>/seed<s>/tensorboard``)."""
    wandb_project: str | None = None
    """Also log every run to this W&B project (runs named ``env/algorithm/seed``)."""
    wandb_group: str | None = None
    """The W&B group of this comparison's runs (set by ``bpo-compare`` and kept on resume)."""
    precision: str = "fp32"
    """``TrainerConfig.precision``: ``bf16`` computes in bfloat16 with fp32 master weights."""
    micro_batch_tokens: int | None = None
    """``TrainerConfig.micro_batch_tokens``: tokens per backward (None: the whole batch)."""
    gradient_checkpointing: bool = False
    max_model_len: int | None | dict[str, int] = None
    """LLM policies: the longest prompt + answer (None: the model config's), or per env."""
    torch_threads: int | None = None
    """CPU threads for torch (None: torch's default). One thread makes small models faster
    (no synchronisation) and their training bit-reproducible."""
    # the paper's setting (docs/paper-setting.md)
    reasoning: bool = False
    """LLM policies reply with reasoning in ``<think>...</think>``, then the action
    (``PromptConfig(reasoning=True)``; answer limit :data:`~bpo_algos.policy.hf.REASONING_MAX_NEW_TOKENS`)."""
    decision_entropy: str = "exact"
    """LLM policies' decision entropy: ``"exact"`` (immediate answers scored at ``h``; a proxy
    when the policy reasons) or ``"probe"`` (``probe_samples`` completions, parsed, charged)."""
    probe_samples: int = 4
    kl_coef: float = 0.0
    """The k3 (``low_var_kl``) KL to the frozen initial policy, for every algorithm."""
    reference_offload: bool = False
    """Keep a full fine-tune's KL reference in host memory, streamed a module at a time."""
    fsdp: bool = False
    """``TrainerConfig.fsdp``: shard a full fine-tune over the ranks of a ``torchrun`` launch."""
    eval_temperature: float | None | dict[str, float | None] = None
    """The sampling temperature of evaluation episodes (None: ``temperature``; 0: greedy)."""
    gpus: int | None = None
    """The GPUs the preset is planned for (None: not a GPU preset); ``bpo-compare`` checks the
    memory plan (:func:`~bpo_algos.memory_plan.preset_plan`) fits ``gpus x gpu_gb`` first."""
    gpu_gb: float = 80.0

    def for_env(self, name: str, env: str) -> Any:
        """Field ``name`` for ``env``: its per-env value when the field is a dict (the field's
        default for an env the dict does not name)."""
        value = getattr(self, name)
        if isinstance(value, dict):
            return value[env] if env in value else Preset.__dataclass_fields__[name].default
        return value


QWEN_7B_PARAMS = 7_615_616_512
"""Qwen2.5-7B-Instruct's parameters (its bundled config.json, :mod:`bpo_algos.memory_plan`)."""

GPU_EPISODE_SHAPE: dict[str, dict[str, float]] = {
    "alfworld": {"steps": 40, "prompt_tokens": 1200, "reply_tokens": 250},
    "webshop": {"steps": 10, "prompt_tokens": 2000, "reply_tokens": 250},
    "swebench": {"steps": 40, "prompt_tokens": 8000, "reply_tokens": 400},
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

def gpu_envs() -> dict[str, EnvSetup]:
    """The gpu presets' envs (a fresh dict: flags edit the env options of one preset only)."""
    return {
        "alfworld": EnvSetup(
            "BPO-ALFWorld-v0", {"max_episode_steps": 50, "split": "train", **VERL_AGENT_REWARD}, train_tasks=3553, eval_tasks=134,
            workers=8, eval_split="valid_unseen",
        ),
        "webshop": EnvSetup(
            "BPO-WebShop-v0", {"max_episode_steps": 15, "split": "train", **VERL_AGENT_REWARD}, train_tasks=2048, eval_tasks=500,
            eval_split="test",
        ),
        # trained on --swe-train-instances (e.g. SWE-Gym), evaluated on --swe-instances (Verified)
        "swebench": EnvSetup("BPO-SWEBench-v0", {"max_episode_steps": 50}, train_tasks=2438, eval_tasks=500, workers=8, eval_split="rows"),
    }

GPU_COMMON: dict[str, Any] = {
    "policy": "Qwen/Qwen2.5-7B-Instruct",
    "algorithms": ("bpo", "grpo", "rloo", "gigpo"),
    "budget_unit": "flops",
    "budget": GPU_UPDATE_FLOPS,
    "updates": 150,
    "group_size": 8,
    "optimizer": "adamw",
    "max_grad_norm": 1.0,
    "temperature": 1.0,
    "eval_temperature": {"alfworld": 0.4, "webshop": 0.4, "swebench": 0.0},
    "reasoning": True,
    "decision_entropy": "probe",
    "probe_samples": 4,
    "kl_coef": 0.01,
    "vllm": True,
    "precision": "bf16",
    "micro_batch_tokens": 8192,
    "gradient_checkpointing": True,
    # verl-agent's prompt limits (ALFWorld 2048, WebShop 4096) plus the 512-token response
    "max_model_len": {"alfworld": 2048 + 512, "webshop": 4096 + 512, "swebench": 8192},
    # paths decoding at once per process (per rank under torchrun): their KV cache is planned
    "pool_size": 32,
    "eval_episodes": 1,
    "seeds": (0, 1, 2),
    "grad_batches": 4,
}


PRESETS: dict[str, Preset] = {
    # About 35 minutes on a 2-core CPU (seven algorithms): the small text-scoring model (TextScorerPolicy, ~1M
    # parameters) warm-started by behaviour cloning on the env experts, short horizons, small
    # task sets, evaluated on the standard splits (WebShop test goals, ALFWorld valid_seen; the
    # train-task success is in final_train_success: 16 games of demos teach this model little
    # about new games). WebShop's search candidates are the instruction's phrases (the default
    # search_actions="instruction": no hidden goal field).
    "cpu": Preset(
        envs={
            "webshop": EnvSetup("BPO-WebShop-v0", {"max_episode_steps": 15, "split": "train"}, train_tasks=64, eval_tasks=64, eval_split="test"),
            "alfworld": EnvSetup(
                "BPO-ALFWorld-v0", {"max_episode_steps": 20, "split": "train"}, train_tasks=16, eval_tasks=16,
                eval_split="valid_seen", sft_epochs=20,
            ),
        },
        policy="scorer",
        # the tree with its own and the state-anchored baseline (pooled with earlier batches: the
        # form the estimator study found best), the group baselines with and without it, and
        # the published step-level and tree methods
        algorithms=("bpo", "bpo-anchored+history", "grpo", "rloo", "rloo-anchored+history", "gigpo", "tree-grpo"),
        baselines=("grpo", "rloo", "rloo-anchored+history", "gigpo", "tree-grpo"),
        sft_epochs=4,
        sft_lr=3e-3,
        seeds={"webshop": (0, 1, 2, 3, 4, 5), "alfworld": (0, 1, 2)},
        budget={"webshop": 256, "alfworld": 320},
        updates={"webshop": 30, "alfworld": 12},
        learning_rate=1e-3,
        eval_episodes=4,
        grad_batches={"webshop": 16, "alfworld": 8},
        torch_threads=1,
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
            ),
            "webshop": EnvSetup("BPO-WebShop-v0", {"max_episode_steps": 15, "split": "train"}, train_tasks=16, eval_tasks=16, eval_split="test"),
        },
        budget={"treemdp": 512, "webshop": 512},
        updates=40,
    ),
    # The tiny offline Qwen2 model, warm-started by behaviour cloning on WebShop's expert, with
    # short episodes: the LLM code path end to end on a CPU (about 20 s an update here).
    "cpu-llm": Preset(
        envs={"webshop": EnvSetup("BPO-WebShop-v0", {"max_episode_steps": 8, "split": "train"}, train_tasks=8, eval_tasks=8, eval_split="test")},
        policy="tiny",
        budget={"webshop": 48},
        seeds=(0, 1),
        updates=8,
        group_size=4,
        backbones=2,
        branch_factor=2,
        learning_rate=1e-4,
        optimizer="adamw",
        max_grad_norm=1.0,
        sft_epochs=2,
        grad_batches=3,
        eval_episodes=2,
        pool_size=4,
    ),
    # SWE-bench end to end on a CPU: the tiny offline LLM behaviour-cloned on the bundled repos'
    # gold patches, 3-step episodes on the local sandbox, graded by the swebench harness; a few
    # updates, so the path runs in CI (a few minutes). `--swe-backend docker` runs it in Docker.
    "cpu-swe": Preset(
        envs={"swebench": EnvSetup(
            "BPO-SWEBench-v0", {"max_episode_steps": 2, "step_timeout": 15.0, "eval_timeout": 120.0},
            train_tasks=3, eval_tasks=3, eval_split="train",
        )},
        policy="tiny",
        algorithms=("bpo", "grpo"),
        budget={"swebench": 4},
        seeds=(0,),
        updates=2,
        group_size=2,
        backbones=2,
        branch_factor=2,
        learning_rate=1e-4,
        optimizer="adamw",
        max_grad_norm=1.0,
        max_new_tokens=24,
        sft_epochs=1,
        grad_batches=2,
        eval_episodes=1,
        pool_size=4,
    ),
    "smoke": Preset(
        envs={
            "treemdp": EnvSetup(
                "BPO-TreeMDP-v0",
                {"depth": 6, "n_actions": 3, "decisive_levels": (3,), "observe": "state", "n_tasks": 8, "seed": 0},
                train_tasks=4,
                eval_tasks=4,
            ),
            "webshop": EnvSetup(
                "BPO-WebShop-v0", {"max_episode_steps": 10, "split": "train"}, train_tasks=8, eval_tasks=8, policy="scorer",
                sft_epochs=2, eval_split="test",
            ),
        },
        sft_lr=3e-3,
        budget={"treemdp": 128, "webshop": 128},
        seeds=(0, 1),
        updates=4,
        grad_batches=3,
        eval_episodes=1,
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
        envs=gpu_envs(),
        **GPU_COMMON,
        learning_rate=1e-6,
        lora=False,
        fsdp=True,
        reference_offload=True,
        gpus=8,
        gpu_gb=80.0,
    ),
    # The same recipe on one H200 (141 GB): LoRA (r=8 on every linear map, lr 1e-5; verl-agent
    # publishes no LoRA recipe) instead of the full fine-tune; the KL reference is the base
    # model with the adapter off. bpo-memory-plan --model qwen2.5-7b-instruct --gpus 1
    # --gpu-gb 141 --lora --kl --vllm: ~50 GB.
    "gpu-lora": Preset(
        envs=gpu_envs(),
        **GPU_COMMON,
        learning_rate=1e-5,
        lora=True,
        gpus=1,
        gpu_gb=141.0,
    ),
}


def preset_dict(preset: Preset) -> dict[str, Any]:
    """The preset as plain JSON data (for ``preset.json``, results and loggers)."""
    return json.loads(json.dumps(asdict(preset), default=str))
