"""Policies: the base class, the choice policies (tabular, text scorer), and (with the ``hf``/``vllm`` extras) LLM policies.

``HFPolicy`` and ``VLLMPolicy`` are imported on first access, so ``import bpo_algos`` does not
import ``transformers`` (or ``vllm``).
"""

from typing import Any

from bpo_algos.policy.base import (
    Action,
    Context,
    Policy,
    Turn,
    action_mask,
    pad_token_rows,
)
from bpo_algos.policy.choice import ChoicePolicy
from bpo_algos.policy.scorer import TextScorerPolicy
from bpo_algos.policy.tabular import TabularPolicy
from bpo_envs.prompting import PromptConfig

_LAZY = {
    "HFPolicy": "bpo_algos.policy.hf",
    "VLLMPolicy": "bpo_algos.policy.vllm_policy",
}

__all__ = [
    "Action",
    "ChoicePolicy",
    "Context",
    "HFPolicy",
    "Policy",
    "PromptConfig",
    "TabularPolicy",
    "TextScorerPolicy",
    "Turn",
    "VLLMPolicy",
    "action_mask",
    "pad_token_rows",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
