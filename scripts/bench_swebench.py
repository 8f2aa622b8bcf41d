"""Benchmark BPO-SWEBench-v0: step latency, snapshot, restore, fork and grading, per backend.

Repos: the bundled ``textkit`` (small), a generated repo of Django's size (6,800 files in 700
folders) and, for docker, ``official``: textkit in the small offline test image in the official
layout (``sweb.eval.x86_64.bpo-gym__textkit-1``, its ``.bashrc`` sourced per command). Writes
JSON (medians and all samples) and prints a summary::

    python scripts/bench_swebench.py --backends local docker --repeats 15 --out bench_swebench.json

Docker restores take a warm container (started in the background after the snapshot);
``restore_after_idle`` restores ``--idle`` seconds after the snapshot (the policy's think time),
``restore`` right after one step. ``docker_floor`` times the parts each one is made of on this
engine: ``commit`` (a snapshot: the writable layer as an image), ``start`` (create + start a
container: a cold restore) and ``exec_true`` (one ``docker exec`` round trip).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["local"], choices=["local", "docker"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--repos", nargs="+", default=["small", "large"],
                        choices=["small", "large", "official"])
    parser.add_argument("--idle", type=float, default=1.0,
                        help="seconds between a snapshot and the restore of restore_after_idle")
    parser.add_argument("--out", default="bench_swebench.json")
    args = parser.parse_args()
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
