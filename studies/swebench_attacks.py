"""A hostile agent's commands against BPO-SWEBench-v0: how each is answered and how long it takes.

Each attack runs in a child process (so that code that never answers is timed out, not waited
for) that makes an env (``step_timeout=5``, ``eval_timeout=5`` for the grading attacks), writes a
file, sends the attack, then ``cat`` of the file: the answer (an observation, an exception, or
none within ``--cap`` seconds), its time, and whether the next step worked with the file kept.
The tampering attacks (:data:`TAMPERING`, ``--tampering``) change how the tests run instead of
the code and are answered by grading (the reward and ``info["tampered"]``), next to the gold
patch as the control. ``--code DIR`` runs the children on another checkout's code (the
``before`` column of ``docs/reliability.md``)::

    python studies/swebench_attacks.py --backends local docker \
        --out docs/results/swebench-hostile/attacks.json

``--sandbox`` runs only the attacks on the host's side of a step (``SANDBOX_ATTACKS``: sparse
files, 3,000 nested folders, 150,000 files, FIFOs and sockets, ``/etc/shadow``, crafted portable
bytes, ``bpo-gym-setup clean`` after a crash); their children also time a snapshot after the next
step (what the engine does next), ``close()``, and check that the run folder is gone after exit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bpo_envs.swebench import tampering_attacks

ATTACKS = {
    "SIGSTOP of every process": "kill -STOP -1; sleep 999",
    "fork bomb": ":(){ :|:& };:",
    "fork bomb, its timeout frozen": "kill -STOP -1; :(){ :|:& };:; sleep 999",
    "a process ignoring SIGTERM": "trap '' TERM INT HUP; sleep 999",
    "endless output": "yes",
    "endless slow output": "while :; do echo line; sleep 0.001; done",
    "kill -9 -1": "kill -9 -1",
    "kill 1": "kill 1",
    "exit": "exit 3",
    "killing the shell": "kill -9 $$",
    "grading: the patch freezes every process": (
        "grade", "import os, signal, time\nos.kill(-1, signal.SIGSTOP)\ntime.sleep(999)\n"),
    "grading: the patch kills every process": ("grade", "import os\nos.kill(-1, 9)\nos.kill(1, 9)\n"),
}
SANDBOX_ATTACKS = {
    # host-side work (docs/reliability.md#the-host-side-of-a-step): apparent sizes, tree shapes
    "four sparse 1 GiB files": "truncate -s 1G s1 s2 s3 s4; ls -ls s1",
    "one sparse 1 GiB file": "truncate -s 1G s1; ls -ls s1",
    "3,000 nested folders": "mkdir -p $(printf 'd/%.0s' $(seq 3000)) && echo made",
    "a 150,000-file folder": ("python3 -c \"import os; os.mkdir('many'); "
                              "[open(f'many/{i}', 'w').close() for i in range(150000)]\" && echo made"),
    "a FIFO, a socket, 255-byte names": (
        "mkfifo fifo; python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"; "
        "touch $(printf 'n%.0s' $(seq 255)); mkdir -p $(printf 'm%.0s' $(seq 255))/$(printf 'k%.0s' $(seq 255)); "
        "ls -F | head -5"),
    "reading /etc/shadow": "cat /etc/shadow | head -3; ls /etc/ssh/ 2>&1 | head -3",
    # not a command: portable() bytes whose tree holds a link to a host folder and an
    # "empty folder" listed below it
    "restore: crafted portable bytes": ("restore", "crafted-link"),
    # not a command: the env's process is killed after 3,000 nested folders; bpo-gym-setup clean
    "bpo-gym-setup clean after a crash with a deep tree": ("clean", "mkdir -p $(printf 'd/%.0s' $(seq 3000))"),
}
ATTACKS.update(SANDBOX_ATTACKS)

CHILD = r'''
import json, os, sys, time
import gymnasium as gym
import bpo_envs
from bpo_envs.swebench import bundled_instances
from bpo_envs.swebench.owners import run_dir
backend, attack = sys.argv[1], json.loads(sys.argv[2])
env = gym.make("BPO-SWEBench-v0", backend=backend, step_timeout=5, eval_timeout=5,
               instances=[r for r in bundled_instances()
                          if r["instance_id"] == "bpo-gym__textkit-1"])
env.reset(options={"task_id": "bpo-gym__textkit-1"})
env.step("echo kept > kept.txt")
print(json.dumps({"run_dir": str(run_dir())}), flush=True)
kind = attack[0] if isinstance(attack, list) else "step"
if kind == "clean":  # the parent kills this process during the next step, then cleans up
    env.step(attack[1])
    print(json.dumps({"ready": True}), flush=True)
    env.step("sleep 999")
if kind == "restore":
    out = {"answer": "observation"}
    import tempfile
    from bpo_envs import portable
    from bpo_envs.core import PORTABLE_FORMAT
    host = tempfile.mkdtemp(prefix="bpo-attack-host-")
    env.step(f"ln -s {host} escape")
    blob = env.unwrapped.snapshot().portable()
    payload = portable.loads(blob, PORTABLE_FORMAT)
    def plant(node):
        if isinstance(node, dict) and "empty_dirs" in node:
            node["empty_dirs"] = (*node["empty_dirs"], "escape/made-by-restore")
            return True
        items = node.values() if isinstance(node, dict) else node if isinstance(node, (list, tuple)) else ()
        return any(plant(v) for v in items)
    out["planted"] = plant(payload)
    crafted = portable.dumps(PORTABLE_FORMAT, payload)
    t0 = time.monotonic()
    try:
        env.unwrapped.restore(crafted)
        out["answer"] = "restored"
    except Exception as exc:
        out["answer"] = "raised"
        out["error"] = f"{type(exc).__name__}: {exc}"[:400]
    out["seconds"] = round(time.monotonic() - t0, 2)
    out["host_written"] = os.path.exists(os.path.join(host, "made-by-restore"))
    os.system(f"rm -rf {host}")
    action = "cat kept.txt"
else:
    if kind == "grade":
        # where the tests import it (a conftest.py would be reset before grading)
        env.step("cat >> textkit/__init__.py <<'EOF'\n" + attack[1] + "EOF")
        action = "submit"
    else:
        action = attack
    print(json.dumps({"sent": True}), flush=True)
    t0 = time.monotonic()
    try:
        obs, reward, terminated, truncated, info = env.step(action)
        out = {"answer": "observation", "timed_out": info.get("timed_out"), "obs_tail": obs[-240:]}
    except Exception as exc:
        out = {"answer": "raised", "error": f"{type(exc).__name__}: {exc}"[:400]}
    out["seconds"] = round(time.monotonic() - t0, 2)
print(json.dumps({"stage": "attack answered", **out}), flush=True)
if action == "submit" and out["answer"] == "observation":
    out["next_step_ok"] = None
else:
    t0 = time.monotonic()
    try:
        out["next_step_ok"] = "kept" in env.step("cat kept.txt")[0]
    except Exception as exc:
        out["next_step_ok"] = False
        out["next_step_error"] = f"{type(exc).__name__}: {exc}"[:400]
    out["next_step_seconds"] = round(time.monotonic() - t0, 2)
    print(json.dumps({"stage": "next step answered", **out}), flush=True)
    t0 = time.monotonic()  # what the engine does next: a snapshot (it reads what the attack left)
    try:
        env.unwrapped.snapshot().release()
        out["snapshot_seconds"] = round(time.monotonic() - t0, 2)
    except Exception as exc:
        out["snapshot_error"] = f"{type(exc).__name__}: {exc}"[:300]
t0 = time.monotonic()
try:
    env.close()
    out["close"] = "ok"
except Exception as exc:
    out["close"] = f"{type(exc).__name__}: {exc}"[:200]
out["close_seconds"] = round(time.monotonic() - t0, 2)
print(json.dumps({"stage": "closed", **out}), flush=True)
'''


def _clean_after_crash(proc: subprocess.Popen, env: dict, code: str, cap: float) -> dict:
    """Kill the child once it made its tree (SIGKILL: nothing of it cleans up), then time
    ``bpo-gym-setup clean --no-docker`` and check that the child's run folder is gone."""
    assert proc.stdout is not None
    run_folder = None
    deadline = time.monotonic() + cap + 30
    for line in proc.stdout:
        if line.startswith("{"):
            msg = json.loads(line)
            run_folder = msg.get("run_dir", run_folder)
            if msg.get("ready") or time.monotonic() > deadline:
                break
    time.sleep(0.5)
    os.killpg(proc.pid, 9)
    proc.communicate()
    t0 = time.monotonic()
    try:
        clean = subprocess.run([sys.executable, "-m", "bpo_envs.system", "clean", "--no-docker"], cwd=code,
                               env=env, capture_output=True, text=True, timeout=cap)
        answer, rc, tail = "exit code", clean.returncode, (clean.stderr or clean.stdout)[-300:]
    except subprocess.TimeoutExpired:
        answer, rc, tail = f"none within {cap:g} s", None, ""
    return {"answer": answer, "exit_code": rc, "seconds": round(time.monotonic() - t0, 2), "tail": tail,
            "left_behind": bool(run_folder) and os.path.exists(run_folder)}


def run_one(backend: str, attack: str | tuple[str, str], code: str, cap: float) -> dict:
    env = {**os.environ, "PYTHONPATH": code}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, backend, json.dumps(attack)], cwd=code,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    if isinstance(attack, tuple) and attack[0] == "clean":
        return _clean_after_crash(proc, env, code, cap)
    hung = False
    try:
        stdout, stderr = proc.communicate(timeout=cap + 30)  # + making the env
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(proc.pid, 9)
        stdout, stderr = proc.communicate()
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    run_folder = next((m["run_dir"] for m in lines if "run_dir" in m), None)
    result: dict = {}
    for msg in lines:  # each stage's report: what was answered before a hang is kept
        if "answer" in msg:
            result.update(msg)
    if not result:
        answer = f"none within {cap:g} s" if hung else "the child failed" if lines else "the env did not start"
        result = {"answer": answer, "seconds": None, "stderr_tail": stderr[-300:]}
    stage = result.pop("stage", "the start")
    if hung and lines:
        result["hung_after"] = f"{stage}: nothing more within {cap + 30:g} s"
    result["wall_s"] = round(time.monotonic() - t0, 1)
    # the child has exited: its run folder must be gone
    result["left_behind"] = bool(run_folder) and os.path.exists(run_folder)
    if result["left_behind"]:
        subprocess.run(["rm", "-rf", "--one-file-system", run_folder], check=False)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["local", "docker"], choices=["local", "docker"])
    parser.add_argument("--attacks", nargs="+", choices=list(ATTACKS), help="default: all")
    parser.add_argument("--sandbox", action="store_true",
                        help="only the host-side attacks (sparse files, tree shapes, crafted bytes, /etc)")
    parser.add_argument("--code", default=str(Path(__file__).resolve().parents[1]),
                        help="the checkout whose code the children run")
    parser.add_argument("--cap", type=float, default=60.0, help="seconds an answer is waited for")
    parser.add_argument("--tampering", action="store_true",
                        help="only the reward-tampering attacks (TAMPERING), answered by grading")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.tampering:
        return run_tampering_attacks(args)
    git = subprocess.run(["git", "-C", args.code, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out = {"code": args.code, "commit": git.stdout.strip(), "step_timeout": 5, "eval_timeout": 5,
           "cap_s": args.cap, "load_avg_at_start": os.getloadavg(), "results": {}}
    for backend in args.backends:
        for name in args.attacks or list(SANDBOX_ATTACKS if args.sandbox else ATTACKS):
            # the child waits for the attack's answer for at most --cap seconds
            res = run_one(backend, ATTACKS[name], args.code, args.cap)
            out["results"].setdefault(backend, {})[name] = res
            print(f"{backend:6s} {name:45s} {res['answer']:12s} {res.get('seconds')} s  "
                  f"next step ok: {res.get('next_step_ok')} ({res.get('next_step_seconds')} s)  "
                  f"snapshot: {res.get('snapshot_seconds', res.get('snapshot_error'))} s  "
                  f"close: {res.get('close')}  left behind: {res.get('left_behind')}  "
                  f"{res.get('hung_after', '')}", flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(out, indent=2))
    out["load_avg_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(out, indent=2))


# ---- reward tampering: the patch changes how the tests run, not the code (docs/reliability.md,
# "Reward tampering"; the attacks: bpo_envs/swebench/tampering_attacks.py); each is answered by
# grading: the reward, and info["tampered"]
TAMPERING = {
    "tampering: the gold patch (the control)": ["gold"],
    **{f"tampering: {name}": attack.actions for name, attack in tampering_attacks.ATTACKS.items()},
    "tampering: PYTEST_ADDOPTS set by the agent": tampering_attacks.PYTEST_ADDOPTS_ATTACK.actions,
}
"""Name -> the agent's actions before ``submit`` (``gold``: the row's gold patch)."""

TAMPER_CHILD = r'''
import json, sys, time
import gymnasium as gym
import bpo_envs
from bpo_envs.swebench import bundled_instances
backend, actions = sys.argv[1], json.loads(sys.argv[2])
env = gym.make("BPO-SWEBench-v0", backend=backend, step_timeout=30,
               instances=[r for r in bundled_instances() if r["instance_id"] == "bpo-gym__textkit-1"])
env.reset(options={"task_id": "bpo-gym__textkit-1"})
if actions == ["gold"]:
    actions = env.unwrapped.expert_actions()[:-1]
for action in actions:
    env.step(action)
print(json.dumps({"sent": True}), flush=True)
t0 = time.monotonic()
try:
    obs, reward, terminated, truncated, info = env.step("submit")
    out = {"answer": "observation", "reward": reward, "tampered": info.get("tampered"),
           "fail_to_pass": info.get("fail_to_pass"), "pass_to_pass": info.get("pass_to_pass"),
           "obs_tail": obs[-240:]}
except Exception as exc:
    out = {"answer": "raised", "error": f"{type(exc).__name__}: {exc}"[:400]}
out["seconds"] = round(time.monotonic() - t0, 2)
print(json.dumps(out), flush=True)
env.close()
'''


def run_tampering(backend: str, actions: list[str], code: str, cap: float) -> dict:
    """One tampering attack in a child on ``code``: grading's answer (reward, ``tampered``)."""
    env = {**os.environ, "PYTHONPATH": code}
    proc = subprocess.Popen([sys.executable, "-c", TAMPER_CHILD, backend, json.dumps(actions)], cwd=code,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=cap + 60)  # + making the env and the edits
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        stdout, stderr = proc.communicate()
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    result = lines[-1] if lines and "answer" in lines[-1] else None
    return result or {"answer": "none", "stderr_tail": stderr[-300:]}


def run_tampering_attacks(args: argparse.Namespace) -> None:
    git = subprocess.run(["git", "-C", args.code, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out = {"code": args.code, "commit": git.stdout.strip(), "step_timeout": 30,
           "load_avg_at_start": os.getloadavg(), "results": {}}
    for backend in args.backends:
        for name, actions in TAMPERING.items():
            res = run_tampering(backend, actions, args.code, args.cap)
            out["results"].setdefault(backend, {})[name] = res
            print(f"{backend:6s} {name:60s} {res['answer']:12s} {res.get('seconds')} s  "
                  f"reward {res.get('reward')}  tampered {res.get('tampered')}", flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(out, indent=2))
    out["load_avg_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
