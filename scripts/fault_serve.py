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

    python scripts/fault_serve.py --out docs/results/serve/faults.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import rss_mb, start_server  # noqa: E402

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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=10_000)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--max-seconds", type=float, default=900.0)
    p.add_argument("--sample-every", type=int, default=250)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
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
    result["command"] = " ".join(["python", *sys.argv])
    result["loadavg"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
