"""The env-pool interface: envs lent to the rollout engine's paths one at a time.

:class:`EnvPool` is the local pool (envs made lazily from factories, stepped in turn or in a
thread pool); :class:`bpo_envs.ray_pool.RayEnvPool` implements the same methods and
attributes over Ray actors. The engine (:mod:`bpo_algos.rollout`) uses only this interface:

* ``len(pool)``, ``pool.n_free``; ``acquire(prefer=None) -> env | None``; ``is_free(env)``;
  ``is_lent(env)``; ``release(env, failed=False)`` (``failed=True``: the env raised, so the
  pool replaces it);
* ``step_many(envs, actions)``: one result per env in input order, an env's exception in its
  place (one failing env never costs the others' results);
* ``retries`` and ``max_failures``: how the engine handles failing envs
  (:mod:`bpo_algos.recovery`); ``close()``.

Which slot ``acquire`` lends depends only on this free-slot bookkeeping, so two pools with the
same number of envs give the engine the same schedule, and so the same batch for given seeds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym

from bpo_envs.core import check_step_limit
from bpo_envs.validation import check_count

EnvFn = Callable[[], gym.Env]
StepResult = tuple[Any, float, bool, bool, dict[str, Any]]

logger = logging.getLogger(__name__)


class EnvPool:
    """Envs made lazily from ``env_fns``, lent to paths one at a time.

    ``workers > 1`` steps the lent envs in a thread pool (worth it when a step waits on a
    subprocess or a container, as SWE-bench commands do); the default steps them in turn.
    ``retries`` and ``max_failures`` set how the engine handles failing envs
    (:mod:`bpo_algos.recovery`). A distributed pool implements the same methods and attributes.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        *,
        workers: int = 1,
        retries: int = 2,
        max_failures: int = 64,
    ) -> None:
        if not env_fns:
            raise ValueError("env_fns must hold at least one env factory")
        self.workers = check_count("workers", workers, 1)
        self.retries = check_count("retries", retries, 0)
        self.max_failures = check_count("max_failures", max_failures, 1)
        self._executor: ThreadPoolExecutor | None = None
        self._fns = list(env_fns)
        self._envs: list[gym.Env | None] = [None] * len(self._fns)
        self._free: list[int] = list(range(len(self._fns)))
        self._index: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._fns)

    @property
    def n_free(self) -> int:
        return len(self._free)

    def acquire(self, prefer: gym.Env | None = None) -> gym.Env | None:
        """A free env (``prefer`` when it is free), or None when all are lent."""
        if not self._free:
            return None
        slot = self._free[0]
        if prefer is not None and id(prefer) in self._index and self._index[id(prefer)] in self._free:
            slot = self._index[id(prefer)]
        self._free.remove(slot)
        env = self._envs[slot]
        if env is None:
            env = self._fns[slot]()
            check_step_limit(env)
            self._envs[slot] = env
            self._index[id(env)] = slot
        return env

    def is_free(self, env: gym.Env) -> bool:
        return self._index.get(id(env)) in self._free

    def is_lent(self, env: gym.Env) -> bool:
        """``env`` is in the pool and lent to a path (not free, not replaced after a failure)."""
        slot = self._index.get(id(env))
        return slot is not None and slot not in self._free

    def release(self, env: gym.Env, *, failed: bool = False) -> None:
        """Hand ``env`` back; ``failed=True``: it raised, so close it and make a new one."""
        slot = self._index[id(env)]
        if slot in self._free:
            raise RuntimeError("env released twice")
        if failed:
            del self._index[id(env)]
            self._envs[slot] = None
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a broken env may not even close
                logger.debug("closing a failed env raised", exc_info=True)
        self._free.append(slot)

    def step_many(self, envs: Sequence[gym.Env], actions: Sequence[str]) -> list[StepResult | Exception]:
        """``env.step(action)`` for each pair, in order of the inputs.

        An env whose step raises gives its exception in its place: one failing env never
        costs the others' results.
        """
        if self.workers == 1 or len(envs) < 2:
            return [_step_or_error(env, action) for env, action in zip(envs, actions, strict=True)]
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="bpo-env")
        return list(self._executor.map(lambda pair: _step_or_error(*pair), zip(envs, actions, strict=True)))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for env in self._envs:
            if env is not None:
                env.close()
        self._envs = [None] * len(self._fns)
        self._index.clear()
        self._free = list(range(len(self._fns)))


def _step_or_error(env: gym.Env, action: str) -> StepResult | Exception:
    try:
        return env.step(action)
    except Exception as exc:  # noqa: BLE001 - handed to the engine as this env's failure
        return exc
