"""Which rows grade the same offline: each bundled row, and textkit in the official-layout test
image, graded with its gold patch on docker with ``grading_network=False`` (the default) and
``True``::

    python studies/swebench_offline_grading.py --out docs/results/swebench-hostile/offline-grading.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bpo_envs.swebench import SWEBenchEnv, bundled_instances
from bpo_envs.swebench.images import build_test_image, verified_row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = bundled_instances()
    build_test_image(rows[0])
    out: dict = {"load_avg_at_start": os.getloadavg(), "results": []}
    for label, subset in (("bundled", rows), ("official-layout", [verified_row(rows[0])])):
        for network in (False, True):
            env = SWEBenchEnv(instances=subset, backend="docker", grading_network=network, step_timeout=30)
            try:
                for row in subset:
                    env.reset(options={"task_id": row["instance_id"]})
                    t0 = time.perf_counter()
                    for action in env.expert_actions():
                        *_, info = env.step(action)
                    res = {"rows": label, "instance_id": row["instance_id"], "grading_network": network,
                           "resolved": info["resolved"], "fail_to_pass": info["fail_to_pass"],
                           "pass_to_pass": info["pass_to_pass"], "seconds": round(time.perf_counter() - t0, 1)}
                    out["results"].append(res)
                    print(res, flush=True)
            finally:
                env.close()
    same = {}
    for res in out["results"]:
        same.setdefault((res["rows"], res["instance_id"]), set()).add(
            (res["resolved"], res["fail_to_pass"], res["pass_to_pass"]))
    out["same_offline"] = {f"{rows_}:{iid}": len(v) == 1 for (rows_, iid), v in same.items()}
    out["load_avg_at_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(out["same_offline"])


if __name__ == "__main__":
    main()
