"""ALFWorld game translations made before the episodes need them, in parallel, with a progress bar.

Loading an ALFWorld game the first time translates its PDDL problem to SAS twice (plain and
optimised) and parses its grammar, about :data:`SECONDS_PER_TRANSLATION` of CPU; the result is
kept on disk (:func:`~bpo_envs.alfworld._upstream.translation_path`) and read back in every later
process. An env does this on its first reset of a game, one game at a time inside whichever job
meets it first. :func:`make_translations` does it for a list of games before they are needed,
in worker processes, with a progress bar; :func:`untranslated` says which are missing (what
``bpo-compare --plan`` prices).
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from bpo_envs.alfworld._upstream import translation_path

SECONDS_PER_TRANSLATION = 1.2
"""CPU seconds one game's translations take: ``make compare`` from an empty cache took about 13
minutes more with ``--jobs 2`` over its 1,274 ALFWorld games (docs/alfworld.md)."""

CHUNK = 8
"""Games a worker translates per task (one env per worker process, kept between tasks)."""

_ENVS: dict[str, Any] = {}
"""This process's env per constructor keywords (a worker translates many chunks with one)."""


def _env(kwargs: dict[str, Any]) -> Any:
    from bpo_envs.alfworld.env import ALFWorldEnv

    key = json.dumps(kwargs, sort_keys=True, default=str)
    if key not in _ENVS:
        _ENVS[key] = ALFWorldEnv(**kwargs)
    return _ENVS[key]


def untranslated(env_kwargs: dict[str, Any], task_ids: Sequence[str]) -> list[str]:
    """The tasks of ``task_ids`` (of the env ``BPO-ALFWorld-v0`` made with ``env_kwargs``) whose
    game has no translation on disk."""
    games = _env(env_kwargs).games
    return [t for t in task_ids if not translation_path(games.game(t)).exists()]


def _translate(env_kwargs: dict[str, Any], task_ids: Sequence[str]) -> int:
    """Load each game once (its first load translates it and writes the translation)."""
    env = _env(env_kwargs)
    for task_id in task_ids:
        env.reset(options={"task_id": task_id})
    return len(task_ids)


def make_translations(env_kwargs: dict[str, Any], task_ids: Sequence[str], workers: int = 1, progress: bool = True) -> int:
    """Translate the games of ``task_ids`` that have no translation yet (:func:`untranslated`),
    in ``workers`` spawned processes (1: here), with a progress bar on stderr; returns how many
    were translated. A translation is the same whichever process makes it."""
    from tqdm.auto import tqdm

    missing = untranslated(env_kwargs, task_ids)
    if not missing:
        return 0
    chunks = [missing[i : i + CHUNK] for i in range(0, len(missing), CHUNK)]
    with tqdm(total=len(missing), desc="ALFWorld game translations", unit="game", disable=not progress) as bar:
        if workers <= 1 or len(chunks) == 1:
            for chunk in chunks:
                bar.update(_translate(env_kwargs, chunk))
        else:
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=min(workers, len(chunks)), mp_context=context) as pool:
                for future in as_completed([pool.submit(_translate, env_kwargs, chunk) for chunk in chunks]):
                    bar.update(future.result())
    return len(missing)
