"""Snapshottable Gymnasium environments for LLM-agent RL.

``import bpo_envs`` registers ``BPO-WebShop-v0``, ``BPO-ALFWorld-v0``, ``BPO-SWEBench-v0`` and
``BPO-TreeMDP-v0`` (``gym.make("bpo_envs:BPO-TreeMDP-v0")`` works too). Every env can
``snapshot()`` and ``restore()`` its full state mid-episode; :func:`snapshot` and
:func:`restore` see through wrappers; :func:`check_snapshot` checks the contract. What an env
can do beyond that it declares (:class:`EnvCapabilities`, read with :func:`declared`).
"""

from bpo_envs.capabilities import EnvCapabilities, declared, require_declared
from bpo_envs.core import (
    ConcurrentUseError,
    ResetNeeded,
    Snapshot,
    SnapshotEnv,
    SnapshotError,
    SnapshotKindError,
    SnapshotReleasedError,
    SnapshotSupport,
    check_step_limit,
    restore,
    snapshot,
)
from bpo_envs.registration import ENV_IDS, register_envs
from bpo_envs.replay import ReplayDivergenceError, ReplaySnapshot, replayed_steps
from bpo_envs.snapshot_check import SnapshotCheckError, SnapshotReport, check_snapshot
from bpo_envs.text import TEXT_CHARSET, to_observation
from bpo_envs.tree_mdp import TreeMDPEnv

register_envs()

__all__ = [
    "ConcurrentUseError",
    "ENV_IDS",
    "EnvCapabilities",
    "ReplayDivergenceError",
    "ReplaySnapshot",
    "ResetNeeded",
    "Snapshot",
    "SnapshotCheckError",
    "SnapshotEnv",
    "SnapshotError",
    "SnapshotKindError",
    "SnapshotReleasedError",
    "SnapshotReport",
    "SnapshotSupport",
    "check_step_limit",
    "TEXT_CHARSET",
    "TreeMDPEnv",
    "check_snapshot",
    "declared",
    "replayed_steps",
    "require_declared",
    "restore",
    "snapshot",
    "to_observation",
]
