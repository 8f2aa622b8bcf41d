"""Live ``bpo-serve`` servers on 127.0.0.1 for the tests: a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def served(
    env_id: str, kwargs: dict[str, Any] | None = None, *flags: str, env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run ``python -m bpo_envs.serve.cli ENV_ID k=v ... --port 0 FLAGS``; yields (url, process).
    ``preexec_fn`` runs in the server's process before it starts (e.g. a lower file limit)."""
    words = [f"{k}={json.dumps(v)}" for k, v in (kwargs or {}).items()]
    environ = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(env or {})}
    log = tempfile.TemporaryFile("w+")  # a pipe nobody reads could fill and stall the server
    proc = subprocess.Popen(
        [sys.executable, "-m", "bpo_envs.serve.cli", env_id, *words, "--port", "0", *flags],
        stdout=subprocess.PIPE, stderr=log, text=True, env=environ, preexec_fn=preexec_fn,
    )
    try:
        line = proc.stdout.readline()
        if not line.startswith("serving "):
            proc.kill()
            proc.wait()
            log.seek(0)
            raise RuntimeError(f"bpo-serve did not start: {line!r} {log.read()[-3000:]}")
        yield line.split()[-1], proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
