"""Policies: the protocol, the tabular policy, and (with the ``hf``/``vllm`` extras) LLM policies."""

from bpo_algos.policy.base import (
    Action,
    Context,
    Policy,
    PolicyBase,
    Turn,
    action_mask,
    pad_token_rows,
)
from bpo_algos.policy.tabular import TabularPolicy

__all__ = ["Action", "Context", "Policy", "PolicyBase", "TabularPolicy", "Turn", "action_mask", "pad_token_rows"]
