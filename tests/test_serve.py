"""``bpo-serve``: every env over OpenEnv's protocol, driven by openenv-core's own client.

A live server runs on 127.0.0.1 per env (SWE-bench on its local backend). openenv-core's
``GenericEnvClient`` must see what the env gives in process; a ``state``'s snapshot id restored
in another session must replay exactly; ``RemoteEnv`` must pass ``check_snapshot``. The limits
(sessions, idle timeout, message size, snapshot cap, token, per-step deadline) and bad input each
get an OpenEnv error or a closed session, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import gymnasium as gym
import pytest

pytest.importorskip("openenv.core", reason="needs the serve extra: pip install 'bpo-gym[serve]'")

from env_zoo import ENVS, NAMES, make_or_skip, same  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402
from serve_support import served  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

import bpo_envs  # noqa: E402
from bpo_envs.remote import RemoteEnv, RemoteEnvError, RemoteSnapshotError  # noqa: E402
from bpo_envs.serve.models import TextObservation  # noqa: E402
from bpo_envs.serve.protocol import WSErrorCode  # noqa: E402
from bpo_envs.tree_mdp import TreeMDPEnv  # noqa: E402

SHELL = ["ls -AF", "git status --short", "echo note >> README.md", "cat README.md | head -3", "rm -f README.md"]


def actions_for(name: str, observation: dict, k: int) -> str:
    admissible = observation.get("admissible_actions")
    if admissible:
        return admissible[k % len(admissible)]
    return SHELL[k % len(SHELL)]


@pytest.fixture(scope="module", params=NAMES)
def server(request):
    name = request.param
    make_or_skip(name)  # skips when the env's optional parts are absent
    env_id, kwargs, _, _ = ENVS[name]
    with served(env_id, kwargs) as (url, _):
        yield name, url


def client(url: str):
    return GenericEnvClient(base_url=url).sync()


def test_generic_client_plays_as_in_process(server):
    name, url = server
    local = make_or_skip(name)()
    try:
        with client(url) as remote:
            for seed in (0, 1):
                obs, info = local.reset(seed=seed)
                result = remote.reset(seed=seed)
                o = result.observation
                TextObservation(**o, reward=result.reward, done=result.done)  # openenv-core's type
                assert (o["text"], o["task_id"], o["admissible_actions"]) == (obs, info["task_id"], info.get("admissible_actions"))
                assert result.done is False and result.reward is None
                for k in range(3):
                    action = actions_for(name, o, k)
                    obs, reward, term, trunc, info = local.step(action)
                    result = remote.step({"text": action})
                    o = result.observation
                    assert o["text"] == obs and result.reward == reward and result.done == (term or trunc)
                    assert o["won"] == info["won"] and o["invalid_action"] == bool(info.get("invalid_action"))
                    if result.done:
                        break
            state = remote.state()
            assert state["step_count"] >= 1 and isinstance(state["snapshot_id"], str)
    finally:
        local.close()


def test_snapshot_id_forks_into_another_session(server):
    name, url = server
    with client(url) as a, client(url) as b:
        o = a.reset(seed=3).observation
        o = a.step({"text": actions_for(name, o, 1)}).observation
        snapshot_id = a.state()["snapshot_id"]
        branch = []
        for k in range(3):
            result = a.step({"text": actions_for(name, o, k)})
            branch.append((result.observation, result.reward, result.done))
            o = result.observation
            if result.done:
                break
        forked = b.reset(snapshot_id=snapshot_id).observation
        replay = []
        for k in range(len(branch)):
            result = b.step({"text": actions_for(name, forked if k == 0 else replay[-1][0], k)})
            replay.append((result.observation, result.reward, result.done))
        assert same(replay, branch)
        a.reset(snapshot_id=snapshot_id)  # the owner can go back too
        assert a.state()["step_count"] == 1


def test_remote_env_passes_check_snapshot(server):
    name, url = server
    env = gym.make("BPO-Remote-v0", base_url=url)
    try:
        chooser = None
        if name == "swebench":
            chooser = lambda obs, info, rng: SHELL[int(rng.integers(len(SHELL)))]  # noqa: E731
        report = bpo_envs.check_snapshot(env, seed=0, steps=5 if name == "swebench" else 8, choose_action=chooser)
        assert report.portable_checked and report.fresh_env_checked and report.compared_transitions > 0
        assert len(env.unwrapped.task_ids()) > 0
    finally:
        env.close()


def test_remote_env_forwards_what_the_served_env_declares(server):
    import numpy as np

    name, url = server
    local = make_or_skip(name)()
    env = RemoteEnv(url)
    try:
        here = local.unwrapped
        assert bpo_envs.declared(env) is env
        env.reset(seed=0)
        assert (env.max_episode_steps, env.restore_prefers_origin, env.has_expert) == (
            here.max_episode_steps, here.restore_prefers_origin, here.has_expert)
        assert env.step_may_block  # its own: every call waits on the network
        provenance = here.provenance()
        if provenance is None:
            assert env.provenance() is None
        else:
            assert env.provenance()["env"] == provenance["env"] and set(env.provenance()) == set(provenance)
        assert env.sample_action(np.random.default_rng(0)) is None  # not forwarded: the rng stays here
    finally:
        env.close()
        local.close()


# ---- limits and bad input (one small TreeMDP server) --------------------------------------
TREE = ("BPO-TreeMDP-v0", {"depth": 4, "n_actions": 3, "seed": 1, "n_tasks": 3})
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def limited():
    flags = ["--max-sessions", "2", "--idle-timeout", "3", "--max-message-bytes", "4096", "--snapshot-cap", "3"]
    with served(*TREE, *flags, env={"BPO_SERVE_TOKEN": TOKEN}) as (url, proc):
        yield url, proc


def ws(url: str, token: str | None = TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return connect(url.replace("http://", "ws://") + "/ws", additional_headers=headers, compression=None)


def ask(conn, message) -> dict:
    conn.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(conn.recv(timeout=30))


def health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        return json.loads(r.read())


def test_token_is_required(limited):
    url, _ = limited
    for token in (None, "wrong"):
        with pytest.raises(Exception, match="1008|policy|403|rejected"):
            with ws(url, token) as conn:
                ask(conn, {"type": "reset", "data": {}})
    env = RemoteEnv(url, token=TOKEN)
    env.reset(seed=0)
    env.close()


def test_bad_input_gets_openenv_errors_and_the_session_goes_on(limited):
    url, proc = limited
    with ws(url) as conn:
        assert ask(conn, {"type": "step", "data": {"text": "a0"}})["data"]["code"] == "EXECUTION_ERROR"  # before reset
        assert ask(conn, {"type": "reset", "data": {"seed": 0}})["type"] == "observation"
        cases = [
            ("{not json", WSErrorCode.INVALID_JSON),
            ("[1, 2]", WSErrorCode.VALIDATION_ERROR),
            ({"type": "dance"}, WSErrorCode.UNKNOWN_TYPE),
            ({"type": "step", "data": {}}, WSErrorCode.VALIDATION_ERROR),
            ({"type": "step", "data": {"action": "a0"}}, WSErrorCode.VALIDATION_ERROR),
            ({"type": "step", "data": {"text": 7}}, WSErrorCode.VALIDATION_ERROR),
            ({"type": "reset", "data": {"seeds": 1}}, WSErrorCode.VALIDATION_ERROR),
            ({"type": "reset", "data": {"seed": -1}}, WSErrorCode.VALIDATION_ERROR),
            ({"type": "reset", "data": {"task_id": "no such task"}}, WSErrorCode.EXECUTION_ERROR),
            ({"type": "reset", "data": {"snapshot_id": "feedbeef"}}, WSErrorCode.VALIDATION_ERROR),
            ({"type": "step", "data": {"text": "x" * 5000}}, WSErrorCode.VALIDATION_ERROR),  # over 4096 bytes
        ]
        for message, code in cases:
            reply = ask(conn, message)
            assert reply["type"] == "error" and reply["data"]["code"] == code.value, (message, reply)
        reply = ask(conn, {"type": "reset", "data": {"snapshot_id": "feedbeef"}})
        assert "feedbeef" in reply["data"]["message"] and reply["data"]["snapshot_id"] == "feedbeef"
        reply = ask(conn, {"type": "step", "data": {"text": "a0"}})
        assert reply["type"] == "observation"  # the session still works
    assert proc.poll() is None and health(url)["status"] == "healthy"


def test_session_cap_refuses_clearly(limited):
    url, _ = limited
    with ws(url) as one, ws(url) as two:
        ask(one, {"type": "reset", "data": {}})
        ask(two, {"type": "reset", "data": {}})
        with ws(url) as three:
            reply = json.loads(three.recv(timeout=30))
            assert reply["data"]["code"] == "CAPACITY_REACHED" and reply["data"]["max_sessions"] == 2
    deadline = time.monotonic() + 10
    while health(url)["sessions"] and time.monotonic() < deadline:
        time.sleep(0.05)
    with ws(url) as again:  # slots come back when sessions end
        assert ask(again, {"type": "reset", "data": {}})["type"] == "observation"


def test_snapshots_are_capped_and_freed_with_their_session(limited):
    url, _ = limited
    with ws(url) as owner, ws(url) as other:
        ask(owner, {"type": "reset", "data": {"seed": 0}})
        ids = [ask(owner, {"type": "state"})["data"]["snapshot_id"] for _ in range(4)]  # cap is 3
        evicted = ask(other, {"type": "reset", "data": {"snapshot_id": ids[0]}})
        assert evicted["type"] == "error" and "evicted" in evicted["data"]["message"]
        assert ask(other, {"type": "reset", "data": {"snapshot_id": ids[-1]}})["type"] == "observation"
        owner.send(json.dumps({"type": "release", "data": {"snapshot_ids": [ids[-2]]}}))  # no reply
        released = ask(owner, {"type": "reset", "data": {"snapshot_id": ids[-2]}})
        assert "released" in released["data"]["message"]
        owner.send(json.dumps({"type": "close"}))
        time.sleep(0.5)
        gone = ask(other, {"type": "reset", "data": {"snapshot_id": ids[-1]}})
        assert "session that took it ended" in gone["data"]["message"]
    assert health(url)["snapshots"] == 0


def test_idle_sessions_are_closed(limited):
    url, _ = limited
    with ws(url) as conn:
        ask(conn, {"type": "reset", "data": {}})
        reply = json.loads(conn.recv(timeout=30))  # idle timeout is 3 s
        assert reply["data"]["code"] == "SESSION_ERROR" and "without a message" in reply["data"]["message"]
    assert health(url)["closed_idle"] >= 1


def test_remote_snapshot_errors_are_snapshot_errors(limited):
    url, _ = limited
    env = RemoteEnv(url, token=TOKEN)
    try:
        env.reset(seed=0)
        snaps = [bpo_envs.snapshot(env) for _ in range(4)]
        with pytest.raises(RemoteSnapshotError, match="evicted"):
            bpo_envs.restore(env, snaps[0])
        with pytest.raises(RemoteEnvError, match="unknown task_id"):
            env.reset(options={"task_id": "nope"})
    finally:
        env.close()


# ---- the per-step deadline: a server in this process on an env that can hang -------------
class SlowTree(TreeMDPEnv):
    closed = 0
    step_may_block = True  # its "hang" action blocks: it runs in the pool, under the deadline

    def step(self, action):
        if action == "hang":
            time.sleep(1.5)
        return super().step(action)

    def close(self):
        SlowTree.closed += 1
        super().close()


def test_a_step_past_the_deadline_closes_its_session_only():
    import uvicorn

    from bpo_envs.serve.app import ServeConfig, create_app

    if "Test-SlowTree-v0" not in gym.registry:
        gym.register("Test-SlowTree-v0", entry_point=SlowTree, disable_env_checker=True, order_enforce=False)
    app = create_app(ServeConfig("Test-SlowTree-v0", {"depth": 3}, step_deadline=0.3))
    sock = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        with client(url) as slow, client(url) as fine:
            slow.reset(seed=0)
            fine.reset(seed=0)
            with pytest.raises(RuntimeError, match="deadline"):
                slow.step({"text": "hang"})
            assert fine.step({"text": "a0"}).observation["text"]  # the other session goes on
        deadline = time.monotonic() + 10
        while SlowTree.closed < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert SlowTree.closed >= 1  # the hung env was closed once its step returned, not reused
        assert health(url)["deadline_exceeded"] == 1
    finally:
        server.should_exit = True
        thread.join(10)


# ---- the main job on a served env --------------------------------------------------------
def _without_times(value):
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if not k.startswith("seconds")}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


@pytest.mark.slow
def test_bpo_compare_on_a_server_matches_in_process(tmp_path):
    from bpo_experiments import compare
    from bpo_experiments.presets import PRESETS

    setup = PRESETS["smoke"].envs["treemdp"]
    args = ["--smoke", "--envs", "treemdp", "--seeds", "0", "--updates", "1", "--budget", "100", "--grad-batches", "2",
            "--no-progress", "--jobs", "1", "--algorithms", "bpo", "rloo"]
    local = compare.main(["--out", str(tmp_path / "local"), *args])
    with served(setup.env_id, setup.kwargs) as (url, _):
        remote = compare.main(["--out", str(tmp_path / "remote"), "--env-server", url, *args])
        assert health(url)["snapshots"] == 0  # every snapshot the engine took was released
        with served(setup.env_id, {**setup.kwargs, "depth": 5}) as (other, _):
            with pytest.raises(ValueError, match="serve it with those kwargs"):
                compare.main(["--out", str(tmp_path / "other"), "--env-server", other, *args])
    a, b = local["per_env"]["treemdp"]["algorithms"], remote["per_env"]["treemdp"]["algorithms"]
    assert b["bpo"]["compute"]["restores"] > 0 and b["bpo"]["compute"]["snapshots"] > 0
    assert _without_times(a) == _without_times(b)


def test_fault_injection_leaves_the_server_unharmed(tmp_path):
    """benchmarks/fault_serve.py, small: every injected fault gets its error or a closed session."""
    from serve_support import ROOT

    out = tmp_path / "faults.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fault_serve.py"), "--episodes", "150", "--sessions", "4",
                    "--sample-every", "50", "--attacks", "none", "--out", str(out)], check=True, timeout=600,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(out.read_text())
    assert result["episodes"] >= 150 and result["server_crashes"] == 0 and result["wrong_answer_count"] == 0
    assert result["health_after"]["sessions"] == 0 and result["health_after"]["snapshots"] == 0
    assert sum(result["faults"].values()) > 20 and result["faults"].get("vanish_mid_step", 0) > 0


@pytest.mark.slow
def test_fault_script_attacks_all_hold(tmp_path):
    """benchmarks/fault_serve.py's hostile clients (each also a test in test_serve_hostile.py), with
    short timeouts: every attack held, and the attacks' server answered throughout."""
    from serve_support import ROOT

    out = tmp_path / "faults.json"
    fast = "--header-timeout 2 --body-timeout 2 --evict-idle-after 2 --session-snapshot-cap 20"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fault_serve.py"), "--episodes", "8", "--sessions", "2",
                    "--attack-sessions", "3", "--attack-server-args", fast, "--out", str(out)], check=True,
                   timeout=300, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    attacks = json.loads(out.read_text())["attacks"]
    failed = {k: v for k, v in attacks.items() if isinstance(v, dict) and v.get("held") is False}
    assert not failed, failed
    assert attacks["silent_sessions"]["seconds_to_a_session"] is not None
    assert attacks["sigterm"]["returncode"] == 128 + 15


def test_deploy_layouts_pass_openenv_validate():
    """deploy/openenv/<env>: OpenEnv's own local check (openenv validate) of each env's layout."""
    from openenv.cli._validation import validate_multi_mode_deployment
    from serve_support import ROOT

    for env in ("webshop", "treemdp", "alfworld", "swebench"):
        assert (ROOT / "deploy" / "openenv" / env / "server" / "Dockerfile").is_file(), env
        ok, issues = validate_multi_mode_deployment(ROOT / "deploy" / "openenv" / env)
        assert ok, (env, issues)


# ---- where env calls run: the event loop for an env that declares them bounded, else the pool --
def test_env_calls_run_where_the_env_class_declares():
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from bpo_envs.core import SnapshotEnv
    from bpo_envs.serve.session import EnvCalls, runs_inline

    class Undeclared(TreeMDPEnv):  # a subclass keeps its parent's declaration
        pass

    class MayBlock(SnapshotEnv):  # the base class's default: may block
        pass

    assert runs_inline(gym.make(*TREE[:1], **TREE[1])) and runs_inline(gym.make("BPO-WebShop-v0"))
    assert issubclass(Undeclared, TreeMDPEnv) and runs_inline(SimpleNamespace(unwrapped=Undeclared(depth=2)))
    assert not runs_inline(SimpleNamespace(unwrapped=SlowTree(depth=2)))  # declares True
    assert MayBlock.step_may_block and not runs_inline(SimpleNamespace(unwrapped=object.__new__(MayBlock)))
    assert not runs_inline(gym.make("CartPole-v1"))  # not a SnapshotEnv: never inline

    async def where(inline):
        loop_thread = threading.get_ident()
        calls = EnvCalls(ThreadPoolExecutor(2), deadline=5.0, inline=inline)
        session = SimpleNamespace(pending=None, broken=False)
        ran = [await calls.run(session, threading.get_ident) == loop_thread for _ in range(3)]
        calls.executor.shutdown()
        return ran

    assert asyncio.run(where(True)) == [True] * 3  # on the event loop, no hand-off
    assert asyncio.run(where(False)) == [False] * 3  # in the pool


def test_the_server_reports_where_it_calls_the_env(limited):
    url, _ = limited
    assert health(url)["env_calls_inline"] is True  # TreeMDP declares step_may_block = False
