"""The ALFWorld translation cache's hit rate on a job's own sequence of game loads, for its
eviction choice (``bpo_envs.alfworld._upstream._victim``) and for LRU, MRU, a seeded random
choice and Belady's optimum (which knows the future), under the same byte bound. Writes JSON.

The sequences are those ``bench_main_job.py`` records (``alfworld_game_loads`` in each row of
its ``results.json``: every game load of the job, in order, and each game's translations'
estimated bytes); each is replayed through the cache's own code (``note_game_load`` and
``_store_translation``, with translations of the recorded estimated size)::

    python benchmarks/bench_translation_eviction.py docs/results/bench-main-job/alfworld-loads/results.json \
        --out docs/results/bench-main-job/alfworld-loads/eviction.json

A load is a hit when both of its game's translations are held at its start (``has_translation``
but the grammar parse, which is kept apart).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bpo_envs.alfworld import _upstream


def _last_load(digest: str) -> int:
    """When the problem was last loaded (-1: not in the load history)."""
    return _upstream._LOADS.get(digest, (-1, None))[0]


def lru(newest: str) -> str:
    """The least recently loaded problem leaves (what the cache did before)."""
    return min((d for d in _upstream._PROBLEM_BYTES if d != newest), key=_last_load)


def _mru(newest: str) -> str:
    return max((d for d in _upstream._PROBLEM_BYTES if d != newest), key=_last_load)


def _random(seed: int) -> Callable[[str], str]:
    rng = random.Random(seed)

    def victim(newest: str) -> str:
        choices = [d for d in _upstream._PROBLEM_BYTES if d != newest]
        return choices[rng.randrange(len(choices))]

    return victim


def replay(sequence: list[int], sizes: list[int], victim: Callable[[str], str] | None, bound: int,
           after_store: Callable[[list[tuple[str, bool]]], None] | None = None) -> float:
    """The share of the loads of ``sequence`` (game indices; game ``i``'s two translations
    ``sizes[i]`` estimated bytes) that find both translations held, with ``victim`` choosing
    what leaves (None: the cache's own choice) and ``bound`` bytes. ``after_store(keys)`` is
    called after every store (``keys``: the loaded game's two translation keys), e.g. to check
    the bound (``tests/test_alfworld_loads.py``)."""
    _upstream.clear_translation_cache()
    saved = (_upstream._victim, _upstream.TRANSLATION_CACHE_BYTES)
    _upstream.TRANSLATION_CACHE_BYTES = bound
    if victim is not None:
        _upstream._victim = victim
    hits = 0
    try:
        for i in sequence:
            game = {"pddl_domain": "domain", "pddl_problem": f"problem {i}"}
            _upstream.note_game_load(game)
            keys = [_upstream._key(game["pddl_domain"], game["pddl_problem"], optimize) for optimize in (False, True)]
            if all(key in _upstream._TRANSLATIONS for key in keys):
                hits += 1
                continue
            for key in keys:  # half the pair's estimate each (3 bytes a SAS character)
                _upstream._store_translation(key, (None, "x" * (sizes[i] // 6)))
                if after_store is not None:
                    after_store(keys)
    finally:
        _upstream._victim, _upstream.TRANSLATION_CACHE_BYTES = saved
        _upstream.clear_translation_cache()
    return hits / len(sequence)


def belady(sequence: list[int], sizes: list[int], bound: int) -> float:
    """The hit rate when the game whose next load is furthest leaves (the optimum for equal
    sizes; the newest always kept, as the cache does)."""
    following = [0] * len(sequence)
    last: dict[int, int] = {}
    for t in range(len(sequence) - 1, -1, -1):
        following[t] = last.get(sequence[t], len(sequence))
        last[sequence[t]] = t
    held: dict[int, int] = {}
    total = hits = 0
    for t, i in enumerate(sequence):
        if i in held:
            hits += 1
        else:
            total += sizes[i]
        held[i] = following[t]
        while total > bound and len(held) > 1:
            out = max((g for g in held if g != i), key=held.__getitem__)
            total -= sizes[out]
            del held[out]
    return hits / len(sequence)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a bench_main_job.py results.json")
    parser.add_argument("--bound-mib", type=float, default=_upstream.TRANSLATION_CACHE_BYTES / 2**20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    bound = int(args.bound_mib * 2**20)
    out: dict[str, Any] = {"bound_mib": args.bound_mib, "rows": []}
    for row in json.loads(Path(args.results).read_text())["rows"]:
        loads = row.get("plain", {}).get("alfworld_game_loads")
        if not loads:
            continue
        sequence, sizes = loads["sequence"], [size for _, size in loads["games"]]
        out["rows"].append({
            "label": row.get("label"), "loads": len(sequence), "games": len(sizes),
            "measured_in_process": loads["in_process"] / loads["loads"],
            "replayed": {
                "this cache": replay(sequence, sizes, None, bound), "lru": replay(sequence, sizes, lru, bound),
                "mru": replay(sequence, sizes, _mru, bound), "random (seed 0)": replay(sequence, sizes, _random(0), bound),
                "belady (optimum)": belady(sequence, sizes, bound),
            },
        })
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
