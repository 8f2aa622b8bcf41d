"""``BPO-ALFWorld-v0``: the real ALFWorld text engine, offline games for all six task types,
and millisecond snapshots (see :class:`ALFWorldEnv`)."""

from bpo_envs.alfworld.env import ALFWorldEnv
from bpo_envs.alfworld.generator import SPLITS, TASK_TYPES

__all__ = ["ALFWorldEnv", "SPLITS", "TASK_TYPES"]
