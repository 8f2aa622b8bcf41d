"""A process that holds a SWE-bench env with three snapshots, then waits to be killed.

    python tests/swebench_crash_child.py docker|local

Prints one JSON line (its pid, run id, run folder, and for local its pids cgroup) once the env
and its snapshots exist; docker: then sleeps; local: then runs ``sleep 600`` as a step, so a
sandbox process is running when it is killed.
"""

from __future__ import annotations

import json
import sys
import time

import gymnasium as gym

import bpo_envs  # noqa: F401 - registers the ids
from bpo_envs.swebench import owners


def main(backend: str) -> None:
    env = gym.make("BPO-SWEBench-v0", backend=backend, step_timeout=900)
    env.reset(seed=0)
    snaps = []
    for i in range(3):
        env.step(f"echo {i} >> notes.txt")
        snaps.append(env.unwrapped.snapshot())
    sandbox = getattr(env.unwrapped._backend, "sandbox", None)
    cgroup = str(sandbox.cgroup.path) if sandbox is not None and sandbox.cgroup is not None else None
    print(json.dumps({"pid": owners.os.getpid(), "run": owners.run_id(), "run_dir": str(owners.run_dir()),
                      "cgroup": cgroup}), flush=True)
    if backend == "local":
        env.step("sleep 600")
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1])
