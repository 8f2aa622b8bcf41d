"""Grading reads the whole test log, on both backends (the bundled ``romans`` row: 1,211 tests).

The agent's observations keep their head and tail (``OUTPUT_LIMIT_CHARS``); the grading log is
written to a file in the sandbox, copied out and handed whole to swebench's parser.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gymnasium as gym
import pytest

import bpo_envs  # noqa: F401 - registers the env ids

pytest.importorskip("swebench", reason="needs the swe extra: pip install 'bpo-gym[swe]'")

from docker_support import docker_problem  # noqa: E402

from bpo_envs.swebench import harness  # noqa: E402
from bpo_envs.swebench.bundled import romans  # noqa: E402

TASK = "bpo-gym__romans-1"
_DOCKER = docker_problem()
BACKENDS = [
    pytest.param("local", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap")),
    pytest.param("docker", marks=pytest.mark.skipif(_DOCKER is not None, reason=_DOCKER or "")),
]
LOCAL = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap")


def _make(backend: str):
    return gym.make("BPO-SWEBench-v0", backend=backend, step_timeout=30, instance_ids=[TASK])


def _play(env, actions):
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
    return obs, reward, terminated, info


@pytest.mark.parametrize("backend", BACKENDS)
def test_gold_patch_resolves_with_every_status_in_the_report(backend):
    env = _make(backend)
    try:
        env.reset(options={"task_id": TASK})
        row = env.unwrapped.instance()
        assert len(row["PASS_TO_PASS"]) == romans.ROUND_TRIP + 9  # hundreds: a long log
        obs, reward, terminated, info = _play(env, env.unwrapped.expert_actions())
        assert terminated and reward == 1.0 and "RESOLVED" in obs, obs
        status = info["tests_status"]
        assert sorted(status["FAIL_TO_PASS"]["success"]) == sorted(row["FAIL_TO_PASS"])
        assert sorted(status["PASS_TO_PASS"]["success"]) == sorted(row["PASS_TO_PASS"])
        assert not status["FAIL_TO_PASS"]["failure"] and not status["PASS_TO_PASS"]["failure"]
        assert "1211 passed" in info["test_output"]
    finally:
        env.close()


@pytest.mark.slow
@LOCAL
def test_no_fix_fails_only_the_new_tests():
    # the broken case: without the fix the FAIL_TO_PASS tests fail and every one of the 1,209
    # PASS_TO_PASS tests is still found passing in the log
    env = _make("local")
    try:
        env.reset(options={"task_id": TASK})
        obs, reward, terminated, info = _play(env, ["submit"])
        assert reward == 0.0 and info["fail_to_pass"] == 0.0 and info["pass_to_pass"] == 1.0, obs
        assert len(info["tests_status"]["PASS_TO_PASS"]["success"]) == romans.ROUND_TRIP + 9
    finally:
        env.close()


@LOCAL
def test_a_log_past_the_limit_is_cut_and_says_so(monkeypatch):
    monkeypatch.setattr(harness, "TEST_LOG_BYTES", 32 << 10)
    monkeypatch.setattr(harness, "MAX_LOG_COPY", (32 << 10) + 4096)
    env = _make("local")
    try:
        env.reset(options={"task_id": TASK})
        obs, reward, terminated, info = _play(env, env.unwrapped.expert_actions())
        # the end of the test output is missing: swebench does not grade a cut log as passing
        assert terminated and reward == 0.0
        assert info["test_output"].rstrip().endswith(harness.LOG_CUT_MARKER)
    finally:
        env.close()


@LOCAL
def test_a_log_replaced_by_a_link_to_a_host_file_is_not_read(tmp_path: Path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET-9d1c " * 10)
    # appended to the package under test, so it runs when the tests import it (a conftest.py
    # would be reset before grading); at the test run's exit it swaps the log for a link
    code = (
        "import atexit, os\n\n\ndef _swap():\n"
        "    os.remove('/bpo_eval/test_output.txt')\n"
        f"    os.symlink({str(secret)!r}, '/bpo_eval/test_output.txt')\n\n\natexit.register(_swap)\n"
    )
    env = _make("local")
    try:
        env.reset(options={"task_id": TASK})
        actions = [f"cat >> romans/__init__.py <<'EOF'\n{code}EOF", *env.unwrapped.expert_actions()[-1:]]
        obs, reward, terminated, info = _play(env, actions)
        assert terminated and reward == 0.0
        assert "HOST-SECRET" not in info["test_output"] and "HOST-SECRET" not in obs
    finally:
        env.close()
