"""Baselines that collect through the same engine and compute meter as BPO: GRPO, RLOO, GiGPO
and Tree-GRPO."""

from baselines.gigpo import GiGPO
from baselines.grpo import GRPO
from baselines.rloo import RLOO
from baselines.tree_grpo import TreeGRPO

__all__ = ["GRPO", "RLOO", "GiGPO", "TreeGRPO"]
