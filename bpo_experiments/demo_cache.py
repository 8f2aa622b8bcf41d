"""The expert demos of a comparison's warm start, kept on disk so that every process collects them once.

An expert whose episodes do not depend on the reset seed (ALFWorld's: a task id fixes the game)
gives every seed, every worker process and every later comparison the same demos; collecting
them is most of an ALFWorld initial job (the handcoded expert over 1,000 games: docs/main-job.md,
"What the default costs on idle cores"). :func:`cached_expert_demos` keeps them in
``$BPO_DEMOS_CACHE``, else ``user_cache_dir("demos")`` (``$XDG_CACHE_HOME/bpo_gym/demos``), as gzip JSON, under a SHA-256 of
everything they are a function of: the env id and its keywords, the tasks in order, the env's
``provenance()`` (which games), the source of ``bpo_envs`` and of the demo collector, and the
versions of the packages the games run on. A changed game, engine or collector is another key,
so a stale file is never read. Two processes that need the same demos wait for each other (a
lock per key) instead of both collecting them.

The file is data only (text, read back with type checks into :class:`~bpo_algos.policy.sft.Demo`
objects); one that does not parse or check out is collected again and overwritten. Each
episode is stored once (its reset observation, then each expert action with the observation
and admissible commands it led to), and rebuilt with ``Context.child`` exactly as
:func:`~bpo_algos.policy.sft.expert_demos` builds it; demos that this layout cannot rebuild
exactly are not stored.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import gymnasium as gym

from bpo_algos.policy.sft import Demo, expert_demos
from bpo_envs.files import atomic_write, user_cache_dir
from bpo_envs.prompting import Context

log = logging.getLogger(__name__)

DEMOS_FORMAT = "bpo-expert-demos/1"
PACKAGES = ("bpo-gym", "alfworld", "textworld", "fast-downward-textworld", "gymnasium")
"""Packages whose versions are part of a demo file's key (the games and the engine they run on)."""


@lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 over the source of ``bpo_envs`` (every env, its games and experts) and of the
    demo collector (``bpo_algos/policy/sft.py``), and the versions of :data:`PACKAGES`."""
    import bpo_algos.policy.sft as sft
    import bpo_envs

    digest = hashlib.sha256()
    root = Path(bpo_envs.__file__).resolve().parent
    for path in [*sorted(root.rglob("*.py")), Path(sft.__file__).resolve()]:
        digest.update(str(path.relative_to(path.parents[1] if path.name == "sft.py" else root.parent)).encode())
        digest.update(b"\x00")
        digest.update(path.read_bytes())
    for name in PACKAGES:
        try:
            digest.update(f"{name}=={metadata.version(name)}\x00".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name}==?\x00".encode())
    return digest.hexdigest()


def demos_folder() -> Path:
    """Where demo files live: ``$BPO_DEMOS_CACHE``, else ``user_cache_dir("demos")``."""
    override = os.environ.get("BPO_DEMOS_CACHE")
    return Path(override) if override else user_cache_dir("demos")


def demos_key(env_id: str, kwargs: dict[str, Any], tasks: Sequence[Any], seed: int | None, provenance: Any) -> str:
    """The SHA-256 that names the demos of ``tasks`` on the env ``env_id(**kwargs)`` (``seed``:
    None for an expert whose episodes do not depend on it), given the env's ``provenance()``."""
    described = json.dumps({"format": DEMOS_FORMAT, "env_id": env_id, "kwargs": kwargs, "tasks": list(tasks), "seed": seed,
                            "provenance": provenance, "code": code_digest()}, sort_keys=True, default=repr)
    return hashlib.sha256(described.encode()).hexdigest()


def demos_data(demos: Sequence[Demo]) -> list[dict[str, Any]] | None:
    """``demos`` as plain data, one entry per episode, or None when they are not episodes this
    layout rebuilds exactly (:func:`demos_from_data` is checked against them)."""
    episodes: list[dict[str, Any]] = []
    previous: Demo | None = None
    for demo in demos:
        c = demo.context
        admissible = list(c.admissible_actions) if c.admissible_actions is not None else None
        if not c.history:
            if not isinstance(c.task_id, str | int):
                return None
            episodes.append({"task_id": c.task_id, "initial_observation": c.initial_observation, "observation": c.observation,
                             "admissible": admissible, "steps": []})
        elif previous is None or not episodes:
            return None
        else:
            episodes[-1]["steps"].append([previous.action, c.observation, admissible])
        episodes[-1].setdefault("actions", []).append(demo.action)
        previous = demo
    try:
        same = demos_from_data(episodes) == list(demos)
    except ValueError:
        return None
    return episodes if same else None


def _texts(value: Any, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} is not a list of text")
    return tuple(value)


def demos_from_data(episodes: Any) -> list[Demo]:
    """The demos :func:`demos_data` stored, every field checked (``ValueError`` on anything else)."""
    if not isinstance(episodes, list):
        raise ValueError("the demos are not a list of episodes")
    demos: list[Demo] = []
    for episode in episodes:
        if not isinstance(episode, dict):
            raise ValueError("an episode is not a dict")
        task_id, steps, actions = episode.get("task_id"), episode.get("steps"), episode.get("actions")
        initial, observation = episode.get("initial_observation"), episode.get("observation")
        if not isinstance(task_id, str | int) or not isinstance(initial, str) or not isinstance(observation, str):
            raise ValueError("an episode's task id or observations are not text")
        if not isinstance(steps, list) or _texts(actions, "an episode's actions") is None or len(actions) != len(steps) + 1:
            raise ValueError("an episode's steps and actions do not match")
        context = Context(task_id, observation, _texts(episode.get("admissible"), "the admissible commands"),
                          initial_observation=initial)
        demos.append(Demo(context, actions[0]))
        for step, action in zip(steps, actions[1:], strict=True):
            if not (isinstance(step, list) and len(step) == 3 and isinstance(step[0], str) and isinstance(step[1], str)):
                raise ValueError("an episode's step is not [action, observation, admissible commands]")
            context = context.child(step[0], step[1], _texts(step[2], "the admissible commands"))
            demos.append(Demo(context, action))
    return demos


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, waiting for it (released however the holder exits)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read(path: Path, key: str) -> list[Demo] | None:
    try:
        payload = json.loads(gzip.decompress(path.read_bytes()))
        if not isinstance(payload, dict) or payload.get("format") != DEMOS_FORMAT or payload.get("key") != key:
            raise ValueError("another format or key")
        return demos_from_data(payload.get("episodes"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError, gzip.BadGzipFile) as exc:
        log.warning("expert demos: ignoring %s (%s); collecting them again", path, exc)
        return None


def cached_expert_demos(env_id: str, kwargs: dict[str, Any], env_fn: Callable[[], gym.Env], tasks: Sequence[Any], seed: int,
                        seedless: bool, folder: Path | None = None) -> list[Demo]:
    """:func:`~bpo_algos.policy.sft.expert_demos` of ``tasks`` on ``env_fn()`` (the env
    ``env_id(**kwargs)``), read from ``folder`` (default :func:`demos_folder`) where a
    process collected them before, else collected and written there (see the module
    docstring). ``seedless``: the expert's episodes do not depend on ``seed``, so one file
    serves every seed."""
    env = env_fn()
    try:
        provenance = env.unwrapped.provenance()
    finally:
        env.close()
    key = demos_key(env_id, kwargs, tasks, None if seedless else seed, provenance)
    folder = folder if folder is not None else demos_folder()
    path = folder / f"{key}.json.gz"
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(_lock(folder / f"{key}.lock"))
        except OSError as exc:  # a cache folder this user cannot write: collect, keep nothing
            log.info("expert demos: no cache in %s (%s)", folder, exc)
            return expert_demos(env_fn, tasks, seed=seed)
        demos = _read(path, key)
        if demos is not None:
            return demos
        demos = expert_demos(env_fn, tasks, seed=seed)
        episodes = demos_data(demos)
        if episodes is None:
            log.info("expert demos of %s: not episodes the demo file can hold; not kept", env_id)
            return demos
        try:
            payload = {"format": DEMOS_FORMAT, "key": key, "env_id": env_id, "tasks": len(tasks), "episodes": episodes}
            atomic_write(path, gzip.compress(json.dumps(payload).encode(), mtime=0))
        except OSError as exc:
            log.info("expert demos: cannot write %s (%s)", path, exc)
        return demos
