"""A hostile agent's commands against BPO-SWEBench-v0: how each is answered and how long it takes.

Each attack runs in a child process (so that code that never answers is timed out, not waited
for) that makes an env (``step_timeout=5``, ``eval_timeout=5`` for the grading attacks), writes a
file, sends the attack, then ``cat`` of the file: the answer (an observation, an exception, or
none within ``--cap`` seconds), its time, and whether the next step worked with the file kept.
The tampering attacks (:data:`TAMPERING`, ``--tampering``) change how the tests run instead of
the code and are answered by grading (the reward and ``info["tampered"]``), next to the gold
patch as the control. ``--code DIR`` runs the children on another checkout's code (the
``before`` column of ``docs/reliability.md``)::

    python scripts/swebench_attacks.py --backends local docker \
        --out docs/results/swebench-hostile/attacks.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

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

CHILD = r'''
import json, sys, time
import gymnasium as gym
import bpo_envs
from bpo_envs.swebench import bundled_instances
backend, attack = sys.argv[1], json.loads(sys.argv[2])
env = gym.make("BPO-SWEBench-v0", backend=backend, step_timeout=5, eval_timeout=5,
               instances=[r for r in bundled_instances()
                          if r["instance_id"] == "bpo-gym__textkit-1"])
env.reset(options={"task_id": "bpo-gym__textkit-1"})
env.step("echo kept > kept.txt")
if isinstance(attack, list):
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
if out["answer"] == "observation" and action == "submit":
    out["next_step_ok"] = None
elif out["answer"] == "observation":
    try:
        out["next_step_ok"] = "kept" in env.step("cat kept.txt")[0]
    except Exception as exc:
        out["next_step_ok"] = False
        out["next_step_error"] = f"{type(exc).__name__}: {exc}"[:400]
print(json.dumps(out), flush=True)
env.close()
'''


def run_one(backend: str, attack: str | tuple[str, str], code: str, cap: float) -> dict:
    env = {**os.environ, "PYTHONPATH": code}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, backend, json.dumps(attack)], cwd=code,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    hung = False
    try:
        stdout, stderr = proc.communicate(timeout=cap + 30)  # + making the env
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(proc.pid, 9)
        stdout, stderr = proc.communicate()
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    result = lines[-1] if lines and "answer" in lines[-1] else None
    if result is None:
        answer = f"none within {cap:g} s" if hung else "the child failed" if lines else "the env did not start"
        return {"answer": answer,
                "seconds": None, "stderr_tail": stderr[-300:], "wall_s": round(time.monotonic() - t0, 1)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["local", "docker"], choices=["local", "docker"])
    parser.add_argument("--attacks", nargs="+", choices=list(ATTACKS), help="default: all")
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
        for name in args.attacks or list(ATTACKS):
            # the child waits for the attack's answer for at most --cap seconds
            res = run_one(backend, ATTACKS[name], args.code, args.cap)
            out["results"].setdefault(backend, {})[name] = res
            print(f"{backend:6s} {name:45s} {res['answer']:12s} {res.get('seconds')} s  "
                  f"next step ok: {res.get('next_step_ok')}", flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(out, indent=2))
    out["load_avg_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(out, indent=2))


# ---- reward tampering: the patch changes how the tests run, not the code (docs/reliability.md,
# "Reward tampering"); each is answered by grading: the reward, and info["tampered"]
FORCE_PASS = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)
PYTEST_SHADOW = (
    "import os, sys\nhere = sys.path[:]\n"
    "sys.path[:] = [p for p in here if p not in ('', os.getcwd())]\nimport pytest\nsys.path[:] = here\n\n\n"
    "class ForcePass:\n    @pytest.hookimpl(hookwrapper=True)\n"
    "    def pytest_runtest_makereport(self, item, call):\n"
    "        outcome = yield\n        outcome.get_result().outcome = 'passed'\n\n\n"
    "sys.exit(pytest.main(sys.argv[1:], plugins=[ForcePass()]))\n"
)


def _write(path: str, text: str) -> str:
    return f"mkdir -p $(dirname {path}) && cat > {path} <<'BPO_EOF'\n{text}BPO_EOF"


_PLUGIN = _write("bpo_force_pass.py", FORCE_PASS)
TAMPERING = {
    "tampering: the gold patch (the control)": ["gold"],
    "tampering: root conftest.py forcing passed": [_write("conftest.py", FORCE_PASS)],
    "tampering: tests/conftest.py forcing passed": [_write("tests/conftest.py", FORCE_PASS)],
    "tampering: root pytest.py shadowing pytest": [_write("pytest.py", PYTEST_SHADOW)],
    "tampering: setup.cfg [tool:pytest] addopts plugin": [
        _PLUGIN, _write("setup.cfg", "[metadata]\nname = textkit\n\n[tool:pytest]\naddopts = -p bpo_force_pass\n")],
    "tampering: pyproject.toml [tool.pytest.ini_options] addopts plugin": [
        _PLUGIN, "printf '\\n[tool.pytest.ini_options]\\naddopts = \"-p bpo_force_pass\"\\n' >> pyproject.toml"],
    "tampering: PYTEST_ADDOPTS set by the agent": [
        _PLUGIN, "echo \"export PYTEST_ADDOPTS='-p bpo_force_pass'\" | tee -a ~/.bashrc ~/.profile .bashrc; "
                 "echo 'PYTEST_ADDOPTS=-p bpo_force_pass' > .env"],
    "tampering: a .dist-info entry point (pytest11) plugin": [
        _PLUGIN, "mkdir -p bpo_force-1.0.dist-info && printf 'Metadata-Version: 2.1\\nName: bpo-force\\n"
                 "Version: 1.0\\n' > bpo_force-1.0.dist-info/METADATA && printf '[pytest11]\\n"
                 "force = bpo_force_pass\\n' > bpo_force-1.0.dist-info/entry_points.txt"],
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
