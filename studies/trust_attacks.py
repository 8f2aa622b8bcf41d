"""Run the attacks of docs/snapshots.md#trust and the local sandbox's limits (docs/envs.md) as a
user or an agent would, and record what each one got and how long the answer took.

Each attack is self-contained and works against older versions of the package too (run it with
``PYTHONPATH`` pointing at another checkout to measure "before"):

    python studies/trust_attacks.py --label after --out docs/results/trust
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Payload:
    """Unpickling this creates ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def _pickle_attack(call: Callable[[bytes], Any]) -> dict[str, Any]:
    marker = tempfile.mktemp(prefix="bpo-pwned-")
    t0 = time.perf_counter()
    try:
        call(pickle.dumps(Payload(marker)))
        error = None
    except Exception as exc:  # noqa: BLE001 - recorded
        error = f"{type(exc).__name__}: {str(exc)[:160]}"
    out = {"payload_ran": os.path.exists(marker), "error": error, "seconds": round(time.perf_counter() - t0, 4)}
    if os.path.exists(marker):
        os.unlink(marker)
    return out


def pickles() -> dict[str, Any]:
    import gymnasium as gym

    import bpo_envs

    out = {}
    for name, kwargs in (("BPO-TreeMDP-v0", {"depth": 3, "n_actions": 2, "seed": 0}), ("BPO-WebShop-v0", {})):
        env = gym.make(name, **kwargs)
        env.reset(seed=0)
        out[f"restore {name}"] = _pickle_attack(lambda blob, env=env: bpo_envs.restore(env, blob))
    from bpo_envs.integrations import trl

    tool = trl.environment_factory("BPO-WebShop-v0")()
    out["TRL state column"] = _pickle_attack(lambda blob: tool.reset(state=blob))
    try:
        from bpo_envs.integrations import skyrl

        out["SkyRL extras['state']"] = _pickle_attack(
            lambda blob: skyrl.SkyRLEnv({"env_id": "BPO-WebShop-v0"}, {"state": blob}).init([]))
    except ImportError as exc:
        out["SkyRL extras['state']"] = {"skipped": str(exc)}
    from bpo_algos.checkpoints import load_checkpoint

    def checkpoint(blob: bytes) -> None:
        path = Path(tempfile.mkdtemp()) / "checkpoint.pt"
        path.write_bytes(blob)
        load_checkpoint(None, path)

    out["checkpoint.pt"] = _pickle_attack(checkpoint)
    try:
        from bpo_envs.alfworld import ALFWorldEnv, _upstream

        env = ALFWorldEnv(games_per_type=1)
        task = env.task_ids()[0]
        game_path = env.games.game_path(task)
        beside = Path(str(game_path) + ".translated.pkl")

        def translation(blob: bytes) -> None:
            beside.write_bytes(blob)
            _upstream.clear_translation_cache()
            try:
                env.reset(options={"task_id": task})
            finally:
                beside.unlink()

        out["ALFWorld .translated.pkl beside the game"] = _pickle_attack(translation)
        env.close()
    except ImportError as exc:
        out["ALFWorld .translated.pkl beside the game"] = {"skipped": str(exc)}
    return out


def threads() -> dict[str, Any]:
    import bpo_envs

    class Slow(bpo_envs.TreeMDPEnv):
        def _step(self, action: str) -> Any:
            time.sleep(0.2)
            return super()._step(action)

    env = Slow(depth=4, n_actions=2, seed=0)
    env.reset(seed=0)
    errors: list[str] = []

    def step() -> None:
        try:
            env.step("a0")
        except Exception as exc:  # noqa: BLE001 - recorded
            errors.append(type(exc).__name__)

    workers = [threading.Thread(target=step) for _ in range(2)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"two threads step one env": {"errors": errors, "steps_taken": env.elapsed_steps,
                                         "seconds": round(time.perf_counter() - t0, 3)}}


def compare_resume() -> dict[str, Any]:
    out = Path(tempfile.mkdtemp()) / "cmp"
    args = ["--smoke", "--envs", "treemdp", "--algorithms", "bpo", "rloo", "--seeds", "0", "--updates", "1", "--budget", "100",
            "--grad-batches", "2", "--no-progress", "--jobs", "1", "--out", str(out)]
    cmd = [sys.executable, "-m", "bpo_experiments.compare", *args]
    subprocess.run(cmd, capture_output=True, check=True)
    run_json = out / "runs" / "treemdp" / "rloo" / "seed0" / "run.json"
    run_json.write_bytes(run_json.read_bytes()[:20])
    t0 = time.perf_counter()
    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True)
    tail = (done.stderr.strip().splitlines() or [""])[-1]
    named = [line for line in done.stderr.splitlines() if "corrupt" in line]
    result = {"--resume over a truncated run.json": {"exit_code": done.returncode, "said": (named or [tail])[0][:200],
                                                     "seconds": round(time.perf_counter() - t0, 2)}}
    holder = subprocess.Popen([*cmd, "--resume"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)  # the first one is running
    t0 = time.perf_counter()
    second = subprocess.run([*cmd, "--resume"], capture_output=True, text=True)
    holder.wait()
    result["a second bpo-compare on the same --out"] = {
        "exit_code": second.returncode, "said": (second.stderr.strip().splitlines() or [""])[-1][:200],
        "seconds": round(time.perf_counter() - t0, 2)}
    return result


_HOGS = ("for i in 1 2 3 4; do python -c 'import time; b = bytearray(250 << 20); b[::4096] = b\"x\" * len(b[::4096]); "
         "time.sleep(3); print(\"HELD\", flush=True)' & done; wait")


def sandbox() -> dict[str, Any]:
    import gymnasium as gym

    import bpo_envs  # noqa: F401
    from bpo_envs.swebench import local

    limits = dict(cpu_seconds=20, memory_bytes=384 << 20, max_processes=64, max_file_bytes=64 << 20, disk_quota_bytes=64 << 20)
    env = gym.make("BPO-SWEBench-v0", step_timeout=30, **limits)
    out: dict[str, Any] = {}

    def attack(name: str, command: str, judge: Callable[[str], Any]) -> None:
        env.reset(options={"task_id": "bpo-gym__textkit-1"})
        t0 = time.perf_counter()
        obs, _, _, _, info = env.step(command)
        out[name] = {"result": judge(obs), "exit_code": info.get("exit_code"), "seconds": round(time.perf_counter() - t0, 2),
                     "observation_tail": obs[-160:]}

    attack("4 processes x 250 MB under a 384 MiB limit", _HOGS, lambda o: f"{o.splitlines().count('HELD')} of 4 held their memory")
    attack("unshare -U", "unshare -U id", lambda o: "a new user namespace" if "uid=" in o else "refused")
    attack("100,000 empty files, 64 MiB quota", "mkdir many && cd many && python -c 'import os\nfor i in range(100_000): open(str(i), \"w\").close()'",
           lambda o: "over quota, undone" if "quota exceeded" in o else "allowed")
    attack("80 MB in a chmod 000 folder, 64 MiB quota",
           "mkdir vault && head -c 40000000 /dev/urandom > vault/a && head -c 40000000 /dev/urandom > vault/b; chmod 000 vault",
           lambda o: "over quota, undone" if "quota exceeded" in o else "allowed")
    local.ObjectStore.PRUNE_GRACE = "now"  # one thread writes here: no object is in flight
    store = env.unwrapped._backend.store.path / "objects"
    env.reset(options={"task_id": "bpo-gym__textkit-1"})
    start = local.disk_usage(store)
    t0 = time.perf_counter()
    for i in range(48):
        env.step(f"head -c 1000000 /dev/urandom > blob{i % 3}.bin")
        env.unwrapped.snapshot().release()
    out["48 x (write 1 MB, snapshot, release)"] = {"store_growth_bytes": local.disk_usage(store) - start,
                                                   "seconds": round(time.perf_counter() - t0, 2),
                                                   "note": "prune grace set to 0 (one thread); the default 2 min keeps younger objects"}
    env.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", required=True, help="before | after (names the JSON)")
    parser.add_argument("--out", default="docs/results/trust")
    parser.add_argument("--skip", nargs="*", default=(), choices=("pickles", "threads", "compare", "sandbox"))
    args = parser.parse_args()
    result: dict[str, Any] = {"label": args.label, "load": os.getloadavg(), "cpus": os.cpu_count()}
    for name, fn in (("pickles", pickles), ("threads", threads), ("compare", compare_resume), ("sandbox", sandbox)):
        if name not in args.skip:
            result[name] = fn()
    result["load_after"] = os.getloadavg()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"attacks-{args.label}.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
