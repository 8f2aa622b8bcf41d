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
  (:mod:`bpo_algos.recovery`); ``close()``;
* ``step_timeout_s``: a step that has not returned by then gives a :class:`StepTimeoutError` in
  its place (default :data:`DEFAULT_STEP_TIMEOUT_S`; None: no limit), a failure the engine's
  recovery handles like any other: the env is replaced and the path rebuilt.

**Inline stepping.** An env whose class declares
:attr:`SnapshotEnv.step_may_block = False <bpo_envs.core.SnapshotEnv.step_may_block>` (read from
the unwrapped env's class, never probed) is stepped in the caller's thread: its step is bounded
by construction (WebShop: ~0.1 ms of in-memory work), and handing it to a worker thread costs
more than the step (a queue put, a lock, a wake-up; on loaded cores the hand-off dominated the
collection). Such a step is outside ``workers`` and ``step_timeout_s``: no deadline can stop a
call run inline, which is why only a bounded step may declare False (docs/envs.md). Every
other env (SWE-bench, served and Ray envs, any plain Gymnasium env) keeps the threads, the
deadline and the recovery; in a mixed call the blocking steps are handed to the threads
first and the inline ones run while those are under way.

**One job per call on one worker.** With a deadline and ``workers=1`` (ALFWorld's preset) the
blocking steps of one ``step_many`` call go to the worker as one job that steps the envs in turn
(:class:`_StepBatch`): one hand-off per call, not one per step, and still each step bounded by
``step_timeout_s`` from its own start. When step ``k`` passes its deadline it gives a
:class:`StepTimeoutError`, its env is marked stuck (closed beside its thread on release), a new
thread takes the stuck one's place, and steps ``k+1...`` of the call, which the stuck job
checks for cancellation before it starts each step, run there instead: each step runs exactly
once. With ``workers > 1`` each step is its own job, so the workers share them.

Which slot ``acquire`` lends depends only on this free-slot bookkeeping, so two pools with the
same number of envs give the engine the same schedule, and so the same batch for given seeds.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym

from bpo_envs.core import SnapshotEnv, check_step_limit
from bpo_envs.validation import check_count

EnvFn = Callable[[], gym.Env]
StepResult = tuple[Any, float, bool, bool, dict[str, Any]]

logger = logging.getLogger(__name__)

DEFAULT_STEP_TIMEOUT_S = 3600.0
"""The pools' default per-step deadline: far above any healthy step (a SWE-bench command is
bounded by its own ``step_timeout``, grading by its ``eval_timeout``), so that only a stuck env
(a hung daemon, a deadlock) reaches it."""


class StepTimeoutError(RuntimeError):
    """An env's step did not return within the pool's ``step_timeout_s``. The pool treats the
    env as failed (it is closed in the background and replaced); the thread stuck in the step
    is left behind (a daemon thread: it never keeps the process from exiting)."""


class EnvPool:
    """Envs made lazily from ``env_fns``, lent to paths one at a time.

    ``workers > 1`` steps the lent envs in a thread pool (worth it when a step waits on a
    subprocess or a container, as SWE-bench commands do); the default steps them in turn.
    ``retries`` and ``max_failures`` set how the engine handles failing envs
    (:mod:`bpo_algos.recovery`). ``step_timeout_s`` (default :data:`DEFAULT_STEP_TIMEOUT_S`,
    None: no limit) bounds each step, counted from when it starts: a step past it gives a
    :class:`StepTimeoutError` in its place. With a limit, steps run in daemon worker threads
    (``workers`` of them; one by default, which takes each ``step_many`` call's steps as one job
    and steps the envs in turn: module docstring). ``step_timeout_s`` is read at each call. A
    distributed pool implements the same methods and attributes.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        *,
        workers: int = 1,
        retries: int = 2,
        max_failures: int = 64,
        step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S,
    ) -> None:
        if not env_fns:
            raise ValueError("env_fns must hold at least one env factory")
        if step_timeout_s is not None and (isinstance(step_timeout_s, bool)
                                           or not isinstance(step_timeout_s, int | float)
                                           or not step_timeout_s > 0):
            raise ValueError(f"step_timeout_s must be > 0 or None, got {step_timeout_s!r}")
        self.step_timeout_s = None if step_timeout_s is None else float(step_timeout_s)
        self._runner: _DaemonWorkers | None = None
        self._stuck: set[int] = set()  # ids of envs whose step timed out
        self.workers = check_count("workers", workers, 1)
        self.retries = check_count("retries", retries, 0)
        self.max_failures = check_count("max_failures", max_failures, 1)
        self._executor: ThreadPoolExecutor | None = None
        self._fns = list(env_fns)
        self._envs: list[gym.Env | None] = [None] * len(self._fns)
        self._free: list[int] = list(range(len(self._fns)))
        self._index: dict[int, int] = {}
        self._inline: set[int] = set()  # ids of envs stepped in the caller's thread

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
            if steps_inline(env):
                self._inline.add(id(env))
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
            self._inline.discard(id(env))
            self._envs[slot] = None
            if id(env) in self._stuck:
                # a thread is still inside its step: close it beside that thread, not here
                self._stuck.discard(id(env))
                threading.Thread(target=_close_quietly, args=(env,), daemon=True).start()
            else:
                _close_quietly(env)
        self._free.append(slot)

    def step_many(self, envs: Sequence[gym.Env], actions: Sequence[str]) -> list[StepResult | Exception]:
        """``env.step(action)`` for each pair, in order of the inputs.

        An env whose step raises gives its exception in its place: one failing env never
        costs the others' results. Envs that declare ``step_may_block = False`` are stepped
        inline (see the module docstring), the others on the pool's threads.
        """
        if len(envs) != len(actions):
            raise ValueError(f"{len(envs)} envs for {len(actions)} actions")
        threaded = [i for i, env in enumerate(envs) if id(env) not in self._inline]
        if not threaded:
            return [_step_or_error(env, action) for env, action in zip(envs, actions, strict=True)]
        collect = self._submit([envs[i] for i in threaded], [actions[i] for i in threaded])
        out: list[StepResult | Exception | None] = [None] * len(envs)
        for i in sorted(set(range(len(envs))).difference(threaded)):  # while the threads step
            out[i] = _step_or_error(envs[i], actions[i])
        for i, result in zip(threaded, collect(), strict=True):
            out[i] = result
        return out  # type: ignore[return-value]  # every slot is filled

    def _submit(self, envs: Sequence[gym.Env], actions: Sequence[str]) -> Callable[[], list[StepResult | Exception]]:
        """Start the steps of envs that may block; returns the call that waits for their
        results. Without a deadline and with one worker (or one env) they run in turn, in the
        caller's thread, when that call is made."""
        if self.step_timeout_s is not None:
            return self._submit_timed(envs, actions)
        if self.workers == 1 or len(envs) < 2:
            return lambda: [_step_or_error(env, action) for env, action in zip(envs, actions, strict=True)]
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="bpo-env")
        futures = [self._executor.submit(_step_or_error, env, action) for env, action in zip(envs, actions, strict=True)]
        return lambda: [future.result() for future in futures]

    def _submit_timed(self, envs: Sequence[gym.Env], actions: Sequence[str]) -> Callable[[], list[StepResult | Exception]]:
        """Hand the steps to the daemon workers; returns the call that waits for their results
        (each bounded by ``step_timeout_s`` from its own start). With one worker the steps run in
        turn on it anyway, so they go as one job (:class:`_StepBatch`): one hand-off per call
        instead of one per step. With more, each step is its own job, so the workers share them."""
        assert self.step_timeout_s is not None
        if self._runner is None:
            self._runner = _DaemonWorkers(self.workers)
        if self.workers == 1:
            batches = [_StepBatch(envs, actions)]
        else:
            batches = [_StepBatch([env], [action]) for env, action in zip(envs, actions, strict=True)]
        for batch in batches:
            self._runner.submit(batch)
        return lambda: self._collect_timed(batches)

    def _collect_timed(self, batches: list[_StepBatch]) -> list[StepResult | Exception]:
        """The batches' results in order. A step past its deadline gives a
        :class:`StepTimeoutError` and leaves its thread behind (its env is marked stuck, a new
        thread takes its place); the batch's steps after it, which that job will now never start
        (:meth:`_StepBatch.wait`), go to the workers as a new job: each step runs exactly once."""
        assert self.step_timeout_s is not None and self._runner is not None
        out: list[StepResult | Exception] = []
        for batch in batches:
            while True:
                stuck = batch.wait(self.step_timeout_s)
                if stuck is None:
                    out.extend(batch.results)  # type: ignore[arg-type]  # every step returned
                    break
                out.extend(batch.results[:stuck])  # type: ignore[arg-type]  # returned before it
                self._stuck.add(id(batch.envs[stuck]))
                self._runner.replace_stuck()
                out.append(StepTimeoutError(
                    f"the env's step did not return within step_timeout_s={self.step_timeout_s:g} s"))
                if stuck + 1 == len(batch.envs):
                    break
                batch = _StepBatch(batch.envs[stuck + 1:], batch.actions[stuck + 1:])
                self._runner.submit(batch)
        for result in out:  # a step that raised KeyboardInterrupt or SystemExit: raised here
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
        return out

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._runner is not None:
            self._runner.shutdown()
            self._runner = None
        for env in self._envs:
            if env is not None:
                env.close()
        self._envs = [None] * len(self._fns)
        self._index.clear()
        self._inline.clear()
        self._free = list(range(len(self._fns)))


def _close_quietly(env: gym.Env) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - a broken env may not even close
        logger.debug("closing a failed env raised", exc_info=True)


class _StepBatch:
    """Steps run in turn by one worker thread, each timed from its own start.

    :meth:`run` (on the worker) checks, under the batch's lock, that the batch is not cancelled
    before it starts each step, and records the step's start time; :meth:`wait` (on the caller)
    declares the running step stuck and cancels the batch under the same lock. So at a timeout
    the worker is inside step ``k`` and no later step has started or ever will in this job:
    the caller runs steps ``k+1...`` elsewhere, and none runs twice or is lost."""

    def __init__(self, envs: Sequence[gym.Env], actions: Sequence[str]) -> None:
        self.envs, self.actions = list(envs), list(actions)
        self.results: list[StepResult | BaseException | None] = [None] * len(self.envs)
        self._started: list[float | None] = [None] * len(self.envs)
        self._next = 0  # the first step not started
        self._returned = 0  # steps returned (they run in turn: steps 0.._returned-1)
        self._cancelled = False
        self._lock = threading.Lock()
        self._ended = threading.Event()  # the job ran every step, or stopped on cancel

    def run(self) -> None:
        try:
            while True:
                with self._lock:
                    k = self._next
                    if self._cancelled or k == len(self.envs):
                        return
                    self._next = k + 1
                    self._started[k] = time.monotonic()
                try:
                    result: StepResult | BaseException = _step_or_error(self.envs[k], self.actions[k])
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    result = exc
                with self._lock:
                    self.results[k] = result
                    self._returned = k + 1
        finally:
            self._ended.set()

    def wait(self, timeout_s: float) -> int | None:
        """None once every step has returned; else the index ``k`` of the step that passed
        ``timeout_s`` from its own start, with the batch cancelled (steps after ``k`` never start
        in this job; ``results[:k]`` hold the returned ones)."""
        while True:
            with self._lock:
                k = self._returned
                if k == len(self.envs):
                    return None
                start = self._started[k]
                if start is not None and time.monotonic() >= start + timeout_s:
                    self._cancelled = True
                    assert self._next == k + 1  # the worker is inside step k
                    return k
            # the step's deadline, or a short poll until a worker takes the job
            self._ended.wait(0.05 if start is None else max(0.0, start + timeout_s - time.monotonic()))


class _DaemonWorkers:
    """``n`` daemon threads running submitted jobs in submission order. A job stuck past its
    deadline keeps its thread (:meth:`replace_stuck` starts another in its place); daemon
    threads never keep the process from exiting, as a ``ThreadPoolExecutor``'s would."""

    def __init__(self, n: int) -> None:
        self._jobs: queue.SimpleQueue[_StepBatch | None] = queue.SimpleQueue()
        self._n = 0
        for _ in range(n):
            self.replace_stuck()

    def replace_stuck(self) -> None:
        self._n += 1  # a stuck thread that returns takes a job (or its stop) like the others
        threading.Thread(target=self._work, daemon=True, name="bpo-env").start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            job.run()

    def submit(self, job: _StepBatch) -> None:
        self._jobs.put(job)

    def shutdown(self) -> None:
        for _ in range(self._n):
            self._jobs.put(None)


def steps_inline(env: gym.Env) -> bool:
    """Whether ``env`` is stepped in the caller's thread: its unwrapped env is a
    :class:`~bpo_envs.core.SnapshotEnv` whose class declares ``step_may_block = False``. Every
    other env (served, Ray, plain Gymnasium) may block, so it keeps the threads and deadlines."""
    owner = env.unwrapped
    return isinstance(owner, SnapshotEnv) and type(owner).step_may_block is False


def _step_or_error(env: gym.Env, action: str) -> StepResult | Exception:
    try:
        return env.step(action)
    except Exception as exc:  # noqa: BLE001 - handed to the engine as this env's failure
        return exc
