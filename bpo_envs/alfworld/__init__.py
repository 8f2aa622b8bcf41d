"""``BPO-ALFWorld-v0``: the real ALFWorld text engine, offline games for all six task types,
and millisecond snapshots (see :class:`ALFWorldEnv`)."""

from bpo_envs.alfworld.env import REWARD_SETTINGS, VERL_AGENT_REWARD, ALFWorldEnv, find_data
from bpo_envs.alfworld.generator import SPLITS, TASK_TYPES

__all__ = ["REWARD_SETTINGS", "SPLITS", "TASK_TYPES", "VERL_AGENT_REWARD", "ALFWorldEnv", "find_data"]
