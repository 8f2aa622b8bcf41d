"""Running the main job's independent jobs: in this process, in worker processes, or on Ray.

A job is a module-level function and its arguments (picklable), and a function of them only
(:mod:`bpo_experiments.runner`), so where and in which order it runs does not change its
result: ``--jobs N`` and ``--ray ADDRESS`` give the ``results.json`` of ``--jobs 1``
(wall-clock fields aside).

* ``jobs == 1``: one after the other, here.
* ``jobs > 1``: a pool of ``jobs`` *spawned* worker processes (fresh interpreters: no state
  forked from this one; the modules of ``--import`` are imported in each).
* ``ray``: each job is a Ray task (one CPU) on the cluster at the address (``"local"`` starts
  one on this machine). Its nodes need this package (and the modules of ``--import``)
  importable; results come back to this process, which writes them under ``--out``.
"""

from __future__ import annotations

import heapq
import importlib
import importlib.util
import itertools
import multiprocessing
import os
import signal
import socket
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from bpo_envs.processes import exit_with_parent

Job = tuple[Callable[..., Any], tuple[Any, ...]]


@dataclass(order=True)
class Ready:
    """A job whose inputs exist: ``key`` names it to :func:`execute_as_ready`'s ``on_result``;
    among the ready jobs the smallest ``priority`` starts first (ties: the first made ready)."""

    priority: tuple[Any, ...]
    key: Hashable = field(compare=False)
    job: Job = field(compare=False)


def _import_modules(modules: Sequence[str]) -> None:
    for module in modules:
        importlib.import_module(module)


def _start_worker(main_pid: int, modules: Sequence[str]) -> None:
    """A ``--jobs`` worker: ends with the main process (killed or not, a run left going would
    keep writing into the folder a resumed run uses), then imports ``--import``'s modules. Ctrl-C
    is the main process's to handle (it ends the workers): a worker ignores it, so the terminal
    shows one line, not a traceback per worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(main_pid)
    _import_modules(modules)


def _call(fn: Callable[..., Any], args: tuple[Any, ...], modules: Sequence[str]) -> Any:
    _import_modules(modules)
    return fn(*args)


def check_ray_address(address: str) -> None:
    """Fail now, before any job starts, when the Ray cluster at ``address`` cannot be used:
    Ray not installed, or nothing listening at ``host:port`` (``ray://host:port``, or a bare
    ``host:port``). ``"auto"`` and ``"local"`` are checked when Ray starts."""
    if importlib.util.find_spec("ray") is None:
        raise SystemExit("--ray needs Ray: pip install 'ray[default]'")
    if address in ("auto", "local"):
        return
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"--ray {address!r}: give HOST:PORT (the head's GCS port, 6379 by default), ray://HOST:PORT, auto or local")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=3.0):
            pass
    except OSError as exc:
        raise SystemExit(f"--ray {address!r}: no Ray cluster reachable there ({exc}); start one with `ray start --head` or fix the address") from None


def start_ray(address: str) -> None:
    """Connect to (or, ``"local"``, start) the Ray cluster; an error now when it fails."""
    check_ray_address(address)
    import ray

    if ray.is_initialized():
        return
    try:
        if address == "local":
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except Exception as exc:  # noqa: BLE001 - any failure to connect is the same error to the user
        raise SystemExit(f"--ray {address!r}: could not connect to the Ray cluster: {exc}") from None


def _stop_now(pool: Any) -> None:
    """Ctrl-C: stop the runs under way now rather than when they end (what they did is on disk
    up to their last checkpoint, where ``--resume`` continues)."""
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in multiprocessing.active_children():
        worker.terminate()


def execute(
    calls: Sequence[Job],
    jobs: int = 1,
    ray_address: str | None = None,
    modules: Sequence[str] = (),
    on_result: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """Run ``calls`` (``(fn, args)`` each) and return their results in the order of ``calls``;
    ``on_result(index, result)`` is called as each finishes (in completion order)."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    results: list[Any] = [None] * len(calls)

    def done(i: int, value: Any) -> None:
        results[i] = value
        if on_result is not None:
            on_result(i, value)

    if not calls:
        return results
    if ray_address is not None:
        start_ray(ray_address)
        import ray

        remote = ray.remote(num_cpus=1, max_retries=0)(_call)
        refs = {remote.remote(fn, args, tuple(modules)): i for i, (fn, args) in enumerate(calls)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                done(refs[ref], ray.get(ref))
        return results
    if jobs == 1 or len(calls) == 1:
        for i, (fn, args) in enumerate(calls):
            done(i, fn(*args))
        return results
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(calls)), mp_context=context, initializer=_start_worker, initargs=(os.getpid(), tuple(modules))) as pool:
        futures = {pool.submit(fn, *args): i for i, (fn, args) in enumerate(calls)}
        pending = set(futures)
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    done(futures[future], future.result())
        except Exception:
            for future in pending:  # a job failed: the runs under way finish, no new one starts
                future.cancel()
            raise
        except BaseException:
            _stop_now(pool)
            raise
    return results


def execute_as_ready(
    first: Iterable[Ready],
    jobs: int = 1,
    ray_address: str | None = None,
    modules: Sequence[str] = (),
    on_result: Callable[[Hashable, Any], Iterable[Ready]] | None = None,
) -> None:
    """Run jobs as their inputs come into being: ``first`` now, and every job that
    ``on_result(key, result)`` returns (called here, in completion order, as each job ends) once
    it is returned. At most ``jobs`` run at once (processes as :func:`execute`, or Ray tasks);
    a free worker takes the ready job of the smallest :attr:`Ready.priority`. Returns when no job
    runs and none is ready. Which worker runs a job never changes its result (module docstring),
    so the schedule only changes when each result arrives."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    order = itertools.count()
    ready: list[tuple[tuple[Any, ...], int, Ready]] = []

    def push(items: Iterable[Ready]) -> None:
        for item in items:
            heapq.heappush(ready, (item.priority, next(order), item))

    def finished(key: Hashable, value: Any) -> None:
        if on_result is not None:
            push(on_result(key, value))

    push(first)
    if ray_address is None and jobs == 1:
        while ready:
            item = heapq.heappop(ready)[2]
            fn, args = item.job
            finished(item.key, fn(*args))
        return
    if ray_address is not None:
        start_ray(ray_address)
        import ray

        remote = ray.remote(num_cpus=1, max_retries=0)(_call)
        refs: dict[Any, Hashable] = {}
        while ready or refs:
            while ready and len(refs) < jobs:
                item = heapq.heappop(ready)[2]
                fn, args = item.job
                refs[remote.remote(fn, args, tuple(modules))] = item.key
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                finished(refs.pop(ref), ray.get(ref))
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_start_worker, initargs=(os.getpid(), tuple(modules))) as pool:
        running: dict[Future[Any], Hashable] = {}
        try:
            while ready or running:
                while ready and len(running) < jobs:
                    item = heapq.heappop(ready)[2]
                    fn, args = item.job
                    running[pool.submit(fn, *args)] = item.key
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in done:
                    finished(running.pop(future), future.result())
        except Exception:
            ready.clear()  # a job failed: the runs under way finish, no new one starts
            raise
        except BaseException:
            _stop_now(pool)
            raise
