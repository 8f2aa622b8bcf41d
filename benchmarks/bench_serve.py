"""Served envs against in-process ones: steps/s, step latency, fork latency, memory per session.

For each env, a ``bpo-serve`` server runs in its own process on 127.0.0.1 and one client process
(this one, asyncio, one WebSocket per session) plays random admissible actions, resetting when
an episode ends, in 1 and in 32 concurrent sessions for ``--seconds`` each. Latency is one
``step`` message to its answer; throughput counts steps only (resets are extra messages).
Fork: ``state`` (which snapshots) then ``reset(snapshot_id=...)`` on a second session. Memory
(measured first, on the fresh server, so that every session makes its own env): the server's
resident set with 0 and with ``--memory-sessions`` reset sessions open. The client runs on
uvloop, as the server does; the load average is recorded with each row.
The in-process figure is the same walk calling ``env.step`` directly, one env.

``--baseline DIR`` compares two checkouts on one env instead: ``--rounds`` times, a server of
``DIR``'s code (``PYTHONPATH=DIR``) and one of this checkout's, alternated, each measured with
``--ab-sessions`` concurrent sessions for ``--seconds``; the JSON has every round, the medians,
their ratio (this / baseline) and the machine's load (``uptime``) around each measurement.

    python benchmarks/bench_serve.py --out docs/results/serve/bench.json
    python benchmarks/bench_serve.py --envs webshop --baseline /path/to/old/checkout --out docs/results/serve/bench-webshop-ab.json

``--glue`` measures the server's own layer alone (:func:`glue_cost`): recorded messages replayed
through the app's message handler in process, against the same env calls made directly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from websockets.asyncio.client import connect

import bpo_envs  # noqa: F401 - registers the ids
from bpo_envs.seeding import key_seed
from bpo_envs.serve.protocol import dumps, loads

ENVS = {
    "webshop": ("BPO-WebShop-v0", {}),
    "alfworld": ("BPO-ALFWorld-v0", {"games_per_type": 2}),
}
DEFAULTS = {  # forks, sessions for the memory figure (an ALFWorld reset takes 0.1-0.5 s)
    "webshop": {"forks": 300, "memory_sessions": 128},
    "alfworld": {"forks": 20, "memory_sessions": 16},
}
FORKS_PER_RESET = 10


def run(coro: Any) -> Any:
    """Run the client's coroutine on uvloop where installed (as the server does)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is part of the serve extra
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(
    env_id: str, kwargs: dict[str, Any], extra: list[str], code: Path | None = None
) -> tuple[subprocess.Popen, str]:
    """A ``bpo-serve`` process on 127.0.0.1 (of the checkout ``code``, default this one's)."""
    words = [f"{k}={json.dumps(v)}" for k, v in kwargs.items()]
    environ = None if code is None else {**os.environ, "PYTHONPATH": str(code)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bpo_envs.serve.cli", env_id, *words, "--port", "0", *extra],
        stdout=subprocess.PIPE, text=True, env=environ, cwd=None if code is None else code,
    )
    line = proc.stdout.readline()
    if not line.startswith("serving"):
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, line.split()[-1].replace("http://", "ws://") + "/ws"


async def call(ws, message: dict[str, Any]) -> dict[str, Any]:
    await ws.send(dumps(message))
    reply = loads(await ws.recv())
    if reply["type"] == "error":
        raise RuntimeError(reply["data"])
    return reply["data"]


async def walker(url: str, seed: int, stop_at: float, latencies: list[float]) -> int:
    rng = np.random.default_rng(seed)
    steps = 0
    async with connect(url, compression=None, max_size=None) as ws:
        episode = 0
        data = await call(ws, {"type": "reset", "data": {"seed": key_seed(seed, episode)}})
        while time.perf_counter() < stop_at:
            actions = data["observation"]["admissible_actions"] or ["look"]
            message = {"type": "step", "data": {"text": actions[int(rng.integers(len(actions)))]}}
            t = time.perf_counter()
            data = await call(ws, message)
            latencies.append(time.perf_counter() - t)
            steps += 1
            if data["done"]:
                episode += 1
                data = await call(ws, {"type": "reset", "data": {"seed": key_seed(seed, episode)}})
    return steps


async def served_throughput(url: str, pid: int, sessions: int, seconds: float) -> dict[str, Any]:
    warm: list[float] = []
    await asyncio.gather(*(walker(url, 1000 + i, time.perf_counter() + 1.0, warm) for i in range(sessions)))
    latencies: list[float] = []
    server0, client0 = cpu_seconds(pid), time.process_time()
    t0 = time.perf_counter()
    counts = await asyncio.gather(*(walker(url, i, t0 + seconds, latencies) for i in range(sessions)))
    elapsed = time.perf_counter() - t0
    server_cpu, client_cpu = cpu_seconds(pid) - server0, time.process_time() - client0
    lat = np.array(latencies) * 1000
    return {
        "sessions": sessions,
        "steps": int(sum(counts)),
        "steps_per_s": round(sum(counts) / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 3),
        "p99_ms": round(float(np.percentile(lat, 99)), 3),
        "server_cpu_us_per_step": round(server_cpu / sum(counts) * 1e6, 1),
        "client_cpu_us_per_step": round(client_cpu / sum(counts) * 1e6, 1),
    }


def in_process(env_id: str, kwargs: dict[str, Any], seconds: float) -> dict[str, Any]:
    env = gym.make(env_id, **kwargs)
    rng = np.random.default_rng(0)
    episode = 0
    _, info = env.reset(seed=episode)
    lat = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        actions = info.get("admissible_actions") or ["look"]
        t = time.perf_counter()
        _, _, term, trunc, info = env.step(actions[int(rng.integers(len(actions)))])
        lat.append(time.perf_counter() - t)
        if term or trunc:
            episode += 1
            _, info = env.reset(seed=episode)
    elapsed = time.perf_counter() - t0
    env.close()
    ms = np.array(lat) * 1000
    return {
        "sessions": 1,
        "steps": len(lat),
        "steps_per_s": round(len(lat) / elapsed, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
    }


async def fork_latency(url: str, count: int) -> dict[str, Any]:
    """``count`` forks: ``state`` on session a (a snapshot), then ``reset(snapshot_id)`` on b;
    a resets (a new task) every :data:`FORKS_PER_RESET` forks and steps once before each."""
    rng = np.random.default_rng(7)
    times, state_ms, restore_ms, own_ms = [], [], [], []
    async with connect(url, compression=None, max_size=None) as a, connect(url, compression=None, max_size=None) as b:
        data = None
        for i in range(count):
            if i % FORKS_PER_RESET == 0 or data["done"]:
                data = await call(a, {"type": "reset", "data": {"seed": i}})
            actions = data["observation"]["admissible_actions"] or ["look"]
            data = await call(a, {"type": "step", "data": {"text": actions[int(rng.integers(len(actions)))]}})
            t = time.perf_counter()
            state = await call(a, {"type": "state"})
            t1 = time.perf_counter()
            await call(b, {"type": "reset", "data": {"snapshot_id": state["snapshot_id"]}})
            t2 = time.perf_counter()
            times.append(t2 - t)
            state_ms.append(t1 - t)
            restore_ms.append(t2 - t1)
            await call(a, {"type": "reset", "data": {"snapshot_id": state["snapshot_id"]}})  # back into a itself
            own_ms.append(time.perf_counter() - t2)
            await a.send(dumps({"type": "release", "data": {"snapshot_ids": [state["snapshot_id"]]}}))
    ms = np.array(times) * 1000
    return {
        "forks": count,
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "state_p50_ms": round(float(np.percentile(np.array(state_ms) * 1000, 50)), 3),
        "restore_p50_ms": round(float(np.percentile(np.array(restore_ms) * 1000, 50)), 3),
        "restore_into_own_session_p50_ms": round(float(np.percentile(np.array(own_ms) * 1000, 50)), 3),
    }


async def memory_per_session(url: str, pid: int, sessions: int) -> dict[str, Any]:
    await asyncio.sleep(0.5)
    before = rss_mb(pid)
    conns = [await connect(url, compression=None, max_size=None) for _ in range(sessions)]
    for i, ws in enumerate(conns):
        await call(ws, {"type": "reset", "data": {"seed": i}})
    await asyncio.sleep(0.5)
    after = rss_mb(pid)
    for ws in conns:
        await ws.close()
    return {
        "sessions": sessions,
        "server_rss_mb_idle": round(before, 1),
        "server_rss_mb_with_sessions": round(after, 1),
        "mb_per_session": round((after - before) / sessions, 4),
    }


def bench_env(name: str, seconds: float, memory_sessions: int | None, forks: int | None, extra: list[str]) -> dict[str, Any]:
    env_id, kwargs = ENVS[name]
    forks = forks or DEFAULTS[name]["forks"]
    memory_sessions = memory_sessions or DEFAULTS[name]["memory_sessions"]
    out: dict[str, Any] = {"env_id": env_id, "kwargs": kwargs}
    out["in_process"] = in_process(env_id, kwargs, seconds)
    proc, url = start_server(env_id, kwargs, ["--max-sessions", str(max(64, memory_sessions + 2)), *extra])
    try:
        out["memory"] = run(memory_per_session(url, proc.pid, memory_sessions))  # first: every session makes its env
        out["served"] = []
        for n in (1, 32):
            out["served"].append({**run(served_throughput(url, proc.pid, n, seconds)), "loadavg_1min": os.getloadavg()[0]})
        out["fork"] = run(fork_latency(url, forks))
    finally:
        proc.terminate()
        proc.wait(10)
    return out


def glue_cost(name: str, messages: int = 3000, repeats: int = 3) -> dict[str, Any]:
    """CPU per message of the server's own layer, without the network: ``messages`` recorded
    messages of a random walk replayed through ``EnvServer._answer`` (and the reply's JSON), against
    the same env calls made directly; the rest of a served step's CPU is the WebSocket transport."""
    from bpo_envs.serve.app import EnvServer, ServeConfig
    from bpo_envs.serve.session import Session

    env_id, kwargs = ENVS[name]
    server = EnvServer(ServeConfig(env_id, kwargs))
    server.warm()

    async def replay() -> dict[str, Any]:
        session = Session("bench", server._idle_envs.pop(), server.calls, server.store)
        rng = np.random.default_rng(0)
        recorded = [dumps({"type": "reset", "data": {"seed": 0}})]
        reply = await server._answer(session, recorded[0])
        episode = 0
        while len(recorded) < messages:
            actions = reply["data"]["observation"]["admissible_actions"] or ["look"]
            recorded.append(dumps({"type": "step", "data": {"text": actions[int(rng.integers(len(actions)))]}}))
            reply = await server._answer(session, recorded[-1])
            if reply["data"]["done"]:
                episode += 1
                recorded.append(dumps({"type": "reset", "data": {"seed": episode}}))
                reply = await server._answer(session, recorded[-1])
        served, direct = [], []
        env = gym.make(env_id, **kwargs)
        for _ in range(repeats):
            t = time.process_time()
            for raw in recorded:
                dumps(await server._answer(session, raw))
            served.append(time.process_time() - t)
            t = time.process_time()
            for raw in recorded:
                message = loads(raw)
                if message["type"] == "reset":
                    env.reset(seed=message["data"]["seed"])
                else:
                    env.step(message["data"]["text"])
            direct.append(time.process_time() - t)
        env.close()
        return {"messages": len(recorded), "server_layer_and_env_us_per_message": round(min(served) / len(recorded) * 1e6, 1),
                "env_alone_us_per_message": round(min(direct) / len(recorded) * 1e6, 1)}

    try:
        return asyncio.run(replay())
    finally:
        server.close()


def uptime() -> str:
    """``uptime``'s line (the load averages of the shared machine)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def compare_checkouts(name: str, baseline: Path, rounds: int, sessions: int, seconds: float, extra: list[str]) -> dict[str, Any]:
    """Throughput of ``baseline``'s server and this checkout's, alternated ``rounds`` times."""
    env_id, kwargs = ENVS[name]
    here = Path(__file__).resolve().parents[1]
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
    for r in range(rounds):
        order = ("baseline", "this") if r % 2 == 0 else ("this", "baseline")  # neither always goes first
        for which in order:
            proc, url = start_server(env_id, kwargs, extra, baseline if which == "baseline" else here)
            try:
                before = uptime()
                row = run(served_throughput(url, proc.pid, sessions, seconds))
                runs[which].append({"round": r, **row, "uptime_before": before, "uptime_after": uptime()})
            finally:
                proc.terminate()
                proc.wait(30)
            print(json.dumps({which: runs[which][-1]}), flush=True)

    def median(which: str, key: str) -> float:
        return float(np.median([row[key] for row in runs[which]]))

    keys = ("steps_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_step")
    medians = {which: {k: round(median(which, k), 3) for k in keys} for which in runs}
    return {
        "env_id": env_id, "kwargs": kwargs, "sessions": sessions, "seconds_each": seconds, "rounds": rounds,
        "baseline": str(baseline), "this": str(here), "runs": runs, "medians": medians,
        "ratio_this_over_baseline": {k: round(medians["this"][k] / medians["baseline"][k], 3) for k in keys},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--forks", type=int, default=None, help="default: WebShop 300, ALFWorld 20")
    p.add_argument("--memory-sessions", type=int, default=None, help="default: WebShop 128, ALFWorld 16")
    p.add_argument("--server-args", default="", help="extra bpo-serve flags, e.g. '--threads 2'")
    p.add_argument("--baseline", type=Path, default=None, help="another checkout: compare its server with this one's")
    p.add_argument("--rounds", type=int, default=3, help="alternations with --baseline")
    p.add_argument("--ab-sessions", type=int, default=32, help="concurrent sessions with --baseline")
    p.add_argument("--glue", action="store_true", help="only the server layer's CPU per message, without the network")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    result: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_before": os.getloadavg(),
                    "nice": os.nice(0), "uptime_before": uptime(), "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())},
        "envs": {},
    }
    for name in args.envs:
        if args.glue:
            result["envs"][name] = {"glue": glue_cost(name)}
            print(json.dumps({name: result["envs"][name]}), flush=True)
            continue
        if args.baseline is not None:
            result["envs"][name] = compare_checkouts(
                name, args.baseline.resolve(), args.rounds, args.ab_sessions, args.seconds, args.server_args.split()
            )
            print(json.dumps({name: result["envs"][name]["ratio_this_over_baseline"]}), flush=True)
            continue
        result["envs"][name] = bench_env(name, args.seconds, args.memory_sessions, args.forks, args.server_args.split())
        print(json.dumps({name: result["envs"][name]}, indent=1), flush=True)
    result["machine"]["loadavg_after"] = os.getloadavg()
    result["machine"]["uptime_after"] = uptime()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
