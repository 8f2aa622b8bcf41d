"""Wall time of ``bpo-compare`` with ``--jobs 1`` and ``--jobs N`` on the same small setting.

Runs the comparison twice into fresh folders, checks that the two ``results.json`` agree (the
wall-clock fields aside) and writes the wall times and their ratio as JSON::

    python benchmarks/bench_jobs.py --jobs 2 --out docs/results/bench-jobs/results.json -- \\
        --envs webshop --seeds 0 1 --algorithms bpo rloo frozen reinforce --updates 6 --eval-every 3 --grad-seeds 0

Everything after ``--`` is passed to ``bpo-compare`` (default: the smoke preset).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if "seconds" not in k and k != "timing"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--out", default="docs/results/bench-jobs/results.json")
    parser.add_argument("compare_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    from bpo_experiments import compare

    extra = [a for a in args.compare_args if a != "--"] or ["--smoke"]
    walls: dict[str, float] = {}
    saved: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for jobs in (1, args.jobs):
            out = Path(tmp) / f"jobs{jobs}"
            start = time.perf_counter()
            compare.main([*extra, "--out", str(out), "--jobs", str(jobs), "--no-progress"])
            walls[str(jobs)] = time.perf_counter() - start
            saved[str(jobs)] = json.loads((out / "results.json").read_text())
            shutil.rmtree(out / "runs", ignore_errors=True)
    same = json.dumps(_strip(saved["1"]), sort_keys=True) == json.dumps(_strip(saved[str(args.jobs)]), sort_keys=True)
    result = {
        "compare_args": extra,
        "cpu_count": os.cpu_count(),
        "wall_seconds": walls,
        "speedup": walls["1"] / walls[str(args.jobs)],
        "runs": sum(len(e["algorithms"]) * len(e["seeds"]) for e in saved["1"]["per_env"].values()),
        "results_identical": same,
        "load_average_1min_at_end": os.getloadavg()[0],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
