"""What an env declares it can do: :class:`EnvCapabilities`, the base every BPO env inherits.

The engine, the trainer and the tools read these declarations; they never probe an env for an
attribute (docs/envs.md, "What an env declares"). Every declaration has a default here, so a
user's env that subclasses :class:`~bpo_envs.core.SnapshotEnv` and overrides nothing declares
"may block, no restore preference, no expert, no provenance, no sampler of its own".

Proxies for an env elsewhere (:class:`bpo_envs.remote.RemoteEnv` over ``bpo-serve``,
:class:`bpo_envs.ray_pool.RemoteEnv` on a Ray actor) inherit this class too and forward each
declaration of the env they stand for. An env that is not one of ours (a third-party Gymnasium
env, for instance under :class:`~bpo_envs.ReplaySnapshot`) declares nothing: :func:`declared`
returns None for it, and :func:`require_declared` rejects it with a clear error where a
declaration is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np


class EnvCapabilities:
    """The declarations of an env (class attributes and methods with defaults).

    Subclasses override what they can do; readers call these and never ``getattr``/``hasattr``.
    """

    step_may_block: bool = True
    """Whether one ``step`` (or ``reset``/``snapshot``/``restore``) may block or hang: wait on a
    process, a container, the network or an unbounded search. True (the default) keeps the
    call on a worker thread under a deadline, where it can be abandoned; an env whose every call
    is bounded by construction declares False, and the rollout engine and ``bpo-serve`` then run
    it inline (a call run inline cannot be stopped by a deadline: declare False only where that
    can never be needed; docs/envs.md)."""

    restore_prefers_origin: bool = False
    """True where restoring into the env that took the snapshot is much cheaper than into
    another instance; the rollout engine then keeps forked siblings on their origin env."""

    has_expert: bool = False
    """True where :meth:`expert_actions` is implemented (a planner or a known solution)."""

    max_episode_steps: int | None = None
    """The env's own step limit (part of its snapshots; docs/envs.md). None: the env declares
    none. :class:`~bpo_envs.core.SnapshotEnv` always has one (its ``max_episode_steps=``)."""

    def task_ids(self) -> Sequence[Any] | None:
        """Every task this env can pose, in a fixed order; None (the default): no fixed task list
        (``reset`` then needs ``options={"task_id": ...}``)."""
        return None

    def expert_actions(self) -> list[str]:
        """Actions that solve the current task from the current state (where ``has_expert``)."""
        raise NotImplementedError(
            f"{type(self).__name__} declares no expert (has_expert = False): it has no expert_actions()"
        )

    def provenance(self) -> dict[str, Any] | None:
        """Which data, split and settings the env runs on (see :mod:`bpo_envs.provenance`);
        None (the default): the env has no data of its own to name."""
        return None

    def sample_action(self, rng: np.random.Generator) -> str | None:
        """A random action drawn with ``rng``, for an env whose ``info`` lists no
        ``admissible_actions``; None (the default): the env has no sampler of its own (tools
        then use the action space). Consumes ``rng`` only where it returns an action."""
        return None


def declared(env: Any) -> EnvCapabilities | None:
    """The declarations of ``env`` (its unwrapped env, seen through Gymnasium wrappers), or None
    for an env that is not one of ours and so declares nothing."""
    owner = env.unwrapped if isinstance(env, gym.Env) else env
    return owner if isinstance(owner, EnvCapabilities) else None


def require_declared(env: Any, needed_for: str) -> EnvCapabilities:
    """:func:`declared`, with a clear error for an env that declares nothing."""
    owner = declared(env)
    if owner is None:
        inner = env.unwrapped if isinstance(env, gym.Env) else env
        raise TypeError(
            f"{needed_for} needs a bpo_envs env (a subclass of bpo_envs.SnapshotEnv, which declares its "
            f"task ids, step limit, expert, ...), not {type(inner).__qualname__} (docs/envs.md, "
            "'What an env declares')"
        )
    return owner


def fixed_declarations(env: EnvCapabilities) -> dict[str, Any]:
    """The declarations of ``env`` that never change while it lives, as the JSON-safe dict a
    host (a Ray actor, a ``bpo-serve`` session) sends once to the :class:`ForwardedCapabilities`
    proxy standing for it."""
    return {
        "max_episode_steps": env.max_episode_steps,
        "restore_prefers_origin": env.restore_prefers_origin,
        "has_expert": env.has_expert,
    }


class ForwardedCapabilities(EnvCapabilities):
    """The fixed declarations of an env hosted elsewhere, read from what its host sent
    (:func:`fixed_declarations`): a proxy implements :meth:`_declared` (fetched once, cached)."""

    def _declared(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def max_episode_steps(self) -> int | None:  # type: ignore[override]
        return self._declared()["max_episode_steps"]

    @property
    def restore_prefers_origin(self) -> bool:  # type: ignore[override]
        return self._declared()["restore_prefers_origin"]

    @property
    def has_expert(self) -> bool:  # type: ignore[override]
        return self._declared()["has_expert"]


__all__ = ["EnvCapabilities", "ForwardedCapabilities", "declared", "fixed_declarations", "require_declared"]
