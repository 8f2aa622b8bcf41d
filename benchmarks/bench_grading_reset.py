"""Gold patches under the test-machinery reset: every bundled row (and, on docker, the
official-layout row) graded with its gold patch on each backend, with the grading step's time
(docs/reliability.md, "Reward tampering"). ``--code DIR`` grades with another checkout's code
(the time before the reset)::

    python benchmarks/bench_grading_reset.py --out docs/results/swebench-hostile/gold-after.json
    python benchmarks/bench_grading_reset.py --code CHECKOUT_BEFORE --out docs/results/swebench-hostile/gold-before.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import json, sys, time
from bpo_envs.swebench import SWEBenchEnv, bundled_instances
from bpo_envs.swebench.images import build_test_image, verified_row
backend, repeats = sys.argv[1], int(sys.argv[2])
rows = bundled_instances()
sets = [("bundled", rows)]
if backend == "docker":
    build_test_image(rows[0])
    sets.append(("official-layout", [verified_row(rows[0])]))
for label, subset in sets:
    env = SWEBenchEnv(instances=subset, backend=backend, step_timeout=30)
    try:
        for row in subset:
            times = []
            for _ in range(repeats):
                env.reset(options={"task_id": row["instance_id"]})
                *edits, submit = env.expert_actions()
                for action in edits:
                    env.step(action)
                t0 = time.perf_counter()
                obs, reward, terminated, truncated, info = env.step(submit)
                times.append(round(time.perf_counter() - t0, 2))
            print(json.dumps({"rows": label, "instance_id": row["instance_id"], "reward": reward,
                              "fail_to_pass": info["fail_to_pass"], "pass_to_pass": info["pass_to_pass"],
                              "tampered": info.get("tampered"), "grading_s": times}), flush=True)
    finally:
        env.close()
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["local", "docker"], choices=["local", "docker"])
    parser.add_argument("--code", default=str(Path(__file__).resolve().parents[1]),
                        help="the checkout whose code grades")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    git = subprocess.run(["git", "-C", args.code, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out: dict = {"code": args.code, "commit": git.stdout.strip(), "repeats": args.repeats,
                 "load_avg_at_start": os.getloadavg(), "results": {}}
    for backend in args.backends:
        proc = subprocess.run([sys.executable, "-c", CHILD, backend, str(args.repeats)], cwd=args.code,
                              env={**os.environ, "PYTHONPATH": args.code}, capture_output=True, text=True)
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        out["results"][backend] = rows
        if proc.returncode != 0:
            out["results"][backend + "_error"] = proc.stderr[-2000:]
        for row in rows:
            print(backend, row, flush=True)
    out["load_avg_at_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
