"""Fault-injection load test of ``bpo-serve`` on 127.0.0.1: bad clients must not harm the server.

``--sessions`` concurrent clients play random WebShop episodes (``--episodes`` in all, at most
``--max-seconds``), each connection living for a few episodes. Between steps they inject, at
random: malformed JSON, an unknown message type, an action without ``text``, a message over the
size limit (and, rarely, one over the hard frame cap), an unknown snapshot id, unknown reset
arguments, a fork of their own snapshot, and a client that vanishes mid-step (the TCP
connection aborted right after a ``step`` is sent). Every fault must get its OpenEnv error (or a
closed session, where that is the answer); the server must stay up, end with no session open,
and keep a flat memory: its resident set is sampled every ``--sample-every`` episodes and the
second half's mean is compared with the first half's.

Then the hostile clients (``--attacks all``, on a second server with a bearer token and the
default limits but ``--max-sessions``): half-open connections (headers never finished), bodies
never finished, a flood of half-open connections past the connection cap, silent WebSockets
holding every session slot, one session taking snapshots past its quota, fields of 0.9 MB,
``/health`` / ``/metadata`` / ``/schema`` asked without the token, and SIGTERM (also to a
SWE-bench server where its local backend runs: its run folder must be gone). Each records the
time to its answer and whether it held (``attacks``; docs/serving.md "Hostile clients").

    python benchmarks/fault_serve.py --out docs/results/serve/faults.json
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as connect_sync

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import rss_mb, start_server, uptime  # noqa: E402

from bpo_envs.serve.protocol import dumps, loads  # noqa: E402

LIMIT = 64 * 1024  # the server's --max-message-bytes here (the hard frame cap is 4x)
FAULTS = {
    # name: (message, expected error code)
    "malformed_json": ('{"type": "step", "data": {"text": ', "INVALID_JSON"),
    "unknown_type": ({"type": "teleport", "data": {}}, "UNKNOWN_TYPE"),
    "action_without_text": ({"type": "step", "data": {"action": "click[buy now]"}}, "VALIDATION_ERROR"),
    "oversized_message": ({"type": "step", "data": {"text": "x" * (2 * LIMIT)}}, "VALIDATION_ERROR"),
    "unknown_snapshot_id": ({"type": "reset", "data": {"snapshot_id": "0" * 24}}, "VALIDATION_ERROR"),
    "unknown_reset_args": ({"type": "reset", "data": {"seed": 1, "difficulty": "hard"}}, "VALIDATION_ERROR"),
}


class Tally:
    def __init__(self) -> None:
        self.episodes = 0
        self.steps = 0
        self.faults: Counter[str] = Counter()
        self.wrong: list[str] = []
        self.forks = 0


async def ask(ws, message: Any) -> dict[str, Any]:
    await ws.send(message if isinstance(message, str) else dumps(message))
    return loads(await ws.recv())


async def client(url: str, tally: Tally, target: int, stop_at: float, rng: np.random.Generator) -> None:
    while tally.episodes < target and time.monotonic() < stop_at:
        ws = await connect(url, compression=None, max_size=None)
        vanished = False
        try:
            for _ in range(int(rng.integers(1, 8))):  # episodes on this connection
                if tally.episodes >= target:
                    break
                data = (await ask(ws, {"type": "reset", "data": {"seed": int(rng.integers(1 << 30))}}))["data"]
                snapshot_id = None
                while not data["done"]:
                    roll = rng.random()
                    if roll < 0.04:
                        name = list(FAULTS)[int(rng.integers(len(FAULTS)))]
                        message, code = FAULTS[name]
                        reply = await ask(ws, message)
                        tally.faults[name] += 1
                        if reply.get("type") != "error" or reply["data"].get("code") != code:
                            tally.wrong.append(f"{name}: {str(reply)[:200]}")
                        if name == "unknown_reset_args" and reply.get("type") == "observation":
                            data = reply["data"]
                        continue
                    if roll < 0.045:
                        tally.faults["vanish_mid_step"] += 1
                        await ws.send(dumps({"type": "step", "data": {"text": "click[next >]"}}))
                        ws.transport.abort()
                        vanished = True
                        break
                    if roll < 0.046:
                        tally.faults["over_frame_cap"] += 1
                        try:
                            reply = await ask(ws, {"type": "step", "data": {"text": "y" * (5 * LIMIT)}})
                            tally.wrong.append(f"over_frame_cap answered: {str(reply)[:200]}")
                        except ConnectionClosed:
                            pass  # the answer: the session is closed
                        vanished = True
                        break
                    if roll < 0.10:
                        if snapshot_id is None:
                            snapshot_id = (await ask(ws, {"type": "state"}))["data"]["snapshot_id"]
                        else:
                            reply = await ask(ws, {"type": "reset", "data": {"snapshot_id": snapshot_id}})
                            if reply.get("type") != "observation":
                                tally.wrong.append(f"fork: {str(reply)[:200]}")
                            else:
                                data = reply["data"]
                                tally.forks += 1
                        continue
                    actions = data["observation"]["admissible_actions"] or ["click[back to search]"]
                    reply = await ask(ws, {"type": "step", "data": {"text": actions[int(rng.integers(len(actions)))]}})
                    if reply.get("type") != "observation":
                        tally.wrong.append(f"step: {str(reply)[:200]}")
                        break
                    data = reply["data"]
                    tally.steps += 1
                tally.episodes += 1
                if vanished:
                    break
        finally:
            if not vanished:
                await ws.close()


async def run(url: str, pid: int, sessions: int, episodes: int, seconds: float, sample_every: int) -> dict[str, Any]:
    tally = Tally()
    samples: list[tuple[int, float]] = []
    stop_at = time.monotonic() + seconds

    async def sampler() -> None:
        next_at = 0
        while tally.episodes < episodes and time.monotonic() < stop_at:
            if tally.episodes >= next_at:
                samples.append((tally.episodes, rss_mb(pid)))
                next_at += sample_every
            await asyncio.sleep(0.05)

    rngs = [np.random.default_rng([worker, 2026]) for worker in range(sessions)]
    t0 = time.monotonic()
    await asyncio.gather(sampler(), *(client(url, tally, episodes, stop_at, rngs[w]) for w in range(sessions)))
    elapsed = time.monotonic() - t0
    samples.append((tally.episodes, rss_mb(pid)))
    half = len(samples) // 2
    first = float(np.mean([m for _, m in samples[1:half]] or [samples[0][1]]))
    second = float(np.mean([m for _, m in samples[half:]]))
    return {
        "episodes": tally.episodes,
        "steps": tally.steps,
        "forks": tally.forks,
        "seconds": round(elapsed, 1),
        "faults": dict(tally.faults),
        "wrong_answers": tally.wrong[:20],
        "wrong_answer_count": len(tally.wrong),
        "rss_mb_samples": [(e, round(m, 2)) for e, m in samples],
        "rss_mb_first_half_mean": round(first, 2),
        "rss_mb_second_half_mean": round(second, 2),
        "rss_mb_growth_second_half": round(second - first, 2),
    }


# ---- hostile clients -------------------------------------------------------------------------
ATTACK_TOKEN = "fault-serve-token"
ATTACK_KWARGS = {"goal_seed": 987654321}  # a kwarg whose value /health must not show without the token


def http_get(base: str, path: str, token: str | None = None, timeout: float = 60) -> tuple[int, str]:
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, repr(exc)


def partial_requests(base: str, count: int, body: bool = False) -> list[socket.socket]:
    """``count`` connections that send part of a request, then nothing."""
    port = int(base.rsplit(":", 1)[1])
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{" if body else b"GET /health HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    return socks


def closed_within(socks: list[socket.socket], seconds: float) -> dict[str, Any]:
    """Wait (at most ``seconds``) for the server to close every socket; what it answered."""
    t0 = time.monotonic()
    answers: Counter[str] = Counter()
    still_open = 0
    for s in socks:
        s.settimeout(max(0.01, seconds - (time.monotonic() - t0)))
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
            answers[data.split(b" ")[1].decode() if data.startswith(b"HTTP/") else "closed"] += 1
        except (TimeoutError, OSError):
            still_open += 1
        finally:
            s.close()
    return {"answers": dict(answers), "still_open": still_open, "seconds_to_last_close": round(time.monotonic() - t0, 2)}


def ws_sync(ws_url: str, token: str | None = ATTACK_TOKEN):
    return connect_sync(ws_url, additional_headers={"Authorization": f"Bearer {token}"} if token else None,
                        compression=None, open_timeout=30, max_size=None)


def ask_sync(conn, message: Any) -> dict[str, Any]:
    conn.send(message if isinstance(message, str) else dumps(message))
    return loads(conn.recv(timeout=60))


def attack_half_open(base: str, health: dict[str, Any]) -> dict[str, Any]:
    socks = partial_requests(base, 20)
    status = http_get(base, "/health")[0]
    out = {"connections": 20, "health_meanwhile": status, **closed_within(socks, 45)}
    out["held"] = status == 200 and out["still_open"] == 0 and out["seconds_to_last_close"] <= 30
    return out


def attack_slow_body(base: str, health: dict[str, Any]) -> dict[str, Any]:
    socks = partial_requests(base, 5, body=True)
    out = {"connections": 5, **closed_within(socks, 60)}
    out["held"] = out["still_open"] == 0 and out["answers"].get("408") == 5
    return out


def attack_flood(base: str, health: dict[str, Any]) -> dict[str, Any]:
    """The connection cap plus 100 half-open connections (today: past a 1,024-file limit every
    connection was reset); /health and a WebSocket session meanwhile."""
    count = int(health.get("max_connections", 264)) + 100  # 264: today's default cap, for a server without one
    t0 = time.monotonic()
    socks = partial_requests(base, count)
    opened = time.monotonic() - t0
    status = http_get(base, "/health")[0]
    ws_url = base.replace("http://", "ws://") + "/ws"
    try:
        with ws_sync(ws_url) as conn:
            session = ask_sync(conn, {"type": "reset", "data": {"seed": 1}}).get("type")
    except Exception as exc:  # noqa: BLE001 - recorded: the attack got through
        session = repr(exc)[:200]
    out = {"connections": count, "seconds_to_open": round(opened, 2), "health_meanwhile": status,
           "session_meanwhile": session, **closed_within(socks, 60)}
    out["held"] = status == 200 and session == "observation" and out["still_open"] == 0
    return out


def attack_silent_sessions(base: str, health: dict[str, Any]) -> dict[str, Any]:
    """Every session slot held by a WebSocket that never sends; a legitimate client retries
    each second until it gets a session."""
    ws_url = base.replace("http://", "ws://") + "/ws"
    silent = [ws_sync(ws_url) for _ in range(int(health["max_sessions"]) - int(health["sessions"]))]
    t0 = time.monotonic()
    got_in = None
    refusals = 0
    try:
        while time.monotonic() - t0 < 90:
            try:
                with ws_sync(ws_url) as conn:
                    reply = ask_sync(conn, {"type": "reset", "data": {"seed": 2}})
            except ConnectionClosed:  # refused and closed before the reset was read
                reply = {"type": "error"}
            if reply.get("type") == "observation":
                got_in = round(time.monotonic() - t0, 2)
                break
            refusals += 1
            time.sleep(1.0)
    finally:
        for conn in silent:
            conn.close()
    return {"silent_sessions": len(silent), "refusals_before": refusals, "seconds_to_a_session": got_in,
            "held": got_in is not None and got_in <= 60}


def attack_snapshot_quota(base: str, health: dict[str, Any]) -> dict[str, Any]:
    """One session calls ``state`` past the server's snapshot cap (and its own quota); another
    session's snapshots must survive."""
    ws_url = base.replace("http://", "ws://") + "/ws"
    count = max(int(health.get("session_snapshot_cap", 0)), int(health["snapshot_cap"])) + 50
    with ws_sync(ws_url) as victim, ws_sync(ws_url) as hog:
        ask_sync(victim, {"type": "reset", "data": {"seed": 3}})
        ask_sync(hog, {"type": "reset", "data": {"seed": 4}})
        kept = [ask_sync(victim, {"type": "state"})["data"]["snapshot_id"] for _ in range(3)]
        t0 = time.monotonic()
        for _ in range(count):
            ask_sync(hog, {"type": "state"})
        seconds = time.monotonic() - t0
        survived = sum(ask_sync(hog, {"type": "reset", "data": {"snapshot_id": i}}).get("type") == "observation" for i in kept)
    return {"hog_states": count, "seconds": round(seconds, 2), "victim_snapshots": 3,
            "victim_snapshots_alive": survived, "held": survived == 3}


def attack_oversized_fields(base: str, health: dict[str, Any]) -> dict[str, Any]:
    ws_url = base.replace("http://", "ws://") + "/ws"
    big = "x" * 900_000
    cases = {
        "episode_id_0.9MB": {"type": "reset", "data": {"episode_id": big}},
        "task_id_0.9MB": {"type": "reset", "data": {"task_id": big}},
        "snapshot_id_0.9MB": {"type": "reset", "data": {"snapshot_id": big}},
        "reset_key_0.9MB": {"type": "reset", "data": {big: 1}},
        "type_0.9MB": {"type": big},
        "seed_2**70": {"type": "reset", "data": {"seed": 2**70}},
        "nesting_100k": "[" * 100_000 + "]" * 100_000,
    }
    answers = {}
    with ws_sync(ws_url) as conn:
        ask_sync(conn, {"type": "reset", "data": {"seed": 5}})
        for name, message in cases.items():
            t0 = time.monotonic()
            conn.send(message if isinstance(message, str) else dumps(message))
            raw = conn.recv(timeout=60)
            reply = loads(raw)
            answers[name] = {"answer": reply["data"].get("code") if reply.get("type") == "error" else reply.get("type"),
                             "reply_bytes": len(raw), "seconds": round(time.monotonic() - t0, 3)}
        state_bytes = len(dumps(ask_sync(conn, {"type": "state"})))
        after = ask_sync(conn, {"type": "step", "data": {"text": "search[shoes]"}}).get("type")
    held = all(a["answer"] in ("VALIDATION_ERROR", "UNKNOWN_TYPE", "INVALID_JSON") and a["reply_bytes"] < 2000
               for a in answers.values()) and after == "observation" and state_bytes < 2000
    return {"fields": answers, "state_bytes_after": state_bytes, "session_after": after, "held": held}


def attack_kwargs_without_token(base: str, health: dict[str, Any]) -> dict[str, Any]:
    secret = str(ATTACK_KWARGS["goal_seed"])
    shown = {path: secret in http_get(base, path)[1] for path in ("/health", "/metadata", "/schema")}
    with_token = secret in http_get(base, "/health", token=ATTACK_TOKEN)[1]
    return {"kwargs_shown_without_token": shown, "kwargs_shown_with_token": with_token,
            "held": not any(shown.values()) and with_token}


def attack_sigterm(proc: Any, base: str) -> dict[str, Any]:
    """SIGTERM with a session open: the process ends by itself (exit handlers run), quickly."""
    ws_url = base.replace("http://", "ws://") + "/ws"
    conn = ws_sync(ws_url)
    ask_sync(conn, {"type": "reset", "data": {"seed": 6}})
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(60)
    except Exception:  # noqa: BLE001 - recorded
        rc = None
    conn.close()
    return {"returncode": rc, "seconds_to_exit": round(time.monotonic() - t0, 2), "held": rc == 128 + signal.SIGTERM}


def attack_sigterm_swebench(code: Path | None = None) -> dict[str, Any]:
    """SIGTERM to a SWE-bench server (local backend) mid-session: no run folder may stay."""
    try:
        from bpo_envs.swebench.owners import RUN_DIR_PREFIX

        proc, ws_url = start_server("BPO-SWEBench-v0", {"step_timeout": 20}, [], code)
    except Exception as exc:  # noqa: BLE001 - the SWE-bench extra or its sandbox is absent here
        return {"skipped": f"{type(exc).__name__}: {exc}"[:300]}
    try:
        with connect_sync(ws_url, compression=None, open_timeout=60) as conn:
            ask_sync(conn, {"type": "reset", "data": {"seed": 0}})
            ask_sync(conn, {"type": "step", "data": {"text": "echo note > note.txt"}})
            ask_sync(conn, {"type": "state"})
            pattern = f"{tempfile.gettempdir()}/{RUN_DIR_PREFIX}{proc.pid}-*"
            before = len(glob.glob(pattern))
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(120)
        left = glob.glob(pattern)
        for path in left:  # recorded; then removed, so that the host keeps nothing of the attack
            shutil.rmtree(path, ignore_errors=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"run_folders_before": before, "run_folders_left": left, "returncode": rc,
            "seconds_to_exit": round(time.monotonic() - t0, 2), "held": before == 1 and not left}


ATTACKS = {
    "half_open_headers": attack_half_open,
    "slow_body": attack_slow_body,
    "connection_flood": attack_flood,
    "silent_sessions": attack_silent_sessions,
    "snapshot_quota": attack_snapshot_quota,
    "oversized_fields": attack_oversized_fields,
    "kwargs_without_token": attack_kwargs_without_token,
}


def run_attacks(max_sessions: int, server_args: list[str], code: Path | None = None) -> dict[str, Any]:
    """Every attack on a fresh WebShop server (a bearer token, default limits unless
    ``server_args`` sets them), then SIGTERM."""
    environ_token = os.environ.get("BPO_SERVE_TOKEN")
    os.environ["BPO_SERVE_TOKEN"] = ATTACK_TOKEN
    try:
        proc, ws_url = start_server("BPO-WebShop-v0", ATTACK_KWARGS, ["--max-sessions", str(max_sessions), *server_args], code)
    finally:
        if environ_token is None:
            os.environ.pop("BPO_SERVE_TOKEN", None)
        else:
            os.environ["BPO_SERVE_TOKEN"] = environ_token
    base = ws_url.replace("ws://", "http://").removesuffix("/ws")
    results: dict[str, Any] = {}
    try:
        for name, attack in ATTACKS.items():
            health = json.loads(http_get(base, "/health", token=ATTACK_TOKEN)[1])
            t0 = time.monotonic()
            try:
                results[name] = attack(base, health)
            except Exception as exc:  # noqa: BLE001 - an attack that breaks the client is a failed hold
                results[name] = {"held": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
            results[name]["wall_seconds"] = round(time.monotonic() - t0, 2)
            results[name]["server_alive"] = proc.poll() is None
            print(json.dumps({name: results[name]})[:400], flush=True)
        results["final_health"] = json.loads(http_get(base, "/health", token=ATTACK_TOKEN)[1])
        results["sigterm"] = attack_sigterm(proc, base)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    results["sigterm_swebench"] = attack_sigterm_swebench(code)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=10_000)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--max-seconds", type=float, default=900.0)
    p.add_argument("--sample-every", type=int, default=250)
    p.add_argument("--attacks", choices=("all", "none"), default="all", help="then the hostile clients (docs/serving.md)")
    p.add_argument("--attack-sessions", type=int, default=8, help="--max-sessions of the attacks' server")
    p.add_argument("--attack-server-args", default="", help="more bpo-serve flags for the attacks' server")
    p.add_argument("--attacks-only", action="store_true", help="skip the fault-injection episodes")
    p.add_argument("--server-code", type=Path, default=None,
                   help="run the attacks' servers from another checkout (PYTHONPATH=DIR), e.g. the code before a change")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    result: dict[str, Any] = {}
    if not args.attacks_only:
        flags = ["--max-sessions", str(args.sessions + 4), "--max-message-bytes", str(LIMIT), "--idle-timeout", "30"]
        proc, url = start_server("BPO-WebShop-v0", {}, flags)
        try:
            result = asyncio.run(run(url, proc.pid, args.sessions, args.episodes, args.max_seconds, args.sample_every))
            time.sleep(1.0)
            with urllib.request.urlopen(url.replace("ws://", "http://").removesuffix("/ws") + "/health", timeout=10) as r:
                health = json.loads(r.read())
            result["server_alive"] = proc.poll() is None
            result["server_crashes"] = 0 if result["server_alive"] else 1
            result["health_after"] = health
        finally:
            proc.terminate()
            proc.wait(10)
    if args.attacks == "all" or args.attacks_only:
        result["attack_server_code"] = str(args.server_code or "this checkout")
        result["attacks"] = run_attacks(args.attack_sessions, args.attack_server_args.split(), args.server_code)
        result["attacks_held"] = all(
            a.get("held", True) for k, a in result["attacks"].items() if isinstance(a, dict) and k != "final_health"
        )
    result["command"] = " ".join(["python", *sys.argv])
    result["loadavg"] = os.getloadavg()
    result["uptime"] = uptime()
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
