"""``check_snapshot``: the public checker of the snapshot contract.

It walks an env with random admissible actions, snapshots before every step, then for each
snapshot (in random order): restores it, takes a random detour, restores again and replays the
original actions, comparing every observation, reward, flag and ``info`` with what the walk
recorded; replays the detour and compares it with itself; restores after an unrelated reset;
restores ``portable()`` bytes, and restores into a fresh env of the same spec (another process
in miniature); and checks that a released snapshot refuses to restore.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from bpo_envs.capabilities import declared
from bpo_envs.core import SnapshotReleasedError, _snapshot_owner, restore, snapshot
from bpo_envs.seeding import key_seed

Transition = tuple[Any, float, bool, bool, dict[str, Any]]
ActionChooser = Callable[[str, dict[str, Any], np.random.Generator], str]

INVALID_PROBE = "this is not an action #%&"


class SnapshotCheckError(AssertionError):
    """The env broke the snapshot contract; the message says where."""


@dataclass
class SnapshotReport:
    """What ``check_snapshot`` exercised."""

    walk_steps: int = 0
    snapshots: int = 0
    restores: int = 0
    compared_transitions: int = 0
    portable_checked: bool = False
    fresh_env_checked: bool = False
    episode_ended: bool = False
    notes: list[str] = field(default_factory=list)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values are unequal
        return False


def _diff(expected: Transition, got: Transition) -> str:
    names = ("observation", "reward", "terminated", "truncated", "info")
    for name, x, y in zip(names, expected, got, strict=True):
        if not _equal(x, y):
            if name == "info" and isinstance(x, dict) and isinstance(y, dict):
                keys = sorted(k for k in set(x) | set(y) if not _equal(x.get(k), y.get(k)))
                return f"info differs at key(s) {keys}: expected {[x.get(k) for k in keys]!r:.300}, got {[y.get(k) for k in keys]!r:.300}"
            return f"{name} differs: expected {x!r:.300}, got {y!r:.300}"
    return ""


def _default_chooser(env: gym.Env) -> ActionChooser:
    owner = declared(env)  # None for an env that is not ours: it is walked by its action space

    def choose(obs: str, info: dict[str, Any], rng: np.random.Generator) -> str:
        admissible = info.get("admissible_actions")
        if rng.random() < 0.1:
            return INVALID_PROBE
        if admissible:
            return str(admissible[int(rng.integers(len(admissible)))])
        sampled = owner.sample_action(rng) if owner is not None else None
        return sampled if sampled is not None else env.action_space.sample()

    return choose


def _fresh_copy(env: gym.Env) -> gym.Env | None:
    """A new env of the same kind (made from ``env.spec``), or None when it cannot be made."""
    if env.spec is None:
        return None
    try:
        other = gym.make(env.spec)
    except Exception:  # noqa: BLE001 - a spec that cannot be remade just skips this check
        return None
    if type(_snapshot_owner(other)) is not type(_snapshot_owner(env)):
        other.close()
        return None
    return other


def _run(env: gym.Env, actions: Sequence[str]) -> list[Transition]:
    out: list[Transition] = []
    for action in actions:
        result = env.step(action)
        out.append(result)
        if result[2] or result[3]:
            break
    return out


def _compare(
    expected: list[Transition], got: list[Transition], where: str, report: SnapshotReport
) -> None:
    if len(expected) != len(got):
        raise SnapshotCheckError(
            f"{where}: episode length differs (expected {len(expected)} steps, got {len(got)})"
        )
    for t, (x, y) in enumerate(zip(expected, got, strict=True)):
        msg = _diff(x, y)
        if msg:
            raise SnapshotCheckError(f"{where}, step {t}: {msg}")
        report.compared_transitions += 1


def check_snapshot(
    env: gym.Env,
    seed: int = 0,
    steps: int = 20,
    *,
    detour: int = 3,
    options: dict[str, Any] | None = None,
    choose_action: ActionChooser | None = None,
    fresh_env: bool = True,
) -> SnapshotReport:
    """Check the snapshot contract on ``env`` (wrapped or not); raise on the first violation.

    Args:
        env: the env; ``bpo_envs.snapshot``/``restore`` are used, so wrappers are fine.
        seed: seeds the reset and every random choice of the checker.
        steps: length of the random walk (it stops early when the episode ends).
        detour: length of the random detour taken from each snapshot before replaying.
        options: reset options (e.g. ``{"task_id": ...}``).
        choose_action: ``f(obs, info, rng) -> action``; default: a random admissible action
            (or ``env.unwrapped.sample_action(rng)``, or the action space), and 10% of the time
            an invalid one.
        fresh_env: also restore into a new env made from ``env.spec`` (when it has one).

    Returns:
        A :class:`SnapshotReport` of what was exercised.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    rng = np.random.default_rng(seed)
    choose = choose_action or _default_chooser(env)
    report = SnapshotReport()

    obs, info = env.reset(seed=seed, options=options)
    snaps = []
    actions: list[str] = []
    record: list[Transition] = []
    infos = [info]
    observations = [obs]
    for _ in range(steps):
        snaps.append(snapshot(env))
        action = choose(observations[-1], infos[-1], rng)
        result = env.step(action)
        actions.append(action)
        record.append(result)
        observations.append(result[0])
        infos.append(result[4])
        if result[2] or result[3]:
            report.episode_ended = True
            break
    report.walk_steps = len(actions)
    report.snapshots = len(snaps)

    detours: dict[int, tuple[list[str], list[Transition]]] = {}
    for i in rng.permutation(len(snaps)):
        i = int(i)
        restore(env, snaps[i])
        detour_actions: list[str] = []
        detour_record: list[Transition] = []
        o, inf = observations[i], infos[i]
        for _ in range(detour):
            a = choose(o, inf, rng)
            result = env.step(a)
            detour_actions.append(a)
            detour_record.append(result)
            o, inf = result[0], result[4]
            if result[2] or result[3]:
                break
        detours[i] = (detour_actions, detour_record)
        restore(env, snaps[i])
        _compare(record[i:], _run(env, actions[i:]), f"replay from snapshot {i} after a detour", report)
        restore(env, snaps[i])
        _compare(detour_record, _run(env, detour_actions), f"detour from snapshot {i} replayed", report)
        report.restores += 3

    mid = len(snaps) // 2
    env.reset(seed=key_seed(seed, 1), options=options)
    restore(env, snaps[mid])
    _compare(record[mid:], _run(env, actions[mid:]), f"snapshot {mid} restored after a reset", report)
    report.restores += 1

    try:
        blob = snaps[mid].portable()
    except NotImplementedError:
        report.notes.append("portable() not implemented")
        blob = None
    if blob is not None:
        env.reset(seed=key_seed(seed, 2), options=options)
        restore(env, blob)
        _compare(record[mid:], _run(env, actions[mid:]), f"portable snapshot {mid}", report)
        report.portable_checked = True
        report.restores += 1

    other = _fresh_copy(env) if fresh_env else None
    if other is not None:
        try:
            restore(other, snaps[0])
            _compare(record, _run(other, actions), "snapshot 0 restored into a fresh env", report)
            if blob is not None:
                restore(other, blob)
                _compare(record[mid:], _run(other, actions[mid:]), "portable bytes in a fresh env", report)
            report.fresh_env_checked = True
            report.restores += 2
        finally:
            other.close()

    released = snaps[-1]
    released.release()
    try:
        restore(env, released)
    except SnapshotReleasedError:
        pass
    else:
        raise SnapshotCheckError("restoring a released snapshot did not raise SnapshotReleasedError")
    for s in snaps:
        s.release()
    return report
