"""Checks the SWE-bench escape tests share, for either backend (bubblewrap or docker)."""

from __future__ import annotations

from typing import Any


def step(env: Any, action: str) -> tuple[str, dict[str, Any]]:
    """One step; the observation and the info."""
    obs, _, _, _, info = env.step(action)
    return obs, info


def still_works(env: Any) -> None:
    """After an escape attempt the env still runs commands and still snapshots and restores."""
    obs, info = step(env, "ls")
    assert info["exit_code"] == 0 and "README.md" in obs
    snap = env.unwrapped.snapshot()
    step(env, "echo changed > after.txt")
    env.unwrapped.restore(snap)
    obs, _ = step(env, "ls after.txt")
    assert "No such file" in obs
    snap.release()
