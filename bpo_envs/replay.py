"""``ReplaySnapshot``: snapshots for any deterministic env by reset + replay.

A snapshot records how the episode was reset and the actions taken since, plus a digest of
everything the env returned along the way. ``restore`` resets with the same arguments, replays
the actions and checks the digest: an env that is not deterministic raises
:class:`ReplayDivergenceError` instead of silently landing in another state.

It is the fallback for envs without native snapshots and the baseline that native snapshots are
measured against: a restore costs one reset plus one step per recorded action. The wrapper
counts those steps (``replayed_steps``) and :func:`replayed_steps` reads the count through any
wrappers, so the rollout engine meters them as the env steps they are.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from bpo_envs.core import SnapshotError, SnapshotSupport, exclusive


class ReplayDivergenceError(SnapshotError):
    """Replaying the recorded actions did not reproduce the recorded outputs."""


@dataclass(frozen=True)
class ReplayState:
    """What a replay snapshot holds: enough to rebuild the state from scratch."""

    reset_kwargs: tuple[tuple[str, Any], ...]
    actions: tuple[str, ...]
    digest: str


def _digest_update(digest: hashlib._Hash, *items: Any) -> None:
    for item in items:
        digest.update(repr(item).encode("utf-8", errors="surrogatepass"))
        digest.update(b"\x1f")


class ReplaySnapshot(SnapshotSupport, gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Give a deterministic env ``snapshot()``/``restore()`` by reset + replay.

    ``reset(seed=None)`` draws an explicit seed from the wrapper's own generator and passes it
    down, so that every episode can be replayed.
    """

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        self._seed_rng = np.random.default_rng()
        self._reset_kwargs: tuple[tuple[str, Any], ...] | None = None
        self._actions: list[str] = []
        self._digest = hashlib.blake2b(digest_size=16)
        self.replayed_steps = 0
        """Env steps spent replaying, summed over restores (what native snapshots save)."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        with exclusive(self, "reset"):
            return self._reset(seed, options)

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        if seed is None:
            seed = int(self._seed_rng.integers(2**31 - 1))
        else:
            self._seed_rng = np.random.default_rng(seed)
        kwargs = (("seed", seed), ("options", dict(options) if options else None))
        obs, info = self.env.reset(seed=seed, options=options)
        self._reset_kwargs = kwargs
        self._actions = []
        self._digest = hashlib.blake2b(digest_size=16)
        _digest_update(self._digest, obs)
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        with exclusive(self, "step"):
            return self._step(action)

    def _step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._actions.append(action)
        _digest_update(self._digest, action, obs, reward, terminated, truncated)
        return obs, reward, terminated, truncated, info

    def _snapshot_kind(self) -> Any:
        spec = self.env.spec
        return ("ReplaySnapshot", spec.id if spec is not None else type(self.env.unwrapped).__qualname__)

    def _capture(self) -> ReplayState:
        if self._reset_kwargs is None:
            raise SnapshotError("call reset() before snapshot()")
        return ReplayState(self._reset_kwargs, tuple(self._actions), self._digest.hexdigest())

    def _portable_state(self, state: ReplayState) -> tuple[Any, ...]:
        return (state.reset_kwargs, state.actions, state.digest)

    def _from_portable(self, obj: Any) -> ReplayState:
        if not (isinstance(obj, tuple) and len(obj) == 3 and isinstance(obj[2], str)):
            raise SnapshotError("portable bytes: not a replay state")
        return ReplayState(tuple(obj[0]), tuple(obj[1]), obj[2])

    def _apply(self, state: ReplayState) -> None:
        kwargs = dict(state.reset_kwargs)
        obs, _ = self.env.reset(seed=kwargs["seed"], options=kwargs["options"])
        digest = hashlib.blake2b(digest_size=16)
        _digest_update(digest, obs)
        for action in state.actions:
            obs, reward, terminated, truncated, _ = self.env.step(action)
            _digest_update(digest, action, obs, reward, terminated, truncated)
        self.replayed_steps += len(state.actions)
        if digest.hexdigest() != state.digest:
            raise ReplayDivergenceError(
                f"replaying {len(state.actions)} action(s) after reset({kwargs}) did not "
                "reproduce the recorded observations: the wrapped env is not deterministic"
            )
        self._reset_kwargs = state.reset_kwargs
        self._actions = list(state.actions)
        self._digest = digest


def replayed_steps(env: Any) -> int:
    """Env steps replayed by restores so far in ``env``, summed over its wrapper layers.

    Every layer that keeps its own ``replayed_steps`` count (a :class:`ReplaySnapshot`, or a
    proxy such as :class:`bpo_envs.ray_pool.RemoteEnv` that reports its host's) adds it.
    Read from each layer's own attributes, so a count is never seen twice through a wrapper.
    """
    total = 0
    layer = env
    while layer is not None:
        total += int(vars(layer).get("replayed_steps", 0) or 0)
        layer = layer.env if isinstance(layer, gym.Wrapper) else None
    return total
