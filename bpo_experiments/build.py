"""A run's initial policy, built from its resolved settings: the policy and its warm start.

The settings are resolved from the preset by :mod:`bpo_experiments.run_config`
(:class:`~bpo_experiments.run_config.PolicySettings`); the algorithm is built there too
(:meth:`~bpo_experiments.run_config.AlgorithmSpec.build`).
"""

from __future__ import annotations

from typing import Any

import torch

from bpo_algos.policy import TabularPolicy
from bpo_experiments.presets import EnvSetup
from bpo_experiments.run_config import PolicySettings
from bpo_experiments.streams import WARM_START, stream_seed
from bpo_experiments.tasks import env_factory

SCORER_POLICIES: dict[str, tuple[str | None, int, int]] = {
    "scorer": (None, 32, 64),
    "scorer-memory": ("alfworld", 32, 64),
    "scorer-memory-wide": ("alfworld", 64, 256),
}
"""The text-scorer policies by name: ``(memory, dim, hidden)`` of
:class:`~bpo_algos.policy.scorer.TextScorerPolicy` (``-wide``: twice the embedding, four times the
hidden layer; docs/alfworld.md, "The learning curve")."""


def make_policy(settings: PolicySettings, setup: EnvSetup, seed: int, tasks: list[Any]) -> Any:
    """The initial policy of one (env, seed), made with ``settings`` (the env's resolved
    :class:`~bpo_experiments.run_config.PolicySettings`): the same object state for every algorithm.

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
    s = settings
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
        "prompt": PromptConfig(reasoning=s.reasoning, layout=s.prompt_layout),
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


def warm_start(policy: Any, settings: PolicySettings, setup: EnvSetup, tasks: list[Any], seed: int) -> Any:
    """Behaviour cloning on the env expert's trajectories of ``tasks`` (``sft_epochs``)."""
    if settings.sft_epochs:
        from bpo_algos.policy.sft import behaviour_cloning

        demos = _expert_demos(setup, tasks, seed)
        behaviour_cloning(policy, demos, epochs=settings.sft_epochs, lr=settings.sft_lr, seed=seed)
    return policy


_DEMOS: dict[str, Any] = {}


def _expert_demos(setup: EnvSetup, tasks: list[Any], seed: int) -> Any:
    """The expert's demos of ``tasks``, kept per process; an expert whose episodes do not
    depend on the reset seed (ALFWorld's: a task id fixes the game) gives every seed the same
    demos, so they are collected once, and kept on disk for every process and every later
    comparison (:mod:`bpo_experiments.demo_cache`)."""
    from bpo_algos.policy.sft import expert_demos
    from bpo_experiments.demo_cache import cached_expert_demos

    seedless = setup.env_id == "BPO-ALFWorld-v0"
    key = repr((setup.env_id, sorted(setup.kwargs.items()), tasks, None if seedless else seed))
    if key not in _DEMOS:
        _DEMOS.clear()  # one env's demos at a time
        if seedless and not setup.servers:
            _DEMOS[key] = cached_expert_demos(setup.env_id, setup.kwargs, env_factory(setup), tasks, seed, seedless=True)
        else:
            _DEMOS[key] = expert_demos(env_factory(setup), tasks, seed=seed)
    return _DEMOS[key]
