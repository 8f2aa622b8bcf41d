"""Checking a generated game with the planner, in a separate process that can be stopped.

A verdict says whether the game is playable: not won at its start, and Fast Downward's plan,
played command by command through alfworld's engine, wins it. The planner runs in a worker
process (``python -m bpo_envs.alfworld.verify``) kept between games.

The limit is on the worker's **CPU time**, not on wall-clock time: before each check the worker
sets its ``RLIMIT_CPU`` to the CPU seconds it has used plus ``timeout`` (rounded up to a whole
second, the kernel's unit), so the kernel stops it with ``SIGXCPU`` when the check overruns.
Other processes on a busy machine therefore do not make a check time out (on this project's
shared 2-core machine wall-clock time ran 2-3x the CPU time); only a slower CPU does. A
wall-clock limit of ``4 x timeout + 60`` s is kept as a net for a worker that hangs without
using CPU. Either way the worker is killed, a new one is started for the next game, the
verdict is ``"timeout"``, and a warning names the game.

Even a CPU-time limit would keep different games on a fast and a slow CPU if games near the
limit were common, so it is a safety net, not the criterion that decides which games exist:
what keeps the planner fast is deterministic and lives in the generator (a bound on the size
of the problem, decided before planning: :data:`bpo_envs.alfworld.generator.MAX_PROBLEM_SIZE`).
The caller counts timeouts and moves on to the next attempt; the kept game records how many
attempts timed out before it (``traj_data["generator"]["rejected"]``), so a game that a
timeout changed can be told apart.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bpo_envs.processes import exit_with_parent

log = logging.getLogger(__name__)

PLANNER_TIMEOUT_S = 600.0
"""Default CPU-seconds limit of one check: 5x the slowest kept game seen (v3's
``pick_two_obj_and_place/0007`` of ``valid_seen``, 119 CPU s here; most plan in 0.2-15 s), so
that a slower CPU keeps the same games (docs/envs.md)."""

VERDICTS = ("solved", "won_at_start", "no_plan", "plan_fails", "timeout")


@dataclass
class Verdict:
    """``status`` is one of :data:`VERDICTS`; ``plan`` the planner's commands when solved."""

    status: str
    plan: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _check(engine: Any, game: dict[str, Any], key: str) -> tuple[str, list[str]]:
    engine.load(game, key)
    if engine.won:
        return "won_at_start", []
    plan = engine.plan()
    if not plan:
        return "no_plan", []
    for command in plan:
        if not engine.is_admissible(command):
            return "plan_fails", plan
        engine.step(command)
    return ("solved" if engine.won else "plan_fails"), plan


def _serve() -> None:
    """The worker: one JSON request per line on stdin, one answer per line on the original stdout
    (whatever the engine prints goes to stderr)."""
    exit_with_parent()  # a killed parent cannot kill a worker busy in the planner's C code
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from bpo_envs.alfworld._upstream import save_translation
    from bpo_envs.alfworld.engine import AlfredEngine

    engine = AlfredEngine()
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    for line in sys.stdin:
        request = json.loads(line)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(usage.ru_utime + usage.ru_stime + float(request["timeout"]))
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
        try:
            status, plan = _check(engine, request["game"], request["key"])
            answer = {"status": status, "plan": plan}
            if status == "solved":
                # a kept game: its translation (keyed by its text) spares the env's first load
                # of it the 0.2-0.5 s of translating again (docs/alfworld.md, "The first reset")
                save_translation(Path(request["key"]), request["game"])
        except Exception as exc:  # reported to the parent, which raises it
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


class PlannerWorker:
    """A planner process (``python -m bpo_envs.alfworld.verify``) that answers :meth:`verify`
    and is replaced when it overruns. A plain subprocess rather than ``multiprocessing``: spawn
    would re-import the user's main script, fork would copy the parent's threads."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._answered = 0  # checks the current process has answered
        self._stderr: Any = None

    def _start(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        self._stderr = tempfile.TemporaryFile(mode="w+")  # kept to explain a worker that dies
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bpo_envs.alfworld.verify"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True,
        )  # fmt: skip
        self._answered = 0

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-2000:]

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            for pipe in (self._proc.stdin, self._proc.stdout, self._stderr):
                if pipe is not None:
                    pipe.close()
        self._proc = self._stderr = None

    def verify(self, game: dict[str, Any], key: str, timeout: float = PLANNER_TIMEOUT_S) -> Verdict:
        """Check ``game`` (a ``game.tw-pddl`` dict); ``key`` names it in logs."""
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise ValueError(f"planner_timeout must be a positive number of seconds, got {timeout!r}")
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            proc = self._proc
            assert proc is not None and proc.stdin is not None and proc.stdout is not None
            start = time.monotonic()
            proc.stdin.write(json.dumps({"game": game, "key": key, "timeout": timeout}) + "\n")
            proc.stdin.flush()
            # the first check also pays the worker's imports (a few seconds)
            ready, _, _ = select.select([proc.stdout], [], [], 4 * timeout + 60.0 + (0.0 if self._answered else 60.0))
            line = proc.stdout.readline() if ready else ""
            if not line:
                died = proc.wait(timeout=10) if ready else None
                tail = self._stderr_tail()
                self._kill()
                if ready and died != -signal.SIGXCPU:
                    raise RuntimeError(f"the planner process died (exit status {died}) while checking {key}: {tail}")
                what = f"{timeout:g} CPU seconds" if ready else f"{4 * timeout + 60:g} s of wall-clock time"
                log.warning("ALFWorld generator: the planner ran over %s on %s; killed, trying the next attempt", what, key)
                return Verdict("timeout", [], time.monotonic() - start)
            self._answered += 1
            answer = json.loads(line)
            if "error" in answer:
                raise RuntimeError(f"the planner failed on {key}: {answer['error']}")
            return Verdict(answer["status"], list(answer["plan"]), time.monotonic() - start)

    def close(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None and self._proc.stdin is not None:
                try:
                    self._proc.stdin.close()
                    self._proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill()


_WORKER: PlannerWorker | None = None
_WORKER_LOCK = threading.Lock()


def worker() -> PlannerWorker:
    """The process-wide planner worker (started on first use)."""
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = PlannerWorker()
        return _WORKER


if __name__ == "__main__":
    _serve()
