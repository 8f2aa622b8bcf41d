"""Benchmark BPO-SWEBench-v0: step latency, snapshot, restore, fork and grading, per backend.

Repos: the bundled ``textkit`` (small), a generated repo of Django's size (6,800 files in 700
folders) and, for docker, ``official``: textkit in the small offline test image in the official
layout (``sweb.eval.x86_64.bpo-gym__textkit-1``, its ``.bashrc`` sourced per command). Writes
JSON (medians and all samples) and prints a summary::

    python benchmarks/bench_swebench.py --backends local docker --repeats 15 --out bench_swebench.json

Concurrency (docker, the official-layout test image): ``--concurrency 1 4 8 16`` runs that many
envs at once, each in its own thread doing ``--rounds`` rounds of step, snapshot, step,
restore, step (checking the restored state), release; per level: steps/s over the wall time,
p50/p99 of step, snapshot and restore, memory per env (the container's cgroup memory, its
containerd shim's RSS, and the host's available memory lost per env), every error (a daemon
error, a wrong restore) and what the daemon-retry log said. ``--cpu-hog`` adds the neighbour
test: a CPU-bound command timed in one env alone, then beside an env running four busy loops,
with the default quota (``cpus=1``) and with the quota at the host's CPU count::

    python benchmarks/bench_swebench.py --backend docker --concurrency 1 4 8 16 --cpu-hog \
        --out docs/results/swebench-concurrency/concurrency.json

``--deadlines on off`` runs each level with the host's deadline on every command (the default:
the output read in a thread the host bounds, ``bpo_envs.swebench.docker_backend``) and off (read
in the caller's thread, no host deadline), twice each in the order on, off, off, on, so that a
drift in the host's load weighs on both alike::

    python benchmarks/bench_swebench.py --backend docker --concurrency 8 --deadlines on off \
        --out docs/results/swebench-concurrency/deadlines.json

Docker restores take a warm container (started in the background after the snapshot);
``restore_after_idle`` restores ``--idle`` seconds after the snapshot (the policy's think time),
``restore`` right after one step. ``docker_floor`` times the parts each one is made of on this
engine: ``commit`` (a snapshot: the writable layer as an image), ``start`` (create + start a
container: a cold restore) and ``exec_true`` (one ``docker exec`` round trip).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bpo_envs
from bpo_envs.swebench import SWEBenchEnv, bundled_instances
from bpo_envs.swebench.bundled import Commit, RepoSource, build_repo
from bpo_envs.timing import ms_summary


def large_row(root: Path, n_files: int = 6800, per_dir: int = 10) -> dict[str, Any]:
    """A repo of Django's size (files and folders), with one bug and its tests."""
    files: dict[str, str | None] = {"README.md": "# large\n", "pkg/__init__.py": ""}
    for i in range(n_files - 4):
        body = "".join(f"def f{i}_{j}(x):\n    return x + {j}\n\n\n" for j in range(40))
        files[f"pkg/m{i // per_dir:03d}/mod{i}.py"] = body
    files["pkg/core.py"] = "def add(a, b):\n    return a - b\n\n\ndef one():\n    return 1\n"
    files["tests/test_core.py"] = "from pkg.core import one\n\n\ndef test_one():\n    assert one() == 1\n"
    source = RepoSource(
        name="large", version="1.0",
        commits=(Commit("import", files),),
        fix={"pkg/core.py": "def add(a, b):\n    return a + b\n\n\ndef one():\n    return 1\n"},
        tests={"tests/test_core.py": files["tests/test_core.py"]
               + "\n\ndef test_add():\n    from pkg.core import add\n\n    assert add(2, 2) == 4\n"},
        problem_statement="add() subtracts", fail_to_pass=("tests/test_core.py::test_add",),
        pass_to_pass=("tests/test_core.py::test_one",),
    )
    row = build_repo(source, root / "large")
    row["repo_path"] = str(root / "large")
    return row


def docker_floor(env: SWEBenchEnv, repeats: int) -> dict[str, Any]:
    """Times of the docker operations a snapshot and a restore are made of."""
    backend = env._backend
    commit, start, exec_true = [], [], []
    for i in range(repeats):
        env.step(f"echo {i} >> README.md")
        t0 = time.perf_counter()
        state = backend.capture(warm=False)
        commit.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        box = backend._start(state.image)
        start.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        backend._exec(box, "true", 10, 1 << 20, agent=False)
        exec_true.append(time.perf_counter() - t0)
        box.remove(force=True)
        backend.release(state)
    return {"commit": ms_summary(commit), "start": ms_summary(start), "exec_true": ms_summary(exec_true)}


def bench(backend: str, rows: list[dict[str, Any]], repeats: int, idle: float = 1.0) -> dict[str, Any]:
    env = SWEBenchEnv(instances=rows, backend=backend, step_timeout=120)
    other = SWEBenchEnv(instances=rows, backend=backend, step_timeout=120)
    task = rows[0]["instance_id"]
    try:
        t0 = time.perf_counter()
        env.reset(options={"task_id": task})
        first_reset = time.perf_counter() - t0
        other.reset(options={"task_id": task})
        step, snap_t, restore_t, fork_t, reset_t, grade_t = [], [], [], [], [], []
        base = env.snapshot()
        for i in range(repeats):
            t0 = time.perf_counter()
            env.step("ls")
            step.append(time.perf_counter() - t0)
            env.step(f"echo {i} >> README.md && touch new{i}.txt")
            t0 = time.perf_counter()
            snap = env.snapshot()
            snap_t.append(time.perf_counter() - t0)
            env.step("rm -f README.md && echo x > other.txt")
            t0 = time.perf_counter()
            env.restore(snap)
            restore_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            other.restore(snap)  # fork: the same state in another env of the same kind
            fork_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            env.reset(options={"task_id": task})
            reset_t.append(time.perf_counter() - t0)
            snap.release()
        idle_t = []
        for i in range(repeats):
            env.step(f"echo {i} >> README.md")
            snap = env.snapshot()
            time.sleep(idle)
            t0 = time.perf_counter()
            env.restore(snap)
            idle_t.append(time.perf_counter() - t0)
            snap.release()
        floor = docker_floor(env, repeats) if backend == "docker" else None
        for _ in range(max(2, repeats // 5)):
            env.restore(base)
            t0 = time.perf_counter()
            for action in env.expert_actions():
                *_, info = env.step(action)
            grade_t.append(time.perf_counter() - t0)
            assert info["won"], info
        return {
            "first_reset_s": round(first_reset, 3),
            "step_ls": ms_summary(step), "snapshot": ms_summary(snap_t), "restore": ms_summary(restore_t),
            "fork": ms_summary(fork_t), "reset": ms_summary(reset_t), "gold_patch_and_grade": ms_summary(grade_t),
            "restore_after_idle": ms_summary(idle_t), "idle_s": idle,
            "snapshot_plus_restore_median_ms": round(
                1000 * (statistics.median(snap_t) + statistics.median(restore_t)), 2),
            "snapshot_plus_restore_after_idle_median_ms": round(
                1000 * (statistics.median(snap_t) + statistics.median(idle_t)), 2),
            **({"docker_floor": floor} if floor else {}),
        }
    finally:
        env.close()
        other.close()


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(1000 * xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)], 1)


def _lat(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "p50_ms": _pct(xs, 0.5), "p99_ms": _pct(xs, 0.99),
            "max_ms": round(1000 * max(xs), 1) if xs else None}


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _container_memory(container_id: str) -> int | None:
    """Bytes the container's memory cgroup holds (cgroup v1 or v2 layouts of dockerd)."""
    for path in (f"/sys/fs/cgroup/memory/docker/{container_id}/memory.usage_in_bytes",
                 f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.current",
                 f"/sys/fs/cgroup/docker/{container_id}/memory.current"):
        try:
            return int(Path(path).read_text())
        except (OSError, ValueError):
            continue
    return None


def _shim_rss() -> tuple[int, int]:
    """(number of containerd shims, their total RSS in bytes)."""
    n = total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if not (proc / "comm").read_text().startswith("containerd-shim"):
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    n += 1
        except OSError:
            continue
    return n, total


class _RetryLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:300])


def concurrency_level(rows: list[dict[str, Any]], n: int, rounds: int) -> dict[str, Any]:
    """``n`` docker envs at once, each doing ``rounds`` rounds (see the module docstring)."""
    from bpo_envs.swebench.docker_backend import check_capacity, docker_client, max_docker_calls

    check_capacity(docker_client(), n)
    task = rows[0]["instance_id"]
    retry_log = _RetryLog()
    logging.getLogger("bpo_envs.swebench").addHandler(retry_log)
    mem0, (shims0, shim_rss0) = _mem_available(), _shim_rss()
    envs: list[SWEBenchEnv] = []
    errors: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    try:
        for _ in range(n):
            env = SWEBenchEnv(instances=rows, backend="docker", step_timeout=120)
            envs.append(env)
            env.reset(options={"task_id": task})
        start_s = time.perf_counter() - t0
        lat: dict[str, list[float]] = {"step": [], "snapshot": [], "restore": []}
        lock = threading.Lock()
        barrier = threading.Barrier(n)
        counts = {"steps": 0, "rounds": 0}

        def timed(op: str, fn: Any, *args: Any) -> Any:
            t = time.perf_counter()
            out = fn(*args)
            with lock:
                lat[op].append(time.perf_counter() - t)
                if op == "step":
                    counts["steps"] += 1
            return out

        def worker(i: int, env: SWEBenchEnv) -> None:
            barrier.wait()
            for r in range(rounds):
                try:
                    timed("step", env.step, f"echo e{i}r{r} >> README.md && ls | head -3")
                    snap = timed("snapshot", env.snapshot)
                    timed("step", env.step, "rm -f README.md && echo x > other.txt")
                    timed("restore", env.restore, snap)
                    obs = timed("step", env.step, "tail -1 README.md; ls other.txt")[0]
                    if f"e{i}r{r}" not in obs or "No such file" not in obs:
                        raise AssertionError(f"the restored state is wrong: {obs[:200]!r}")
                    snap.release()
                    with lock:
                        counts["rounds"] += 1
                except Exception as exc:  # noqa: BLE001 - every error is the result
                    with lock:
                        errors.append({"env": i, "round": r, "error": f"{type(exc).__name__}: {exc}"[:500]})

        threads = [threading.Thread(target=worker, args=(i, e)) for i, e in enumerate(envs)]
        mid_mem = _mem_available()
        shims, shim_rss = _shim_rss()
        container_mem = [m for e in envs if (m := _container_memory(e._backend.container.id)) is not None]
        t1 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t1
        end_mem = _mem_available()
    finally:
        for env in envs:
            env.close()
        logging.getLogger("bpo_envs.swebench").removeHandler(retry_log)
    per_env_host = (mem0 - min(mid_mem, end_mem)) / n
    return {
        "envs": n, "rounds_per_env": rounds, "rounds_ok": counts["rounds"],
        "steps": counts["steps"], "wall_s": round(wall, 2),
        "steps_per_s": round(counts["steps"] / wall, 2),
        "start_s": round(start_s, 2),
        "step": _lat(lat["step"]), "snapshot": _lat(lat["snapshot"]), "restore": _lat(lat["restore"]),
        "memory_per_env_mib": {
            "container_cgroup_median": round(statistics.median(container_mem) / 2**20, 1) if container_mem else None,
            "containerd_shim_rss": round((shim_rss - shim_rss0) / max(shims - shims0, 1) / 2**20, 1),
            "host_available_drop": round(per_env_host / 2**20, 1),
        },
        "max_docker_calls": max_docker_calls(),
        "errors": errors, "n_errors": len(errors),
        "daemon_log": retry_log.messages[:50], "n_daemon_log": len(retry_log.messages),
    }


HOG = "for i in 1 2 3 4; do (while :; do :; done) & done; sleep {s}"
WORK = ("python3 -c \"import time; t = time.perf_counter(); sum(i * i for i in range(1500000)); "
        "print('took', time.perf_counter() - t)\"")


def _work_time(env: SWEBenchEnv) -> float:
    obs = env.step(WORK)[0]
    return float(obs.split("took", 1)[1].split()[0])


def cpu_hog(rows: list[dict[str, Any]], repeats: int = 7, cpus: float = 1.0) -> dict[str, Any]:
    """A neighbour's CPU-bound command alone, then beside a four-loop CPU hog (both ``cpus``)."""
    task = rows[0]["instance_id"]
    neighbour = SWEBenchEnv(instances=rows, backend="docker", step_timeout=120, cpus=cpus)
    hog = SWEBenchEnv(instances=rows, backend="docker", step_timeout=120, cpus=cpus)
    try:
        neighbour.reset(options={"task_id": task})
        hog.reset(options={"task_id": task})
        alone = [_work_time(neighbour) for _ in range(repeats)]
        hog_s = max(20.0, 3 * sum(alone) + 10)
        box = hog._backend.container
        thread = threading.Thread(target=hog.step, args=(HOG.format(s=hog_s),))
        thread.start()
        time.sleep(2.0)  # the loops are running
        cpu0, w0 = _cpu_usage(box.id), time.perf_counter()
        beside = [_work_time(neighbour) for _ in range(repeats)]
        cpu1, w1 = _cpu_usage(box.id), time.perf_counter()
        thread.join()
        hog_cpus = (cpu1 - cpu0) / 1e9 / (w1 - w0) if cpu0 is not None and cpu1 is not None else None
        return {
            "cpus_quota": cpus, "host_cpus": os.cpu_count(),
            "neighbour_alone_s_median": round(statistics.median(alone), 4),
            "neighbour_beside_hog_s_median": round(statistics.median(beside), 4),
            "slowdown": round(statistics.median(beside) / statistics.median(alone), 3),
            "hog_cpus_used": None if hog_cpus is None else round(hog_cpus, 3),
        }
    finally:
        neighbour.close()
        hog.close()


def _cpu_usage(container_id: str) -> int | None:
    """CPU nanoseconds the container used (cgroup v1 cpuacct or v2 cpu.stat)."""
    try:
        return int(Path(f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage").read_text())
    except (OSError, ValueError):
        pass
    for path in (f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cpu.stat",
                 f"/sys/fs/cgroup/docker/{container_id}/cpu.stat"):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith("usage_usec"):
                    return int(line.split()[1]) * 1000
        except (OSError, ValueError):
            continue
    return None


def deadline_overhead(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Per level: the step p50s with the host's deadline on and off, and on/off - 1 (of their means)."""
    out: dict[str, Any] = {}
    for n in sorted({lv["envs"] for lv in levels}):
        p50 = {mode: [lv["step"]["p50_ms"] for lv in levels
                      if lv["envs"] == n and lv.get("host_deadline") == mode and "step" in lv]
               for mode in ("on", "off")}
        if p50["on"] and p50["off"]:
            out[f"{n}_envs"] = {"step_p50_ms_on": p50["on"], "step_p50_ms_off": p50["off"],
                                "p50_overhead": round(statistics.mean(p50["on"]) / statistics.mean(p50["off"]) - 1, 3)}
    return out


def concurrency_main(args: argparse.Namespace) -> None:
    from bpo_envs.swebench.images import build_test_image, verified_row

    source = bundled_instances()[0]
    build_test_image(source)
    rows = [verified_row(source)]
    out: dict[str, Any] = {
        "image": "official-layout test image (sweb.eval.x86_64.bpo-gym__textkit-1)",
        "host_cpus": os.cpu_count(), "host_mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "load_avg_at_start": os.getloadavg(), "levels": [],
    }
    from bpo_envs.swebench.docker_backend import DockerBackend

    modes = [None] if not args.deadlines else (
        args.deadlines if len(args.deadlines) == 1 else [*args.deadlines, *reversed(args.deadlines)])
    for n, mode in [(n, mode) for n in args.concurrency for mode in modes]:
        if mode is not None:
            DockerBackend._host_deadline = mode == "on"
        try:
            level = concurrency_level(rows, n, args.rounds)
        except RuntimeError as exc:  # a concurrency the host cannot start: the error names the limit
            level = {"envs": n, "error": str(exc)}
        finally:
            DockerBackend._host_deadline = True
        level["host_deadline"] = mode or "on"
        level["load_avg_after"] = os.getloadavg()
        out["levels"].append(level)
        if "error" in level:
            print(f"{n:3d} envs: {level['error']}")
        else:
            print(f"{n:3d} envs, deadlines {level['host_deadline']}: {level['steps_per_s']:6.2f} steps/s  "
                  f"step p50/p99 {level['step']['p50_ms']}/"
                  f"{level['step']['p99_ms']} ms  snapshot {level['snapshot']['p50_ms']}/{level['snapshot']['p99_ms']}"
                  f" ms  restore {level['restore']['p50_ms']}/{level['restore']['p99_ms']} ms  mem/env "
                  f"{level['memory_per_env_mib']}  errors {level['n_errors']}", flush=True)
        Path(args.out).write_text(json.dumps(out, indent=2))
    if args.deadlines and len(args.deadlines) == 2:
        out["deadline_overhead"] = deadline_overhead(out["levels"])
        print(f"host deadline: {out['deadline_overhead']}")
    if args.cpu_hog:
        out["cpu_hog"] = [cpu_hog(rows, cpus=1.0), cpu_hog(rows, cpus=float(os.cpu_count() or 1))]
        for r in out["cpu_hog"]:
            print(f"cpu hog (cpus={r['cpus_quota']}): neighbour {r['neighbour_alone_s_median']} s alone, "
                  f"{r['neighbour_beside_hog_s_median']} s beside the hog (x{r['slowdown']}); hog used "
                  f"{r['hog_cpus_used']} CPUs")
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", "--backend", nargs="+", default=["local"], choices=["local", "docker"])
    parser.add_argument("--concurrency", nargs="+", type=int,
                        help="docker: envs in flight at once, one level each (see the module docstring)")
    parser.add_argument("--rounds", type=int, default=8, help="--concurrency: rounds per env")
    parser.add_argument("--cpu-hog", action="store_true", help="--concurrency: add the CPU-hog neighbour test")
    parser.add_argument("--deadlines", nargs="+", choices=["on", "off"],
                        help="--concurrency: with and/or without the host's deadline (see the module docstring)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--repos", nargs="+", default=["small", "large"],
                        choices=["small", "large", "official"])
    parser.add_argument("--idle", type=float, default=1.0,
                        help="seconds between a snapshot and the restore of restore_after_idle")
    parser.add_argument("--out", default="bench_swebench.json")
    args = parser.parse_args()
    if args.concurrency:
        if args.backends != ["docker"]:
            parser.error("--concurrency is for --backend docker")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        concurrency_main(args)
        return
    results: dict[str, Any] = {"repeats": args.repeats, "results": {}}
    with tempfile.TemporaryDirectory(prefix="bpo-swe-bench-") as tmp:
        repos = {}
        if "small" in args.repos:
            repos["small (textkit, 8 files)"] = [bundled_instances()[0]]
        if "large" in args.repos:
            repos["large (6,800 files, Django-size)"] = [large_row(Path(tmp))]
        for backend in args.backends:
            todo = dict(repos)
            if backend == "docker" and "official" in args.repos:
                try:
                    from bpo_envs.swebench.images import build_test_image, verified_row

                    source = bundled_instances()[0]
                    build_test_image(source)
                    todo["official (textkit, official-layout test image)"] = [verified_row(source)]
                except RuntimeError as exc:
                    results["results"][f"{backend} / official"] = {"error": str(exc)}
            for name, rows in todo.items():
                key = f"{backend} / {name}"
                try:
                    results["results"][key] = bench(backend, rows, args.repeats, args.idle)
                except RuntimeError as exc:  # e.g. no Docker daemon
                    results["results"][key] = {"error": str(exc)}
                r = results["results"][key]
                if "error" in r:
                    print(f"{key}: skipped: {r['error']}")
                    continue
                print(f"{key}: step(ls) {r['step_ls']['median_ms']} ms, snapshot "
                      f"{r['snapshot']['median_ms']} ms, restore {r['restore']['median_ms']} ms, "
                      f"fork {r['fork']['median_ms']} ms, reset {r['reset']['median_ms']} ms, "
                      f"gold+grade {r['gold_patch_and_grade']['median_ms']} ms, snapshot+restore "
                      f"{r['snapshot_plus_restore_median_ms']} ms (after {args.idle:g} s idle: "
                      f"{r['snapshot_plus_restore_after_idle_median_ms']} ms)")
                if "docker_floor" in r:
                    f = r["docker_floor"]
                    print(f"  docker floor: commit {f['commit']['median_ms']} ms, start "
                          f"{f['start']['median_ms']} ms, exec(true) {f['exec_true']['median_ms']} ms")
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    bpo_envs.register_envs()
    main()
