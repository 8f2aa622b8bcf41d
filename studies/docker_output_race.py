"""Does the docker backend return every byte a command printed when the host's CPUs are busy?

``check_snapshot`` on ``BPO-SWEBench-v0`` (docker backend) replays each recorded step after a
restore and compares the observations; a step whose output came back cut or lost in one of the
two runs fails it. Beside ``--burners`` processes that spin the CPUs, each of ``--runs`` checks
makes a fresh env, runs ``check_snapshot(seed=1, steps=4, detour=2)`` on the ``intervals`` row,
and records whether it passed and, if not, the checker's message. ``--reader docker-py`` reads
each step's output with docker-py's own ``exec_start(stream=True)``, as the backend did before
(the "before" side). Writes JSON::

    python studies/docker_output_race.py --runs 40 --burners 3 --out /tmp/docker-race.json

Found (docs/setup.md, "CI time"): with docker-py's reader, 1 failure in 12 runs with 3 burners
on the 2-core machine (a 20,000-character ``printf`` whose replayed output differed), and the
parallel test suite's failures (a step's whole output missing: ``[exit code: 0]`` against a file
list). The cause: docker-py reads the exec's frames from the raw socket under the HTTP
response, while http.client read the response's headers through a buffered reader that takes
up to 8 KiB at once; when the command had printed before the client's thread read the headers
(it was not scheduled while the daemon started the exec), the first frames were in that buffer
and were dropped: all of a short output, the first 8 KiB of a long one. The fix reads the
frames through that buffered reader (``bpo_envs.swebench.daemon.exec_output``);
``tests/test_swebench_exec_stream.py`` and ``tests/test_swebench_docker.py`` force the late
read. Results: ``docs/results/ci-time/docker-output-race-*.json``.
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
    parser.add_argument("--reader", choices=("exec_output", "docker-py"), default="exec_output",
                        help="how a step's output is read: the backend's (default) or docker-py's "
                             "exec_start(stream=True), as before the fix")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: print)")
    args = parser.parse_args()

    import bpo_envs
    from bpo_envs.swebench import docker_backend
    from bpo_envs.swebench.env import SWEBenchEnv

    if args.reader == "docker-py":
        docker_backend.exec_output = lambda api, exec_id: docker_backend.docker_call(
            api.exec_start, exec_id, stream=True)
    load_before = list(os.getloadavg())

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
    result = {"reader": args.reader, "runs": runs, "failures": sum(not r["passed"] for r in runs),
              "burners": args.burners, "cpu_count": os.cpu_count(),
              "load_average_1_5_15": {"start": load_before, "end": list(os.getloadavg())}}
    text = json.dumps(result, indent=1)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
