"""``RayEnvPool``: envs and their snapshots hosted by Ray actors, behind the engine's pool API.

``pip install 'bpo-gym[distributed]'`` (Ray). One machine without Ray stays the default; this
module is imported only by those who use it::

    import ray
    from bpo_algos import BPO
    from bpo_envs.ray_pool import RayEnvPool

    ray.init()  # or ray.init(address="auto") to join a cluster
    pool = RayEnvPool(lambda: gym.make("BPO-WebShop-v0"), actors=8, envs_per_actor=4)
    batch = BPO().collect(policy, pool, tasks)  # algorithms do not change

Layout: ``actors`` Ray actors each host envs (made in the actor from the factories, so a
factory must be picklable: a lambda or a module-level function). Env slot ``i`` lives on actor
``i % actors``. ``acquire()`` lends a :class:`RemoteEnv`, a local proxy with ``reset``,
``step``, ``snapshot`` and ``restore`` (so :func:`bpo_envs.snapshot` and
:func:`bpo_envs.restore` work on it) that forwards the hosted env's declarations (its step
limit, restore preference, expert, task ids, provenance and sampler; docs/envs.md). Its snapshots (:class:`RemoteSnapshot`) stay on the actor
that took them: the driver holds a handle. Restoring on the same actor moves no state;
restoring onto another actor moves the snapshot's ``portable()`` bytes actor to actor through
the Ray object store (never through the driver). ``step_many`` runs the steps of different
actors concurrently (an actor runs its own envs' steps in turn).

The pool keeps the local :class:`~bpo_envs.pool.EnvPool`'s slot bookkeeping (which slot
``acquire`` lends, ``prefer`` when it is free), so the engine's schedule, and with it the batch
for given seeds, is the same as with a local pool of as many envs. Placement follows from it:
the engine prefers to restore a sibling onto the env that took its snapshot, and an env
is bound to its actor.

Failures: an env error inside an actor reaches the engine as that error; a dead actor (killed,
out of memory, its node lost) as :class:`ray.exceptions.RayActorError`. The engine hands the env
back with ``release(env, failed=True)``: the pool remakes the env on its actor when the actor
is alive, and otherwise starts a new actor in its place (``max_actor_restarts`` times per
actor; after that its slots are retired). Snapshots held by a dead actor are gone: restoring
one raises :class:`~bpo_envs.core.SnapshotError`, and the engine rebuilds the path from an
older snapshot or the root by replay (see :mod:`bpo_algos.recovery`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from bpo_envs.capabilities import (
    EnvCapabilities,
    ForwardedCapabilities,
    declared,
    fixed_declarations,
)
from bpo_envs.core import (
    Snapshot,
    SnapshotError,
    SnapshotReleasedError,
    check_step_limit,
    decode_portable,
)
from bpo_envs.pool import DEFAULT_STEP_TIMEOUT_S, EnvPool, StepResult

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
except ImportError:  # pragma: no cover - depends on the install
    ray = None

EnvFn = Callable[[], gym.Env]


def _require_ray() -> None:
    if ray is None:
        raise ImportError(
            "bpo_envs.ray_pool needs Ray: pip install 'bpo-gym[distributed]' (or pip install 'ray>=2.9')"
        )


class EnvHost:
    """The actor body: envs by slot, and the snapshots taken on this process by id."""

    def __init__(self, fns: dict[int, EnvFn]) -> None:
        import bpo_envs  # noqa: F401 - registers the env ids in this worker process

        self._fns = fns
        self._envs: dict[int, gym.Env] = {}
        self._snaps: dict[int, Snapshot] = {}
        self._next = 0

    def _env(self, slot: int) -> gym.Env:
        env = self._envs.get(slot)
        if env is None:
            env = self._envs[slot] = self._fns[slot]()
            check_step_limit(env)
        return env

    def _snap(self, sid: int) -> Snapshot:
        snap = self._snaps.get(sid)
        if snap is None:
            raise SnapshotReleasedError(f"snapshot {sid} was released on this actor")
        return snap

    def ping(self) -> int:
        return os.getpid()

    def spaces(self, slot: int) -> tuple[gym.Space, gym.Space]:
        env = self._env(slot)
        return env.observation_space, env.action_space

    def _declared(self, slot: int) -> EnvCapabilities:
        """The hosted env's declarations; the defaults for an env that is not ours."""
        return declared(self._env(slot)) or _NOTHING_DECLARED

    def capabilities(self, slot: int) -> dict[str, Any]:
        """The hosted env's constant declarations, which its :class:`RemoteEnv` forwards."""
        return fixed_declarations(self._declared(slot))

    def task_ids(self, slot: int) -> list[Any] | None:
        ids = self._declared(slot).task_ids()
        return None if ids is None else list(ids)

    def expert_actions(self, slot: int) -> list[str]:
        return list(self._declared(slot).expert_actions())

    def provenance(self, slot: int) -> dict[str, Any] | None:
        return self._declared(slot).provenance()

    def sample_action(self, slot: int, rng: np.random.Generator) -> tuple[str | None, dict[str, Any]]:
        """The hosted env's ``sample_action`` with the caller's ``rng``, and that rng's state after."""
        return self._declared(slot).sample_action(rng), rng.bit_generator.state

    def reset(self, slot: int, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        return self._env(slot).reset(seed=seed, options=options)

    def step(self, slot: int, action: Any) -> StepResult:
        return self._env(slot).step(action)

    def snapshot(self, slot: int) -> tuple[int, Hashable]:
        import bpo_envs

        snap = bpo_envs.snapshot(self._env(slot))
        sid, self._next = self._next, self._next + 1
        self._snaps[sid] = snap
        return sid, snap.kind

    def restore(self, slot: int, sid: int) -> int:
        """Restore in place; returns the env steps the restore replayed."""
        import bpo_envs

        env = self._env(slot)
        before = bpo_envs.replayed_steps(env)
        bpo_envs.restore(env, self._snap(sid))
        return bpo_envs.replayed_steps(env) - before

    def restore_bytes(self, slot: int, blob: bytes) -> tuple[int, int]:
        """Restore from portable bytes; returns (bytes moved, env steps replayed)."""
        import bpo_envs

        env = self._env(slot)
        before = bpo_envs.replayed_steps(env)
        bpo_envs.restore(env, blob)
        return len(blob), bpo_envs.replayed_steps(env) - before

    def portable(self, sid: int) -> bytes:
        return self._snap(sid).portable()

    def release(self, sid: int) -> None:
        snap = self._snaps.pop(sid, None)
        if snap is not None:
            snap.release()

    def remake(self, slot: int) -> None:
        env = self._envs.pop(slot, None)
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - it failed already; a fresh one replaces it
                pass

    def stats(self) -> dict[str, Any]:
        import resource

        return {
            "pid": os.getpid(),
            "envs": len(self._envs),
            "snapshots": len(self._snaps),
            "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        }

    def close(self) -> None:
        for sid in list(self._snaps):
            self.release(sid)
        for slot in list(self._envs):
            self.remake(slot)


_NOTHING_DECLARED = EnvCapabilities()
"""The declarations of a hosted env that is not ours: the defaults."""


class _Host:
    """The driver's record of one actor (a restarted actor is a new ``_Host``)."""

    def __init__(self, actor: Any, index: int, generation: int) -> None:
        self.actor = actor
        self.index = index
        self.generation = generation
        self.alive = True


class RemoteSnapshot(Snapshot):
    """A handle on a snapshot held by an actor (see the module docstring)."""

    __slots__ = ("host", "sid")

    def __init__(self, env: RemoteEnv, kind: Hashable, host: _Host, sid: int) -> None:
        super().__init__(env, kind, sid)
        self.host = host
        self.sid = sid

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._state = None
        if self.host.alive and ray is not None and ray.is_initialized():
            self.host.actor.release.remote(self.sid)

    def portable(self) -> bytes:
        if self._released:
            raise SnapshotReleasedError("this snapshot was released; take a new one")
        if not self.host.alive:
            raise SnapshotError("the actor that held this snapshot is gone")
        return ray.get(self.host.actor.portable.remote(self.sid))

    def __repr__(self) -> str:
        status = "released" if self._released else "live"
        return f"RemoteSnapshot(actor={self.host.index}, id={self.sid}, {status})"


class RemoteEnv(ForwardedCapabilities):
    """A local proxy for env ``slot`` of a :class:`RayEnvPool` (lent by ``acquire``).

    It forwards the hosted env's declarations (docs/envs.md): the constant ones are fetched
    once, with the first ``reset`` (or the first read before it); the methods call the actor. ``step_may_block`` is the proxy's own: True, since every
    call waits on another process.
    """

    def __init__(self, pool: RayEnvPool, slot: int, host: _Host) -> None:
        self.pool = pool
        self.slot = slot
        self.host = host
        self._spaces: tuple[gym.Space, gym.Space] | None = None
        self._capabilities: dict[str, Any] | None = None
        self.replayed_steps = 0
        """Env steps replayed by this proxy's restores on its actor (read by the engine's meter)."""

    def _get(self, ref: Any) -> Any:
        return ray.get(ref, timeout=self.pool.timeout_s)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        reply = self.host.actor.reset.remote(self.slot, seed, options)
        if self._capabilities is None:
            # fetched with the first reset (the actor answers it right after), so that the engine,
            # reading a declaration of a lent env, never waits behind a step of the actor
            declarations = self.host.actor.capabilities.remote(self.slot)
            result = self._get(reply)
            self._capabilities = self._get(declarations)
            return result
        return self._get(reply)

    def step(self, action: Any) -> StepResult:
        return self._get(self.host.actor.step.remote(self.slot, action))

    def snapshot(self) -> RemoteSnapshot:
        sid, kind = self._get(self.host.actor.snapshot.remote(self.slot))
        return RemoteSnapshot(self, kind, self.host, sid)

    def restore(self, snapshot: Snapshot | bytes) -> None:
        """Restore on this actor: in place when the snapshot lives here, else by its bytes."""
        actor = self.host.actor
        if isinstance(snapshot, RemoteSnapshot):
            if snapshot.released:
                raise SnapshotReleasedError("this snapshot was released; take a new one")
            if snapshot.host is self.host:
                self.replayed_steps += self._get(actor.restore.remote(self.slot, snapshot.sid))
                self.pool.stats["local_restores"] += 1
                return
            if not snapshot.host.alive:
                raise SnapshotError("the actor that held this snapshot is gone")
            blob = snapshot.host.actor.portable.remote(snapshot.sid)  # moves actor to actor
        elif isinstance(snapshot, Snapshot):
            blob = snapshot.portable()
        elif isinstance(snapshot, bytes | bytearray | memoryview):
            decode_portable(snapshot)  # a clear error here rather than inside the actor
            blob = bytes(snapshot)
        else:
            raise TypeError(f"restore() takes a Snapshot or portable bytes, not {type(snapshot).__name__}")
        moved, replayed = self._get(actor.restore_bytes.remote(self.slot, blob))
        self.replayed_steps += replayed
        self.pool.stats["moved_restores"] += 1
        self.pool.stats["moved_bytes"] += moved

    # ---- the hosted env's declarations --------------------------------------------------
    def _declared(self) -> dict[str, Any]:
        if self._capabilities is None:
            self._capabilities = self._get(self.host.actor.capabilities.remote(self.slot))
        return self._capabilities

    def task_ids(self) -> list[Any] | None:
        return self._get(self.host.actor.task_ids.remote(self.slot))

    def expert_actions(self) -> list[str]:
        return self._get(self.host.actor.expert_actions.remote(self.slot))

    def provenance(self) -> dict[str, Any] | None:
        return self._get(self.host.actor.provenance.remote(self.slot))

    def sample_action(self, rng: np.random.Generator) -> str | None:
        action, state = self._get(self.host.actor.sample_action.remote(self.slot, rng))
        rng.bit_generator.state = state  # the draw advances the caller's rng, as a local env's would
        return action

    @property
    def observation_space(self) -> gym.Space:
        return self._fetch_spaces()[0]

    @property
    def action_space(self) -> gym.Space:
        return self._fetch_spaces()[1]

    def _fetch_spaces(self) -> tuple[gym.Space, gym.Space]:
        if self._spaces is None:
            self._spaces = self._get(self.host.actor.spaces.remote(self.slot))
        return self._spaces

    @property
    def unwrapped(self) -> RemoteEnv:
        return self

    def close(self) -> None:
        """Nothing to do: the pool owns the remote env (``RayEnvPool.close`` frees it)."""

    def __repr__(self) -> str:
        return f"RemoteEnv(slot={self.slot}, actor={self.host.index})"


class RayEnvPool(EnvPool):
    """A pool of Ray actors hosting envs and their snapshots (see the module docstring).

    Args:
        env_fns: one factory (every slot uses it) or one per slot.
        actors: number of actors; slot ``i`` lives on actor ``i % actors``.
        envs_per_actor: slots per actor when ``env_fns`` is a single factory.
        actor_options: passed to ``ray.remote`` (e.g. ``{"num_cpus": 1}``, custom resources).
        max_actor_restarts: new actors started in place of one that died (per actor).
        timeout_s: seconds to wait for any remote call (default
            :data:`bpo_envs.pool.DEFAULT_STEP_TIMEOUT_S`, an hour; None: no limit); a step that
            takes longer counts as a failure and its actor is killed and restarted.
        retries, max_failures: the engine's failure handling (see :mod:`bpo_algos.recovery`).
    """

    def __init__(
        self,
        env_fns: EnvFn | Sequence[EnvFn],
        *,
        actors: int = 2,
        envs_per_actor: int = 1,
        actor_options: dict[str, Any] | None = None,
        max_actor_restarts: int = 1,
        timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S,
        retries: int = 2,
        max_failures: int = 64,
    ) -> None:
        _require_ray()
        for name, value, low in (("actors", actors, 1), ("envs_per_actor", envs_per_actor, 1), ("max_actor_restarts", max_actor_restarts, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
        if callable(env_fns):
            fns = [env_fns] * (actors * envs_per_actor)
        else:
            fns = list(env_fns)
            if not fns or not all(callable(f) for f in fns):
                raise ValueError("env_fns must be a factory or a non-empty sequence of factories")
        actors = min(actors, len(fns))
        # steps go through this pool's own step_many, bounded by timeout_s on each ray.get
        super().__init__([self._proxy_factory(slot) for slot in range(len(fns))], retries=retries,
                         max_failures=max_failures, step_timeout_s=None)
        self.n_actors = actors
        self.timeout_s = timeout_s
        self.max_actor_restarts = max_actor_restarts
        self.stats: dict[str, int] = {
            "local_restores": 0,
            "moved_restores": 0,
            "moved_bytes": 0,
            "actor_restarts": 0,
            "retired_actors": 0,
        }
        self._env_fns = fns
        self._actor_cls = ray.remote(**(actor_options or {}))(EnvHost) if actor_options else ray.remote(EnvHost)
        self._restarts = [0] * actors
        self._closed = False
        if not ray.is_initialized():
            ray.init()
        self._hosts: list[_Host | None] = [self._start(i, 0) for i in range(actors)]

    # ---- actors --------------------------------------------------------------------------
    def _start(self, index: int, generation: int) -> _Host:
        fns = {slot: fn for slot, fn in enumerate(self._env_fns) if slot % self.n_actors == index}
        return _Host(self._actor_cls.remote(fns), index, generation)

    def _proxy_factory(self, slot: int) -> Callable[[], RemoteEnv]:
        def make() -> RemoteEnv:
            host = self._hosts[slot % self.n_actors]
            if host is None:
                raise SnapshotError(f"env slot {slot}: its actor was retired after repeated failures")
            return RemoteEnv(self, slot, host)

        return make

    def actor_of(self, env: RemoteEnv) -> int:
        return env.host.index

    def pids(self) -> list[int | None]:
        """The process id of each actor (None for a retired one)."""
        return [ray.get(h.actor.ping.remote()) if h is not None else None for h in self._hosts]

    def actor_stats(self) -> list[dict[str, Any] | None]:
        return [ray.get(h.actor.stats.remote()) if h is not None else None for h in self._hosts]

    def _is_alive(self, host: _Host) -> bool:
        if host.alive:
            try:
                ray.get(host.actor.ping.remote(), timeout=30)
            except (RayActorError, GetTimeoutError):
                host.alive = False
        return host.alive

    def _replace(self, host: _Host) -> None:
        """``host``'s actor is dead: start another in its place, or retire its slots."""
        host.alive = False
        if self._hosts[host.index] is not host:
            return  # replaced already
        try:
            ray.kill(host.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - it is gone already
            pass
        index = host.index
        lent = {slot for slot in range(len(self._fns)) if slot not in self._free}
        mine = [slot for slot in range(len(self._fns)) if slot % self.n_actors == index]
        if self._restarts[index] < self.max_actor_restarts:
            self._restarts[index] += 1
            self.stats["actor_restarts"] += 1
            self._hosts[index] = self._start(index, host.generation + 1)
            for slot in mine:
                if slot not in lent:  # free proxies point at the dead actor: make new ones
                    self._forget(slot)
        else:
            self._hosts[index] = None
            self.stats["retired_actors"] += 1
            for slot in mine:
                if slot not in lent:
                    self._free.remove(slot)
                    self._forget(slot)

    def _forget(self, slot: int) -> None:
        env = self._envs[slot]
        if env is not None:
            self._index.pop(id(env), None)
            self._envs[slot] = None

    # ---- pool API ------------------------------------------------------------------------
    def acquire(self, prefer: Any = None) -> RemoteEnv | None:
        if self._closed:
            raise RuntimeError("this RayEnvPool is closed")
        return super().acquire(prefer)

    def release(self, env: RemoteEnv, *, failed: bool = False) -> None:
        """Hand ``env`` back; ``failed=True`` remakes it, restarting its actor if it died."""
        slot = self._index[id(env)]
        if slot in self._free:
            raise RuntimeError("env released twice")
        if not failed:
            self._free.append(slot)
            return
        host = env.host
        if self._is_alive(host):
            host.actor.remake.remote(slot)  # runs before any later call from this driver
            self._free.append(slot)
            return
        self._replace(host)
        self._forget(slot)
        if self._hosts[host.index] is not None:
            self._free.append(slot)

    def step_many(self, envs: Sequence[RemoteEnv], actions: Sequence[str]) -> list[StepResult | Exception]:
        """Submit every step at once (actors run concurrently), then collect in input order."""
        refs = [env.host.actor.step.remote(env.slot, action) for env, action in zip(envs, actions, strict=True)]
        out: list[StepResult | Exception] = []
        for env, ref in zip(envs, refs, strict=True):
            try:
                out.append(ray.get(ref, timeout=self.timeout_s))
            except GetTimeoutError as exc:
                # the actor is stuck in this step: kill it so that release(failed=True) restarts it
                env.host.alive = False
                ray.kill(env.host.actor, no_restart=True)
                out.append(exc)
            except Exception as exc:  # noqa: BLE001 - the env's error or a dead actor, in place
                out.append(exc)
        return out

    def close(self) -> None:
        """Kill the actors (their envs and snapshots go with them)."""
        if self._closed:
            return
        self._closed = True
        for host in self._hosts:
            if host is not None and host.alive and ray.is_initialized():
                try:
                    ray.kill(host.actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
                host.alive = False
        self._envs = [None] * len(self._fns)
        self._index.clear()
        self._free = []

    def __enter__(self) -> RayEnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
