"""Host-side git, isolated from the user's git configuration (hooks, fsmonitor, excludes)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

FIXED_DATE = "2024-01-01T12:00:00+00:00"


class GitError(RuntimeError):
    """A git command failed; the message has its stderr."""


class GitTimeoutError(GitError):
    """A git command ran past its deadline and was killed (docs/reliability.md#the-host-side-of-a-step)."""


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment that makes git ignore system/global config and never prompt."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LC_ALL": "C",
        "XDG_CONFIG_HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": "bpo-gym",
        "GIT_AUTHOR_EMAIL": "bpo-gym@localhost",
        "GIT_COMMITTER_NAME": "bpo-gym",
        "GIT_COMMITTER_EMAIL": "bpo-gym@localhost",
        "GIT_AUTHOR_DATE": FIXED_DATE,
        "GIT_COMMITTER_DATE": FIXED_DATE,
    }
    if extra:
        env.update(extra)
    return env


def require_git() -> str:
    path = shutil.which("git")
    if path is None:
        raise RuntimeError("BPO-SWEBench-v0 needs git on PATH: apt-get install git")
    return path


def git(
    *args: str,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    timeout: float | None = None,
) -> bytes:
    """Run ``git args`` and return stdout; raise :class:`GitError` with stderr on failure and
    :class:`GitTimeoutError` when it runs past ``timeout`` seconds (it is killed then)."""
    argv = ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", *args]
    try:
        proc = subprocess.run(argv, cwd=cwd, env=git_env(env), input=input, capture_output=True,
                              check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GitTimeoutError(f"git {' '.join(args[:4])} ran past its deadline of {timeout:.3g} s") from None
    if proc.returncode != 0:
        raise GitError(
            f"git {' '.join(args[:4])} failed ({proc.returncode}): "
            f"{proc.stderr.decode('utf-8', 'replace').strip()[:2000]}"
        )
    return proc.stdout


def git_text(*args: str, **kwargs) -> str:
    return git(*args, **kwargs).decode("utf-8", "replace").strip()
