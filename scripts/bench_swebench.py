"""Benchmark BPO-SWEBench-v0: step latency, snapshot, restore, fork and grading, per backend.

Two repos: the bundled ``textkit`` (small) and a generated repo of Django's size (6,800 files
in 700 folders). Writes JSON (medians and all samples) and prints a summary::

    python scripts/bench_swebench.py --backends local docker --repeats 15 --out bench_swebench.json
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
from bpo_envs.bench import ms_summary
from bpo_envs.swebench import SWEBenchEnv, bundled_instances
from bpo_envs.swebench.bundled import Commit, RepoSource, build_repo


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


def bench(backend: str, rows: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
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
            "snapshot_plus_restore_median_ms": round(
                1000 * (statistics.median(snap_t) + statistics.median(restore_t)), 2),
        }
    finally:
        env.close()
        other.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["local"], choices=["local", "docker"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--repos", nargs="+", default=["small", "large"], choices=["small", "large"])
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
            for name, rows in repos.items():
                key = f"{backend} / {name}"
                try:
                    results["results"][key] = bench(backend, rows, args.repeats)
                except RuntimeError as exc:  # e.g. no Docker daemon
                    results["results"][key] = {"error": str(exc)}
                r = results["results"][key]
                if "error" in r:
                    print(f"{key}: skipped: {r['error']}")
                    continue
                print(f"{key}: step(ls) {r['step_ls']['median_ms']} ms, snapshot "
                      f"{r['snapshot']['median_ms']} ms, restore {r['restore']['median_ms']} ms, "
                      f"fork {r['fork']['median_ms']} ms, reset {r['reset']['median_ms']} ms, "
                      f"gold+grade {r['gold_patch_and_grade']['median_ms']} ms")
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    bpo_envs.register_envs()
    main()
