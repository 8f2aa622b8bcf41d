"""ALFWorld game loads (bpo_envs/alfworld/_upstream.py): the translation cache stays within its
byte bound and, on the evaluation's cyclic scan of more games than it holds, keeps games that
the next pass finds (plain LRU, the broken case, finds none); a game state built from the kept
parsed facts plays exactly as one textworld parses afresh (facts kept without those of Fast
Downward's initial state, the broken case, are caught)."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest
from alfworld_support import private_cache

pytest.importorskip("fast_downward", reason="run bpo-gym-setup alfworld")
pytest.importorskip("textworld", reason="run bpo-gym-setup alfworld")

import gymnasium as gym  # noqa: E402

from bpo_envs.alfworld import _upstream  # noqa: E402
from bpo_envs.alfworld.engine import AlfredEngine  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_translation_eviction import lru, replay  # noqa: E402  - the benchmark's replay of a load sequence

TASKS = ("pick_and_place_simple/0001", "look_at_obj_in_light/0001", "pick_and_place_simple/0002", "look_at_obj_in_light/0002")


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    with private_cache(tmp_path_factory, "alfworld-loads-cache"):
        yield


@pytest.fixture(scope="module")
def games() -> list[tuple[dict[str, Any], Any]]:
    env = gym.make("BPO-ALFWorld-v0", games_per_type=2, expert="handcoded").unwrapped
    try:
        return [(env.games.game(t), env.games.game_path(t)) for t in TASKS]
    finally:
        env.close()


@pytest.fixture(autouse=True)
def _empty_cache() -> None:
    _upstream.clear_translation_cache()
    yield
    _upstream.clear_translation_cache()


def _hit_rate(sequence: list[int], sizes: list[int], bound: int, victim: Any = None) -> float:
    """The share of game loads of ``sequence`` (problem indices) whose two translations the
    cache held, each problem's pair ``sizes[i]`` estimated bytes, replayed through the cache by
    the benchmark's :func:`replay` (``victim``: its choice of what leaves; None: the cache's);
    checks the bound after every store."""

    def within_bound(keys: list[tuple[str, bool]]) -> None:
        within = _upstream.translation_cache_bytes() <= bound
        assert within or set(_upstream._PROBLEM_BYTES) == {keys[0][0]}, "over the bound with another problem kept"
        assert _upstream.translation_cache_bytes() == sum(size for _, size in _upstream._TRANSLATIONS.values())

    return replay(sequence, sizes, victim, bound, after_store=within_bound)


def _evaluation_job(seed: int = 0) -> list[int]:
    """The main job's pattern of loads (``docs/results/bench-main-job/alfworld-loads``): an
    evaluation pass over 14 games (``valid_seen``) and one over 10 others (``valid_unseen``);
    then, 6 times, 3 training tasks drawn from 10, each loaded by 4 envs in a row (a group of
    episodes), and an evaluation pass over the same 14 games in the same order."""
    rng = random.Random(seed)
    evaluation = list(range(10, 24))
    sequence = evaluation + list(range(24, 34))
    for _ in range(6):
        for _ in range(3):
            sequence += [rng.randrange(10)] * 4
        sequence += evaluation
    return sequence


def test_the_cache_keeps_its_bound_and_finds_games_on_a_cyclic_scan() -> None:
    size, held = 60_000, 8  # room for 8 of the 24 games' translations
    rate = _hit_rate(list(range(14)) * 5, [size] * 24, held * size)
    # LRU drops every game before its next load; the cache keeps 7 of the 14 from the first
    # pass (the 8th room holds each newest game in turn) and finds them in each of the next 4
    assert rate >= 4 * 7 / 70
    # games of different sizes, training draws between the passes
    sizes = [size - 6_000 * (i % 3) for i in range(34)]
    assert _hit_rate(_evaluation_job(), sizes, held * size) > JOB_RATE


JOB_RATE = 0.45
"""Above LRU's rate on :func:`_evaluation_job` (0.31: the groups' repeated loads only), near the
optimum's (Belady's, knowing the future: 0.54)."""


def test_lru_finds_nothing_on_a_cyclic_scan() -> None:
    """The broken case: with LRU's choice the checks above fail."""
    sizes = [60_000] * 34
    assert _hit_rate(list(range(14)) * 5, sizes, 8 * 60_000, lru) == 0.0
    assert not _hit_rate(_evaluation_job(), [60_000 - 6_000 * (i % 3) for i in range(34)], 8 * 60_000, lru) > JOB_RATE


def test_real_game_loads_in_a_cycle_find_the_kept_games(games: list[tuple[dict[str, Any], Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Four real games loaded in a cycle through a cache with room for about three: after the
    first pass the engine finds at least two of them each pass (LRU: none), within the bound."""
    engine = AlfredEngine()
    for game, path in games:
        engine.load(game, "k", path)
    sizes = dict(_upstream._PROBLEM_BYTES)
    assert len(sizes) == len(games)

    def passes(victim: Any) -> int:
        _upstream.clear_translation_cache()
        hits = 0
        with monkeypatch.context() as patch:
            patch.setattr(_upstream, "TRANSLATION_CACHE_BYTES", sum(sizes.values()) - min(sizes.values()) // 2)
            patch.setattr(_upstream, "_victim", victim)
            for _ in range(3):
                for game, path in games:
                    hits += _upstream.has_translation(game)
                    engine.load(game, "k", path)
                    assert _upstream.translation_cache_bytes() <= _upstream.TRANSLATION_CACHE_BYTES
        return hits

    assert passes(_upstream._victim) >= 2 * 2
    assert passes(lru) == 0


# ---- states built from kept parsed facts -----------------------------------------------------
def _walk(engine: AlfredEngine, game: dict[str, Any], path: Any, seed: int) -> list[Any]:
    """A load, a random admissible walk with planner calls and a reset: every text, command
    list and plan, the state's facts and variables in their sets' order, Fast Downward's state id."""
    out: list[Any] = [engine.load(game, "k", path)]

    def state() -> Any:
        ps = engine._pddl_env._pddl_state
        return (
            [(sig, list(facts)) for sig, facts in ps._facts.items()],
            list(ps._vars_by_name.items()),
            [(t, list(v)) for t, v in ps._vars_by_type.items()],
            list(ps._var_counts.items()),
            int(ps.downward_lib.get_state_id()),
        )

    out.append(state())
    rng = random.Random(seed)
    for i in range(12):
        commands = engine.admissible_commands
        out += [commands, engine.step(rng.choice(commands)), state()]
        if i % 5 == 0:
            out.append(engine.plan())
    out += [engine.reset(), engine.admissible_commands, state()]
    return out


def _fresh_and_kept(games: list[tuple[dict[str, Any], Any]], monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any]]:
    engine = AlfredEngine()
    with monkeypatch.context() as patch:  # textworld's own PddlState: every state parsed afresh
        engine.load(*games[0])  # fills _upstream._saved
        patch.setitem(_upstream._saved, "__fast_state__", _upstream._saved["__state__"])
        fresh = [_walk(engine, game, path, seed) for seed, (game, path) in enumerate(games)]
    _upstream.clear_translation_cache()
    for game, path in games:
        engine.load(game, "k", path)  # parses, and keeps, every game's facts
    assert len(_upstream._PARSED_FACTS) == len(games)
    kept = [_walk(engine, game, path, seed) for seed, (game, path) in enumerate(games)]
    return fresh, kept


@pytest.mark.parametrize("translations_held", [True, False])
def test_states_from_kept_facts_play_as_fresh_ones(
    games: list[tuple[dict[str, Any], Any]], monkeypatch: pytest.MonkeyPatch, translations_held: bool
) -> None:
    """With the translations held, and with each read from disk again at every load (the
    parsed facts are kept apart from them)."""
    if not translations_held:
        monkeypatch.setattr(_upstream, "TRANSLATION_CACHE_BYTES", 1)
    fresh, kept = _fresh_and_kept(games, monkeypatch)
    assert kept == fresh
    if not translations_held:
        assert len(_upstream._PROBLEM_BYTES) == 1


def test_the_parsed_facts_keep_their_bound(games: list[tuple[dict[str, Any], Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    engine = AlfredEngine()
    for game, path in games:
        engine.load(game, "k", path)
    sizes = [size for _, size in _upstream._PARSED_FACTS.values()]
    assert _upstream.parsed_facts_bytes() == sum(sizes) > 0
    _upstream.clear_translation_cache()
    bound = sum(sizes) - min(sizes) // 2  # room for 3 of the 4
    monkeypatch.setattr(_upstream, "PARSED_FACTS_BYTES", bound)
    for _ in range(3):
        for game, path in games:
            engine.load(game, "k", path)
            assert _upstream.parsed_facts_bytes() <= bound
            assert _upstream.parsed_facts_bytes() == sum(size for _, size in _upstream._PARSED_FACTS.values())
    assert len(_upstream._PARSED_FACTS) == 3


def test_facts_kept_without_the_initial_state_are_caught(games: list[tuple[dict[str, Any], Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken case: states built from the problem's ``:init`` facts alone (those textworld
    parses from Fast Downward's initial state left out)."""
    build = _upstream._state_from_parsed

    def partial(cls: Any, lib: Any, problem: str, logic: Any, parsed: Any) -> Any:
        return build(cls, lib, problem, logic, parsed[:1])

    monkeypatch.setattr(_upstream, "_state_from_parsed", partial)
    fresh, kept = _fresh_and_kept(games, monkeypatch)
    assert kept != fresh
