"""Does the docker backend return every byte a command printed when the host's CPUs are busy?

``check_snapshot`` on ``BPO-SWEBench-v0`` (docker backend) replays each recorded step after a
restore and compares the observations; a step whose output came back cut or lost in one of the
two runs fails it. Beside ``--burners`` processes that spin the CPUs, each of ``--runs`` checks
makes a fresh env, runs ``check_snapshot(seed=1, steps=4, detour=2)`` on the ``intervals`` row,
and records whether it passed and, if not, the checker's message. Writes JSON::

    python studies/docker_output_race.py --runs 12 --burners 3 --out /tmp/docker-race.json

Found (docs/setup.md, "CI time"): 1 failure in 12 with 3 burners on the 2-core machine, a
20,000-character ``printf`` whose replayed output differed from the recorded one; in one process
with nothing beside it the check passes. The cause (the wrapper's output pipe, the reaping of a
step's processes, or the daemon's attach stream) is not found yet.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path


def _burn(stop: mp.synchronize.Event) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--burners", type=int, default=3, help="CPU-spinning processes beside the checks")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: print)")
    args = parser.parse_args()

    import bpo_envs
    from bpo_envs.swebench.env import SWEBenchEnv

    stop = mp.Event()
    burners = [mp.Process(target=_burn, args=(stop,), daemon=True) for _ in range(args.burners)]
    for p in burners:
        p.start()
    runs = []
    try:
        for i in range(args.runs):
            env = SWEBenchEnv(backend="docker")
            started = time.monotonic()
            try:
                bpo_envs.check_snapshot(env, seed=1, steps=4, detour=2,
                                        options={"task_id": "bpo-gym__intervals-1"})
                runs.append({"run": i, "passed": True, "seconds": time.monotonic() - started})
            except bpo_envs.SnapshotCheckError as exc:
                runs.append({"run": i, "passed": False, "seconds": time.monotonic() - started,
                             "message": str(exc)[:400]})
            finally:
                env.close()
            print(json.dumps(runs[-1])[:200], flush=True)
    finally:
        stop.set()
        for p in burners:
            p.join()
    result = {"runs": runs, "failures": sum(not r["passed"] for r in runs), "burners": args.burners,
              "cpu_count": os.cpu_count(), "load_average": list(os.getloadavg())}
    text = json.dumps(result, indent=1)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
