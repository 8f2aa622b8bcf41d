"""Experiment settings of the main job: how each env is set up, and the presets.

A :class:`Preset` is a full setting (envs, policy, algorithms, seeds, budget, optimizer);
``bpo-compare`` flags override its fields. Fields may be per env (a dict keyed by env name,
e.g. ``updates={"webshop": 30}``); :meth:`Preset.for_env` reads them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


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
    on) or ``"train"`` (the train tasks, fresh rollouts)."""


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
    max_model_len: int | None = None
    """LLM policies: the longest prompt + answer (None: the model config's)."""
    torch_threads: int | None = None
    """CPU threads for torch (None: torch's default). One thread makes small models faster
    (no synchronisation) and their training bit-reproducible."""

    def for_env(self, name: str, env: str) -> Any:
        """Field ``name`` for ``env``: its per-env value when the field is a dict (the field's
        default for an env the dict does not name)."""
        value = getattr(self, name)
        if isinstance(value, dict):
            return value[env] if env in value else Preset.__dataclass_fields__[name].default
        return value


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
                "BPO-ALFWorld-v0", {"max_episode_steps": 50, "split": "train", "expert": "handcoded"},
                train_tasks=60, eval_tasks=48, eval_split="valid_seen", policy="scorer-memory", sft_epochs=10,
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
        budget={"webshop": 256, "alfworld": 800},
        updates={"webshop": 30, "alfworld": 12},
        learning_rate=1e-3,
        eval_episodes=4,
        grad_batches={"webshop": 16, "alfworld": 4},
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
    # The paper's setting: a 7-8B instruct model with vLLM generation, group 8, the common
    # ALFWorld/WebShop step limits (50 and 15), evaluated where the papers report: ALFWorld's
    # valid_unseen games (all 134 with the real data) and WebShop's 500 test goals.
    "gpu": Preset(
        envs={
            "alfworld": EnvSetup(
                "BPO-ALFWorld-v0", {"max_episode_steps": 50, "split": "train"}, train_tasks=512, eval_tasks=134, workers=8,
                eval_split="valid_unseen",
            ),
            "webshop": EnvSetup("BPO-WebShop-v0", {"max_episode_steps": 15, "split": "train"}, train_tasks=2048, eval_tasks=500, eval_split="test"),
            "swebench": EnvSetup("BPO-SWEBench-v0", {"max_episode_steps": 50}, train_tasks=64, eval_tasks=16, workers=8),
        },
        policy="Qwen/Qwen2.5-7B-Instruct",
        budget_unit="gen_tokens",
        budget={"alfworld": 400_000, "webshop": 150_000, "swebench": 600_000},
        updates=150,
        # bpo-memory-plan --model qwen2.5-7b-instruct --gpus 1 --gpu-gb 141 --lora: ~36 GB with
        # 8k-token micro-batches and 64 decode rows; a full fine-tune needs ~142 GB (FSDP on 8 GPUs)
        learning_rate=1e-5,
        optimizer="adamw",
        max_grad_norm=1.0,
        temperature=1.0,
        lora=True,
        vllm=True,
        precision="bf16",
        micro_batch_tokens=8192,
        gradient_checkpointing=True,
        max_model_len=16384,
        pool_size=64,
        eval_episodes=1,
        grad_batches=4,
    ),
}


def preset_dict(preset: Preset) -> dict[str, Any]:
    """The preset as plain JSON data (for ``preset.json``, results and loggers)."""
    return json.loads(json.dumps(asdict(preset), default=str))
