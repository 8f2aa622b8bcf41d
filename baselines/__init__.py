"""Baselines that collect through the same engine and compute meter as BPO: GRPO and RLOO."""

from baselines.grpo import GRPO
from baselines.rloo import RLOO

__all__ = ["GRPO", "RLOO"]
