"""An env's tasks in the main job: env factories, the fixed shuffle, the train/eval split, its data.

Every function is deterministic: the same ``EnvSetup`` gives the same tasks for every algorithm
and seed (docs/main-job.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator

import bpo_envs  # noqa: F401 - registers the ids
from bpo_envs.capabilities import require_declared
from bpo_envs.core import SnapshotEnv
from bpo_experiments.presets import EnvSetup


def env_factory(setup: EnvSetup) -> Callable[[], gym.Env]:
    if setup.servers:  # sessions of bpo-serve servers, round robin
        turn = itertools.count()
        return lambda: gym.make("BPO-Remote-v0", base_url=setup.servers[next(turn) % len(setup.servers)])
    return lambda: gym.make(setup.env_id, **setup.kwargs)


def steps_inline(setup: EnvSetup) -> bool:
    """Whether ``setup``'s envs are stepped in the engine's thread: the registered class declares
    ``step_may_block = False`` (read from the class, never probed; served envs never are). Many
    such envs cost only memory (no sandbox, no thread), so the main job gives them wider
    evaluation pools and probe pools of their own (:mod:`bpo_experiments.runner`)."""
    if setup.servers:
        return False
    creator = load_env_creator(gym.spec(setup.env_id).entry_point)
    return isinstance(creator, type) and issubclass(creator, SnapshotEnv) and creator.step_may_block is False


def eval_env_factory(setup: EnvSetup) -> Callable[[], gym.Env]:
    """The envs the final policy is evaluated on: the training envs for ``"held-out"`` and
    ``"train"``, else envs made with ``split=setup.eval_split`` (a split of the env itself)."""
    if setup.eval_split in ("held-out", "train"):
        return env_factory(setup)
    if setup.servers:
        raise ValueError(f"{setup.env_id}: eval_split={setup.eval_split!r} makes other envs than the served ones; "
                         "use 'held-out' or 'train' with --env-server")
    kwargs = {**setup.kwargs, **setup.eval_kwargs}
    if setup.eval_split != "rows":
        kwargs["split"] = setup.eval_split
    return lambda: gym.make(setup.env_id, **kwargs)


def task_sets(setup: EnvSetup, train_tasks: list[Any], eval_tasks: list[Any]) -> list[tuple[dict[str, Any], list[Any]]]:
    """Every group of tasks a comparison plays on ``setup``'s env, with the keywords of the env
    that plays it: the training tasks, the evaluation tasks, each further evaluation split's
    (none for served envs: their tasks live on the servers)."""
    if setup.servers:
        return []
    out = [(dict(setup.kwargs), list(train_tasks))]
    if setup.eval_split in ("held-out", "train"):
        out[0] = (out[0][0], [*train_tasks, *(t for t in eval_tasks if t not in set(train_tasks))])
    else:
        kwargs = {**setup.kwargs, **setup.eval_kwargs, **({"split": setup.eval_split} if setup.eval_split != "rows" else {})}
        out.append((kwargs, list(eval_tasks)))
    for split, tasks in extra_eval_tasks(setup).items():
        out.append(({**setup.kwargs, **setup.eval_kwargs, "split": split}, tasks))
    return out


def _ids_and_provenance(make: Callable[[], gym.Env]) -> tuple[list[Any], dict[str, Any] | None]:
    """The task ids of an env ``make`` builds, in its own order, and its ``provenance()`` (None
    for an env without one)."""
    env = make()
    try:
        owner = require_declared(env, "a comparison's task split")
        ids = owner.task_ids()
        if ids is None:
            raise ValueError(f"{type(owner).__name__} declares no fixed task list (task_ids() is None): a comparison draws its tasks from one")
        return list(ids), owner.provenance()
    finally:
        env.close()


def _shuffled_ids(make: Callable[[], gym.Env], seed: int = 12345) -> tuple[list[Any], dict[str, Any] | None]:
    ids, info = _ids_and_provenance(make)
    rng = np.random.default_rng(seed)
    return [ids[i] for i in rng.permutation(len(ids))], info


def task_order(setup: EnvSetup) -> list[Any]:
    """The training env's tasks in the fixed shuffle the training tasks are the first of (the
    tuning criterion's held-out training tasks come after them)."""
    return _shuffled_ids(env_factory(setup))[0]


def task_split(setup: EnvSetup) -> tuple[list[Any], list[Any]]:
    """Deterministic train and eval tasks (the same for every algorithm and seed).

    Train tasks: the first ``train_tasks`` of a fixed shuffle of the training env's tasks. Eval
    tasks: ``"held-out"``: the next ``eval_tasks`` of that shuffle; ``"train"``: the first
    ``eval_tasks`` train tasks; a split name: the first ``eval_tasks`` of a fixed shuffle of that
    split's tasks (disjoint from training when the env's splits are).
    """
    train, eval_tasks, _ = task_split_with_provenance(setup)
    return train, eval_tasks


def extra_eval_tasks(setup: EnvSetup) -> dict[str, list[Any]]:
    """The tasks of each further evaluation split (:attr:`EnvSetup.extra_eval`): the first ``n``
    of a fixed shuffle of that split (an error when it has fewer)."""
    out: dict[str, list[Any]] = {}
    for split, n in setup.extra_eval.items():
        kwargs = {**setup.kwargs, **setup.eval_kwargs, "split": split}
        order, _ = _shuffled_ids(lambda kwargs=kwargs: gym.make(setup.env_id, **kwargs), seed=54321)
        if len(order) < n:
            raise ValueError(f"{setup.env_id}: {n} {split} evaluation tasks asked, but that split has {len(order)}; lower extra_eval")
        out[split] = order[:n]
    return out


def task_split_with_provenance(setup: EnvSetup) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """:func:`task_split`, and what the results are made from: ``{"train": ..., "eval": ...}``,
    each the env's ``provenance()`` (data source, split, task count; see
    :mod:`bpo_envs.provenance`) plus ``tasks_used``, the tasks drawn from it."""
    order, train_prov = _shuffled_ids(env_factory(setup))
    if len(order) < setup.train_tasks:
        raise ValueError(
            f"{setup.env_id}: {setup.train_tasks} training tasks asked, but the training env has {len(order)} "
            f"({(train_prov or {}).get('data_source', 'its data')}); lower train_tasks or give it more tasks"
        )
    train = order[: setup.train_tasks]
    if setup.eval_split == "train":
        eval_tasks, eval_prov = train[: setup.eval_tasks], train_prov
    elif setup.eval_split == "held-out":
        eval_tasks, eval_prov = order[setup.train_tasks :][: setup.eval_tasks], train_prov
        overlap = set(eval_tasks) & set(train)
        if overlap:
            raise ValueError(f"{setup.env_id}: evaluation tasks {sorted(overlap)[:5]} are also training tasks")
    elif setup.eval_split == "rows":
        # every evaluation row in its source's order (the gpu preset: all of Verified's given)
        eval_order, eval_prov = _ids_and_provenance(eval_env_factory(setup))
        eval_tasks = eval_order[: setup.eval_tasks]
        overlap = sorted(set(map(str, eval_order)) & set(map(str, order)))
        if overlap:
            raise ValueError(f"{setup.env_id}: {len(overlap)} evaluation task(s) are also training tasks: {overlap[:10]}")
    else:
        # another shuffle: ALFWorld's ids are per split, and equal names would look like one game
        eval_order, eval_prov = _shuffled_ids(eval_env_factory(setup), seed=54321)
        if len(eval_order) < setup.eval_tasks:
            raise ValueError(
                f"{setup.env_id}: {setup.eval_tasks} {setup.eval_split} evaluation tasks asked, but that split has "
                f"{len(eval_order)}; lower eval_tasks"
            )
        eval_tasks = eval_order[: setup.eval_tasks]
    if not eval_tasks:
        raise ValueError(
            f"{setup.env_id}: no {setup.eval_split} evaluation task ({len(order)} training task(s), "
            f"{setup.train_tasks} used for training); lower train_tasks or choose another eval_split"
        )
    data = {
        "train": {**(train_prov or {"env": setup.env_id}), "tasks_used": len(train)},
        "eval": {**(eval_prov or {"env": setup.env_id}), "tasks_used": len(eval_tasks), "eval_split": setup.eval_split},
    }
    return train, eval_tasks, data
