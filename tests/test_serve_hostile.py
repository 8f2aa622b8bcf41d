"""``bpo-serve`` against hostile clients on 127.0.0.1 (docs/serving.md, "Hostile clients").

Each attack is bounded in count and time and stops by itself: half-open connections (headers or
body never finished), a connection flood past the cap and past the process's file limit, silent
WebSockets holding every session slot, one session taking snapshots past its quota, fields of
0.9 MB, ``/health`` asked for the env kwargs without the token, and SIGTERM to a SWE-bench
server. Each must get a clear answer (an error, a 408/503, a closed session), and the server must
keep serving everyone else. Without the bound under test each of these fails (today's server:
the connections stay open, the silent sessions hold their slots, another session's snapshot is
evicted, the 0.9 MB id is echoed back in ``state``, the kwargs are shown, the run folder stays).
"""

from __future__ import annotations

import contextlib
import glob
import json
import resource
import signal
import socket
import tempfile
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("openenv.core", reason="needs the serve extra: pip install 'bpo-gym[serve]'")

from env_zoo import make_or_skip  # noqa: E402
from serve_support import served  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

TREE = ("BPO-TreeMDP-v0", {"depth": 4, "n_actions": 3, "seed": 987654321, "n_tasks": 3})


def ws(url: str, token: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return connect(url.replace("http://", "ws://") + "/ws", additional_headers=headers, compression=None, open_timeout=10)


def ask(conn, message) -> dict:
    conn.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(conn.recv(timeout=30))


def get(url: str, path: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:  # /schema's first answer imports openenv-core: seconds on a loaded machine
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def half_open(url: str, count: int, body: bool = False) -> list[socket.socket]:
    """``count`` connections that send part of a request and then nothing."""
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port(url)), timeout=10)
        if body:  # headers complete, body never
            s.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        else:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    return socks


def answer_and_close(s: socket.socket, within: float) -> bytes:
    """What the server sent before closing ``s`` (raises where it is still open after ``within`` s)."""
    s.settimeout(within)
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    finally:
        s.close()
    return data


def test_half_open_connections_are_answered_408_and_closed():
    with served(*TREE, "--header-timeout", "1", "--body-timeout", "1") as (url, _):
        headers = half_open(url, 20)
        bodies = half_open(url, 5, body=True)
        assert get(url, "/health")[0] == 200  # everyone else is served meanwhile
        for s in headers + bodies:
            reply = answer_and_close(s, within=10)  # socket.timeout here: the connection stayed open
            assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in reply
        status, text = get(url, "/health")
        assert status == 200 and json.loads(text)["connections_timed_out"] >= 25


def test_connection_cap_displaces_half_open_and_refuses_clearly_when_all_are_busy():
    with served(*TREE, "--max-sessions", "2", "--max-connections", "5", "--body-timeout", "2") as (url, _):
        with ws(url) as a, ws(url) as b:
            ask(a, {"type": "reset", "data": {}})
            ask(b, {"type": "reset", "data": {}})
            waiting = half_open(url, 3)  # 5 connections: the cap
            time.sleep(0.2)
            assert get(url, "/health")[0] == 200  # took the place of the oldest half-open one
            assert answer_and_close(waiting[0], within=10).startswith(b"HTTP/1.1 408")
            for s in waiting[1:]:
                s.close()
            busy = half_open(url, 3, body=True)  # reading their bodies: nobody to displace
            time.sleep(0.2)
            status, text = get(url, "/health")
            assert status == 503 and "connection limit (5)" in text
            for s in busy:  # they time out (2 s); then the server answers again
                assert answer_and_close(s, within=10).startswith(b"HTTP/1.1 408")
            assert ask(a, {"type": "step", "data": {"text": "a0"}})["type"] == "observation"  # sessions went on
        health = json.loads(get(url, "/health")[1])
        assert health["connections_refused"] >= 1 and health["connections_displaced"] >= 1


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))  # hard too: the server cannot raise it


def test_a_flood_past_the_file_limit_leaves_the_server_answering():
    """300 half-open connections at a server whose file limit is 256 (today: EMFILE, every
    connection reset): its cap keeps it under the limit and /health and /ws are answered."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 512:
        pytest.skip("this process needs 512 files for the flood")
    with served(*TREE, "--max-sessions", "4", "--header-timeout", "3", preexec_fn=_low_file_limit) as (url, _):
        flood = half_open(url, 300)
        status, text = get(url, "/health")
        assert status == 200 and json.loads(text)["max_connections"] < 256
        with ws(url) as conn:
            assert ask(conn, {"type": "reset", "data": {}})["type"] == "observation"
        for s in flood:  # each is displaced (408), refused (503) or timed out (408): none stays
            assert answer_and_close(s, within=15).split(b" ")[1] in (b"408", b"503")


def test_silent_websockets_give_their_slots_to_newcomers():
    with served(*TREE, "--max-sessions", "3", "--evict-idle-after", "3") as (url, _):
        with contextlib.ExitStack() as stack:
            silent = [stack.enter_context(ws(url)) for _ in range(3)]  # connect, then never send anything
            time.sleep(0.3)
            with ws(url) as early:  # not silent long enough yet: refused, clearly
                reply = json.loads(early.recv(timeout=30))
                assert reply["data"]["code"] == "CAPACITY_REACHED"
            time.sleep(3.2)
            with ws(url) as newcomer:
                assert ask(newcomer, {"type": "reset", "data": {"seed": 1}})["type"] == "observation"
            evicted = []
            for s in silent:  # one of them (the one silent longest) was told why, and closed
                try:
                    evicted.append(json.loads(s.recv(timeout=2)))
                except TimeoutError:
                    pass
            assert len(evicted) == 1
            assert evicted[0]["data"]["code"] == "SESSION_ERROR" and "make room" in evicted[0]["data"]["message"]
        health = json.loads(get(url, "/health")[1])
        assert health["evicted_idle"] == 1 and health["refused"] == 1


def test_a_session_evicts_only_its_own_snapshots():
    flags = ["--max-sessions", "4", "--snapshot-cap", "5", "--session-snapshot-cap", "3"]
    with served(*TREE, *flags) as (url, _), ws(url) as a, ws(url) as b, ws(url) as c:
        for conn in (a, b, c):
            ask(conn, {"type": "reset", "data": {"seed": 0}})
        mine = [ask(a, {"type": "state"})["data"]["snapshot_id"] for _ in range(3)]  # a: its quota
        theirs = [ask(b, {"type": "state"})["data"]["snapshot_id"] for _ in range(4)]  # b: past the table's cap
        evicted = ask(c, {"type": "reset", "data": {"snapshot_id": theirs[0]}})
        assert evicted["type"] == "error" and "this was its session's oldest" in evicted["data"]["message"]
        for snapshot_id in mine:  # a's snapshots all survive b's
            assert ask(c, {"type": "reset", "data": {"snapshot_id": snapshot_id}})["type"] == "observation"
        full = ask(c, {"type": "state"})  # the table is full and c holds none: refused, nobody evicted
        assert full["type"] == "error" and full["data"]["code"] == "CAPACITY_REACHED"
        for snapshot_id in mine + theirs[2:]:
            assert ask(c, {"type": "reset", "data": {"snapshot_id": snapshot_id}})["type"] == "observation"
        ask(a, {"type": "state"})  # past its own quota: a's own oldest goes
        assert "oldest" in ask(c, {"type": "reset", "data": {"snapshot_id": mine[0]}})["data"]["message"]


def test_oversized_fields_are_refused_and_the_session_goes_on():
    big = "x" * 900_000
    with served(*TREE) as (url, proc), ws(url) as conn:
        assert ask(conn, {"type": "reset", "data": {"seed": 0}})["type"] == "observation"
        cases = [
            {"type": "reset", "data": {"episode_id": big}},
            {"type": "reset", "data": {"task_id": "t" * 2000}},
            {"type": "reset", "data": {"seed": 2**70}},
            {"type": "reset", "data": {"snapshot_id": big}},
            {"type": "reset", "data": {big: 1}},
            {"type": "step", "data": {"text": "a0", big: 1}},
            {"type": "step", "data": {"text": "a0", "metadata": [1]}},
            {"type": big},
            "[" * 100_000 + "]" * 100_000,  # nesting too deep to parse
        ]
        for message in cases:
            conn.send(message if isinstance(message, str) else json.dumps(message))
            raw = conn.recv(timeout=30)
            reply = json.loads(raw)
            assert reply["type"] == "error", str(message)[:80]
            assert reply["data"]["code"] in ("VALIDATION_ERROR", "UNKNOWN_TYPE", "INVALID_JSON")
            assert len(raw) < 2000  # the refused field is not sent back
        state = ask(conn, {"type": "state"})["data"]
        assert len(json.dumps(state)) < 1000  # the 0.9 MB episode_id never became the episode's
        assert ask(conn, {"type": "step", "data": {"text": "a0"}})["type"] == "observation"
        assert proc.poll() is None


def test_health_metadata_and_schema_show_no_kwargs_without_the_token():
    token = "t0ken-for-tests"
    with served(*TREE, env={"BPO_SERVE_TOKEN": token}) as (url, _):
        for path in ("/health", "/metadata", "/schema"):
            status, text = get(url, path)
            assert status == 200 and "987654321" not in text, path
            assert get(url, path, token="wrong")[1].count("987654321") == 0
        health = json.loads(get(url, "/health", token=token)[1])
        assert health["env_kwargs"]["seed"] == 987654321
        from bpo_envs.remote import describe_server

        assert describe_server(url, token=token)["env_kwargs"]["seed"] == 987654321
        assert "env_kwargs" not in describe_server(url, token=None)
    with served(*TREE) as (url, _):  # no token set: nothing to hide
        assert json.loads(get(url, "/health")[1])["env_kwargs"]["seed"] == 987654321


def test_sigterm_closes_everything_and_leaves_no_run_folder():
    make_or_skip("swebench")
    from bpo_envs.swebench.owners import RUN_DIR_PREFIX

    with served("BPO-SWEBench-v0", {"step_timeout": 20}) as (url, proc):
        with ws(url) as conn:
            ask(conn, {"type": "reset", "data": {"seed": 0}})
            assert ask(conn, {"type": "step", "data": {"text": "echo hi > note.txt"}})["type"] == "observation"
            assert ask(conn, {"type": "state"})["data"]["snapshot_id"]
            pattern = f"{tempfile.gettempdir()}/{RUN_DIR_PREFIX}{proc.pid}-*"
            assert glob.glob(pattern)  # the session's sandbox lives there
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 128 + signal.SIGTERM  # exited by itself, its exit handlers run
        assert glob.glob(pattern) == []


def test_the_connection_cap_fits_under_the_file_limit():
    """In a child process (its limits are its own): a cap that cannot fit is a clear error at
    start; a soft limit under what the cap needs is raised where the hard limit allows."""
    import subprocess
    import sys

    from serve_support import ROOT

    code = """
import resource
from bpo_envs.serve.connections import connection_cap
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))
print(connection_cap(128), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
print(connection_cap(4))
for sessions, cap in ((64, None), (4, 500), (4, 4)):
    try:
        connection_cap(sessions, cap)
    except ValueError as exc:
        print("refused:", exc)
"""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip("needs a hard file limit of 4096")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "384 1472"  # 128 + 256 connections, 64 + 8 x 128 files for the rest: raised to fit
    assert lines[1] == "160"  # 256 - 64 - 8 x 4: under the limit, not the default 260
    assert "file limit (256)" in lines[2] and "raise `ulimit -n`" in lines[2]
    assert "does not fit under the process's file limit (256)" in lines[3] and "at most 160" in lines[3]
    assert "must be above max_sessions" in lines[4]
