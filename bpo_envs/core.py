"""The snapshot contract: :class:`Snapshot`, the snapshottable env base and wrapper-aware helpers.

Contract (docs/snapshots.md): after ``env.restore(s)``, any action sequence yields exactly the
observations, rewards, flags and ``info`` that the env produced (or would produce) from the
moment ``s`` was taken. A snapshot stays valid across later steps, other restores and resets,
until :meth:`Snapshot.release` (or garbage collection). :meth:`Snapshot.portable` gives bytes
that another process holding an env of the same kind can restore from.

Snapshots are restorable into *any* instance of the same env kind (same class and config) in
the process, not only the one that took them: the rollout engine forks siblings onto whichever
env of its pool is free.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
import numpy as np

from bpo_envs import portable as _portable
from bpo_envs.capabilities import EnvCapabilities, declared
from bpo_envs.text import ACTION_MAX_LENGTH, OBSERVATION_MAX_LENGTH, text_space, to_observation

PORTABLE_FORMAT = "bpo-snapshot/1"


class SnapshotError(RuntimeError):
    """A snapshot cannot be taken or restored."""


class SnapshotReleasedError(SnapshotError):
    """The snapshot was released and its state freed."""


class SnapshotKindError(SnapshotError):
    """The snapshot was taken from an env of another kind (class or configuration)."""


class ResetNeeded(RuntimeError):
    """``step()`` was called before ``reset()`` or after the episode ended."""


class ConcurrentUseError(RuntimeError):
    """A second thread called into an env while another thread's call was still running in it.

    An env is one sandbox with one state: two threads stepping it interleave their effects (and
    a backend's clean-up after one command can hit the other's processes). Give each thread an
    env of its own (an env pool lends one env to one caller at a time)."""


_IN_USE: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_IN_USE_GUARD = threading.Lock()


def enter(env: Any, what: str) -> threading.RLock:
    """Make the calling thread the only one inside ``env`` for a call named ``what``; returns
    the lock to release when the call ends. Raises :class:`ConcurrentUseError` at once when
    another thread is inside ``env`` (the same thread may re-enter, e.g. a restore that resets)."""
    lock = _IN_USE.get(env)
    if lock is None:
        with _IN_USE_GUARD:
            lock = _IN_USE.setdefault(env, threading.RLock())
    if not lock.acquire(blocking=False):
        raise ConcurrentUseError(
            f"{what}() called on {type(env).__name__} from thread {threading.current_thread().name!r} while "
            "another thread is inside it: one env serves one thread at a time (give each thread its own env)"
        )
    return lock


@contextmanager
def exclusive(env: Any, what: str) -> Iterator[None]:
    """:func:`enter` as a ``with`` block."""
    lock = enter(env, what)
    try:
        yield
    finally:
        lock.release()


class Snapshot:
    """A handle on one saved env state.

    ``state`` is backend-specific and opaque to callers. ``kind`` names the env class and
    configuration the state belongs to. The snapshot keeps only a weak reference to the env that
    took it (its *origin*), used for :meth:`portable` and by the engine to prefer restoring onto
    the env that already holds the state.
    """

    __slots__ = ("_state", "_kind", "_owner", "_released", "wrapper_states", "__weakref__")

    def __init__(self, owner: SnapshotSupport, kind: Hashable, state: Any) -> None:
        self._owner = weakref.ref(owner)
        self._kind = kind
        self._state = state
        self._released = False
        self.wrapper_states: tuple[tuple[str, dict[str, Any]], ...] = ()
        """States of stateful Gymnasium wrappers above the env (see :func:`snapshot`)."""

    @property
    def kind(self) -> Hashable:
        return self._kind

    @property
    def state(self) -> Any:
        if self._released:
            raise SnapshotReleasedError("this snapshot was released; take a new one")
        return self._state

    @property
    def origin(self) -> SnapshotSupport | None:
        """The env that took this snapshot, while it is alive."""
        return self._owner()

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Free the state now (idempotent). Restoring a released snapshot raises."""
        if self._released:
            return
        owner = self._owner()
        if owner is not None:
            owner._release_state(self._state)
        self._released = True
        self._state = None

    def portable(self) -> bytes:
        """Bytes that ``restore`` accepts in another process: plain data in the format of
        :mod:`bpo_envs.portable`, whose decoding never runs code (docs/snapshots.md#trust)."""
        owner = self._owner()
        if owner is None:
            raise SnapshotError("the env that took this snapshot is gone; portable() needs it")
        payload = {
            "kind": repr(self._kind),
            "state": owner._portable_state(self.state),
            "wrappers": self.wrapper_states,
        }
        try:
            return _portable.dumps(PORTABLE_FORMAT, payload)
        except _portable.PortableFormatError as exc:
            raise SnapshotError(f"portable(): {exc}") from None

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        status = "released" if self._released else "live"
        return f"Snapshot(kind={self._kind!r}, {status})"


def decode_portable(
    blob: bytes | bytearray | memoryview,
    format: str = PORTABLE_FORMAT,
    what: str = "a portable snapshot",
    fields: dict[str, type | tuple[type, ...]] | None = None,
) -> dict[str, Any]:
    """The payload of :mod:`bpo_envs.portable` bytes tagged ``format`` (by default
    ``Snapshot.portable()`` bytes, whose fields are checked), each of ``fields`` present with
    its type. Raises ``SnapshotError`` naming ``what`` on anything else; never runs code."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise SnapshotError(f"{what} must be bytes, not {type(blob).__name__}")
    try:
        payload = _portable.loads(blob, format, what)
    except _portable.PortableFormatError as exc:
        raise SnapshotError(str(exc)) from None
    if fields is None and format == PORTABLE_FORMAT:
        fields = {"kind": str, "state": object, "wrappers": tuple}
    for name, kind in (fields or {}).items():
        if name not in payload:
            raise SnapshotError(f"{what}: field {name!r} is missing")
        if not isinstance(payload[name], kind):
            raise SnapshotError(f"{what}: field {name!r} is a {type(payload[name]).__name__}")
    return payload


class SnapshotSupport:
    """Mixin with the ``snapshot()`` / ``restore()`` plumbing; subclasses supply the state.

    Subclasses implement ``_capture() -> state`` and ``_apply(state)``, and may override
    ``_snapshot_kind``, ``_portable_state``/``_from_portable`` (when the native state is not
    picklable) and ``_release_state`` (to free backend resources).
    """

    def _snapshot_kind(self) -> Hashable:
        return type(self).__qualname__

    def _capture(self) -> Any:
        raise NotImplementedError

    def _apply(self, state: Any) -> None:
        raise NotImplementedError

    def _portable_state(self, state: Any) -> Any:
        return state

    def _from_portable(self, obj: Any) -> Any:
        return obj

    def _release_state(self, state: Any) -> None:
        return None

    def _portable_wrapper_states(self, blob: bytes | bytearray | memoryview) -> tuple[tuple[str, dict[str, Any]], ...]:
        """The wrapper states inside ``portable()`` bytes (overridden with the bytes' format)."""
        return decode_portable(blob).get("wrappers", ())

    def snapshot(self) -> Snapshot:
        """Save the full current state (see the module docstring for the contract)."""
        with exclusive(self, "snapshot"):
            return Snapshot(self, self._snapshot_kind(), self._capture())

    def restore(self, snapshot: Snapshot | bytes) -> None:
        """Return to the state saved in ``snapshot`` (a :class:`Snapshot` or ``portable()`` bytes)."""
        with exclusive(self, "restore"):
            self._restore(snapshot)

    def _restore(self, snapshot: Snapshot | bytes) -> None:
        if isinstance(snapshot, (bytes, bytearray, memoryview)):
            payload = decode_portable(snapshot)
            self._check_kind_text(payload["kind"])
            self._apply(self._from_portable(payload["state"]))
            return
        if not isinstance(snapshot, Snapshot):
            raise TypeError(
                f"restore() takes a Snapshot or portable bytes, not {type(snapshot).__name__}"
            )
        self._check_kind(snapshot.kind)
        self._apply(snapshot.state)

    def _check_kind_text(self, kind: str) -> None:
        if kind != repr(self._snapshot_kind()):
            raise SnapshotKindError(f"snapshot of kind {kind} cannot be restored into {self._snapshot_kind()!r}")

    def _check_kind(self, kind: Hashable) -> None:
        if kind != self._snapshot_kind():
            raise SnapshotKindError(
                f"snapshot of kind {kind!r} cannot be restored into {self._snapshot_kind()!r}"
            )


class SnapshotEnv(SnapshotSupport, EnvCapabilities, gym.Env[str, str]):
    """Base class of every BPO env: text in, text out, task selection, step limit, snapshots.

    Subclasses implement the task logic:

    * ``task_ids() -> Sequence`` — every task this env can pose, in a fixed order (the default,
      None, declares no fixed list: ``reset`` then needs ``options={"task_id": ...}``).
    * ``_reset_task(task_id) -> (obs, info)`` — start the episode of that task.
    * ``_step(action) -> (obs, reward, terminated, info)`` — one agent step; set
      ``info["invalid_action"] = True`` (and say why in ``obs``) for an action it cannot run,
      ``info["won"]`` when the task is solved, ``info["admissible_actions"]`` where known.
    * ``_get_state()`` / ``_set_state(state)`` — the task state (copied, never aliased).

    and declare what else they can do (:class:`~bpo_envs.capabilities.EnvCapabilities`, each with
    a default; docs/envs.md, "What an env declares"): ``step_may_block``,
    ``restore_prefers_origin``, ``has_expert`` with ``expert_actions()``, ``provenance()``,
    ``sample_action(rng)``. ``max_episode_steps`` is the constructor's.

    The base owns ``task_id``, the step counter and step limit, the done flag, the last
    observation and the env's ``np_random`` state, and puts all of them in every snapshot.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    max_episode_steps: int

    def __init__(
        self,
        *,
        max_episode_steps: int,
        render_mode: str | None = None,
        observation_max_length: int = OBSERVATION_MAX_LENGTH,
        action_max_length: int = ACTION_MAX_LENGTH,
    ) -> None:
        super().__init__()
        if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int | np.integer):
            raise ValueError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.max_episode_steps = int(max_episode_steps)
        self.render_mode = render_mode
        self.observation_max_length = observation_max_length
        self.observation_space = text_space(observation_max_length)
        self.action_space = text_space(action_max_length)
        self._task_id: Any = None
        self._elapsed_steps = 0
        self._done = True
        self._started = False
        self._last_obs = ""

    # ---- to implement --------------------------------------------------------------------
    def _reset_task(self, task_id: Any) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        raise NotImplementedError

    def _get_state(self) -> Any:
        raise NotImplementedError

    def _set_state(self, state: Any) -> None:
        raise NotImplementedError

    # ---- public API ----------------------------------------------------------------------
    @property
    def task_id(self) -> Any:
        return self._task_id

    @property
    def elapsed_steps(self) -> int:
        return self._elapsed_steps

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode: ``options={"task_id": t}`` picks the task, else ``seed`` does."""
        with exclusive(self, "reset"):
            return self._reset(seed, options)

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        unknown = set(options) - {"task_id"}
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}; supported: ['task_id']")
        if "task_id" in options:
            task_id = self._resolve_task(options["task_id"])
        else:
            ids = self.task_ids()
            if ids is None:
                raise ValueError(
                    f"{type(self).__name__} declares no fixed task list (task_ids() is None): "
                    "pass options={'task_id': ...} to reset"
                )
            if not ids:
                raise ValueError(f"{type(self).__name__} has no tasks")
            task_id = ids[int(self.np_random.integers(len(ids)))]
        obs, info = self._reset_task(task_id)
        self._task_id = task_id
        self._elapsed_steps = 0
        self._done = False
        self._started = True
        self._last_obs = to_observation(obs, self.observation_max_length)
        return self._last_obs, self._finish_info(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        lock = enter(self, "step")  # not a with-block: the step is the hot path
        try:
            return self._guarded_step(action)
        finally:
            lock.release()

    def _guarded_step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._started:
            raise ResetNeeded("call reset() before step()")
        if self._done:
            raise ResetNeeded("the episode has ended; call reset() (or restore a snapshot)")
        if isinstance(action, (bytes, bytearray)):
            action = bytes(action).decode("utf-8", errors="replace")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        obs, reward, terminated, info = self._step(action)
        self._elapsed_steps += 1
        terminated = bool(terminated)
        truncated = (not terminated) and self._elapsed_steps >= self.max_episode_steps
        self._done = terminated or truncated
        self._last_obs = to_observation(obs, self.observation_max_length)
        return self._last_obs, float(reward), terminated, truncated, self._finish_info(info)

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_obs
        return None

    # ---- snapshot plumbing ---------------------------------------------------------------
    def _capture(self) -> Any:
        if not self._started:
            raise SnapshotError("call reset() before snapshot()")
        return (
            self._task_id,
            self._elapsed_steps,
            self._done,
            self._last_obs,
            self.np_random.bit_generator.state,
            self._get_state(),
        )

    def _apply(self, state: Any) -> None:
        task_id, elapsed, done, last_obs, rng_state, inner = state
        self._set_state(inner)
        self._task_id = task_id
        self._elapsed_steps = elapsed
        self._done = done
        self._last_obs = last_obs
        self.np_random.bit_generator.state = rng_state
        self._started = True

    def _portable_state(self, state: Any) -> Any:
        *base, inner = state
        return (*base, self._portable_task_state(inner))

    def _from_portable(self, obj: Any) -> Any:
        if not (isinstance(obj, tuple) and len(obj) == 6):
            raise SnapshotError("portable bytes: the env state is not a 6-tuple")
        *base, inner = obj
        _, elapsed, done, last_obs, rng_state, _ = obj
        if isinstance(elapsed, bool) or not isinstance(elapsed, int) or not isinstance(done, bool) \
                or not isinstance(last_obs, str) or not isinstance(rng_state, dict):
            raise SnapshotError("portable bytes: the env state's step count, flags or observation have the wrong types")
        return (*base, self._task_state_from_portable(inner))

    def _release_state(self, state: Any) -> None:
        if state is not None:
            self._release_task_state(state[-1])

    def _portable_task_state(self, inner: Any) -> Any:
        return inner

    def _task_state_from_portable(self, obj: Any) -> Any:
        return obj

    def _release_task_state(self, inner: Any) -> None:
        return None

    # ---- helpers -------------------------------------------------------------------------
    def _resolve_task(self, task_id: Any) -> Any:
        ids = self.task_ids()
        if ids is None:  # no fixed list: the env's _reset_task judges the id
            return task_id
        if task_id in ids:
            return task_id
        # accept the string form of a non-string id (CLI users type "3")
        for candidate in ids:
            if str(candidate) == str(task_id):
                return candidate
        preview = ", ".join(map(repr, list(ids)[:5]))
        raise ValueError(
            f"unknown task_id {task_id!r} for {type(self).__name__} "
            f"({len(ids)} tasks, e.g. {preview})"
        )

    def _finish_info(self, info: dict[str, Any]) -> dict[str, Any]:
        info = dict(info)
        info["task_id"] = self._task_id
        info["won"] = bool(info.get("won", False))
        return info


# Stateful Gymnasium wrappers whose state bpo_envs.snapshot/restore carry along. TimeLimit
# matters most: ``gym.make(id, max_episode_steps=N)`` consumes N and adds a TimeLimit, whose
# step counter must come back with the env's state.
_WRAPPER_ATTRS: dict[type, tuple[str, ...]] = {
    gym.wrappers.TimeLimit: ("_elapsed_steps",),
    gym.wrappers.OrderEnforcing: ("_has_reset",),
    gym.wrappers.RecordEpisodeStatistics: ("episode_returns", "episode_lengths", "episode_start_time"),
}


def _layers(env: gym.Env) -> tuple[list[Any], SnapshotSupport]:
    """The wrappers above the first snapshot-capable layer, and that layer."""
    layers: list[Any] = []
    current: Any = env
    while True:
        if isinstance(current, SnapshotSupport):
            return layers, current
        # a user's layer (often a gym.Wrapper) with its own snapshot()/restore(): the documented
        # protocol (docs/snapshots.md), so these two are read from a class that is not ours
        inner = getattr(type(current), "snapshot", None)  # third-party: a user's layer, see above
        if callable(inner) and callable(getattr(type(current), "restore", None)):  # third-party: as above
            return layers, current
        if isinstance(current, gym.Wrapper):
            layers.append(current)
            current = current.env
            continue
        raise TypeError(
            f"{type(env).__name__} has no snapshot support; wrap the env in "
            "bpo_envs.ReplaySnapshot to snapshot by reset + replay"
        )


def check_step_limit(env: gym.Env) -> None:
    """Raise when a ``TimeLimit`` above ``env``'s own layer allows more steps than the env does.

    ``gym.make(id, max_episode_steps=N)`` keeps ``N`` for Gymnasium's ``TimeLimit`` wrapper and
    does not pass it to the env, whose own limit (its default) then truncates first when it is
    lower: the episode would silently end before the ``N`` steps asked for. A lower ``N`` works
    (the wrapper truncates first) and passes.
    """
    current: Any = env
    limits: list[int] = []
    while isinstance(current, gym.Wrapper):
        if isinstance(current, gym.wrappers.TimeLimit):
            limits.append(int(current._max_episode_steps))
        current = current.env
    if not limits:
        return  # no TimeLimit above: the env's own limit is the only one (and no proxy is asked)
    owner = declared(current)
    own = owner.max_episode_steps if owner is not None else None
    if isinstance(own, int) and min(limits) > own:
        spec = current.spec if isinstance(current, gym.Env) else None
        name = spec.id if spec is not None else type(current).__name__
        raise ValueError(
            f"max_episode_steps={min(limits)} was asked for, but {name} truncates at its own limit, "
            f"{own} steps: gym.make keeps max_episode_steps for Gymnasium's TimeLimit wrapper and "
            f"does not pass it to the env. Ask for at most {own} steps, or make the env with a "
            f"higher limit of its own: {type(current).__name__}(max_episode_steps={min(limits)}, ...)"
        )


def _snapshot_owner(env: gym.Env) -> SnapshotSupport:
    return _layers(env)[1]


def _capture_wrappers(layers: list[Any]) -> tuple[tuple[str, dict[str, Any]], ...]:
    out = []
    for layer in layers:
        attrs = _WRAPPER_ATTRS.get(type(layer))
        if attrs:
            out.append((type(layer).__qualname__, {a: copy.deepcopy(getattr(layer, a)) for a in attrs}))
    return tuple(out)


def _apply_wrappers(layers: list[Any], owner: Any, states: tuple[tuple[str, dict[str, Any]], ...]) -> None:
    pending: dict[str, list[dict[str, Any]]] = {}
    for name, state in states:
        pending.setdefault(name, []).append(state)
    for layer in layers:
        if type(layer) not in _WRAPPER_ATTRS:
            continue
        saved = pending.get(type(layer).__qualname__)
        if saved:
            for attr, value in saved.pop(0).items():
                if attr in _WRAPPER_ATTRS[type(layer)]:  # never another attribute (bytes may come from elsewhere)
                    setattr(layer, attr, copy.deepcopy(value))
        elif isinstance(layer, gym.wrappers.TimeLimit) and isinstance(owner, SnapshotEnv):
            layer._elapsed_steps = owner.elapsed_steps  # a snapshot taken below this wrapper
        elif isinstance(layer, gym.wrappers.OrderEnforcing):
            layer._has_reset = True


def snapshot(env: gym.Env) -> Snapshot:
    """Snapshot ``env``, seeing through Gymnasium wrappers to the first layer that supports it.

    The state of Gymnasium's stateful wrappers above that layer (``TimeLimit``'s step counter,
    ``OrderEnforcing``, ``RecordEpisodeStatistics``) travels with the snapshot; other wrappers
    with state of their own are not captured.
    """
    layers, owner = _layers(env)
    snap = owner.snapshot()
    snap.wrapper_states = _capture_wrappers(layers)
    return snap


def restore(env: gym.Env, snap: Snapshot | bytes) -> None:
    """Restore ``snap`` into ``env``, seeing through wrappers (see :func:`snapshot`)."""
    layers, owner = _layers(env)
    owner.restore(snap)
    if isinstance(snap, Snapshot):
        states = snap.wrapper_states
    else:
        states = owner._portable_wrapper_states(snap)
    _apply_wrappers(layers, owner, states)
