"""ALFWorld's cache of derived texts (bpo_envs/alfworld/derived.py): the same episodes, text for
text, with the cache off, on and filled, and with only the texts that read no more than a game's
static facts kept (at every depth); a key without the state, and a reader that takes a changing
predicate for a static one, are caught."""

from __future__ import annotations

import random
from typing import Any

import pytest
from alfworld_support import engine_every_step, private_cache  # noqa: F401 - a fixture

pytest.importorskip("fast_downward", reason="run bpo-gym-setup alfworld")
pytest.importorskip("textworld", reason="run bpo-gym-setup alfworld")

import gymnasium as gym  # noqa: E402

import bpo_envs  # noqa: E402
from bpo_envs.alfworld.derived import (  # noqa: E402
    DERIVED,
    DerivedTexts,
    StateReader,
    _Reader,
    _Reads,
    game_identity,
)
from bpo_envs.alfworld.engine import AlfredEngine  # noqa: E402

pytestmark = pytest.mark.usefixtures("engine_every_step")  # these tests read the engine's own state

TASKS = ("pick_and_place_simple/0001", "look_at_obj_in_light/0001")


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    with private_cache(tmp_path_factory, "alfworld-derived-cache"):
        yield


@pytest.fixture(autouse=True)
def _every_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    # the walks go deeper than the cached depth: cache every state they meet
    monkeypatch.setattr(DERIVED, "depth", 1000)


@pytest.fixture(scope="module")
def envs() -> list[gym.Env]:
    made = [gym.make("BPO-ALFWorld-v0", games_per_type=2, expert="handcoded") for _ in range(2)]
    yield made
    for env in made:
        env.close()


def _seen(env: gym.Env, out: Any) -> tuple[Any, Any]:
    # what the agent sees, and textworld's own list of the state's commands in its order
    return out, list(env.unwrapped._engine.game_state()["_valid_commands"])


def _choose(rng: random.Random, admissible: list[str], i: int) -> str:
    # "inventory" every third step and "take" where it can: texts that the same command derives
    # differently in different states (the key must tell them apart)
    if i % 3 == 2 and "inventory" in admissible:
        return "inventory"
    takes = [a for a in admissible if a.startswith("take ")]
    return rng.choice(takes or admissible)


def play(env: gym.Env, seed: int = 0, steps: int = 14) -> list[Any]:
    """Random admissible walks on every task of :data:`TASKS`, with a native snapshot restored
    mid-episode (a second walk from it) and a portable one (a re-rooted game): every reset and
    step result (observation, reward, flags, info with the admissible list) and textworld's list
    of commands."""
    rng = random.Random(seed)
    seen: list[Any] = []
    for task in TASKS:
        obs, info = env.reset(options={"task_id": task})
        seen.append(_seen(env, (obs, info)))
        snap = portable = None
        for i in range(steps):
            out = env.step(_choose(rng, info["admissible_actions"], i))
            seen.append(_seen(env, out))
            info = out[4]
            if i == steps // 3:
                snap = bpo_envs.snapshot(env)
            if i == steps // 2:
                portable = bpo_envs.snapshot(env).portable()
            if out[2] or out[3]:
                break
        for saved in (snap, portable):
            if saved is None:
                continue
            bpo_envs.restore(env, saved)
            info = env.unwrapped._info(env.unwrapped.task_id)
            for i in range(steps // 2):
                out = env.step(_choose(rng, info["admissible_actions"], i))
                seen.append(_seen(env, out))
                info = out[4]
                if out[2] or out[3]:
                    break
    return seen


def test_cached_texts_equal_textworlds_derivations(envs: list[gym.Env], monkeypatch: pytest.MonkeyPatch) -> None:
    DERIVED.clear()
    monkeypatch.setattr(DERIVED, "enabled", False)
    reference = play(envs[0])
    assert DERIVED.hits == DERIVED.misses == 0 and len(DERIVED) == 0
    monkeypatch.setattr(DERIVED, "enabled", True)
    cold = play(envs[0])
    misses = DERIVED.misses
    assert misses > 0
    warm = play(envs[1])  # another engine of the process: every state met before
    assert DERIVED.misses == misses, "the second pass derived text the first had kept"
    assert DERIVED.hits > misses
    assert cold == reference
    assert warm == reference
    # another walk (other states) still equals textworld's own derivations
    other = play(envs[1], seed=1)
    monkeypatch.setattr(DERIVED, "enabled", False)
    assert play(envs[0], seed=1) == other


def test_a_key_without_the_state_is_caught(envs: list[gym.Env], monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken case the equality check must catch: a key that omits the state's facts (the
    game only) gives one state's texts for another's."""
    DERIVED.clear()
    monkeypatch.setattr(DERIVED, "enabled", False)
    reference = play(envs[0], seed=2)
    monkeypatch.setattr(DERIVED, "enabled", True)

    def game_only(self: AlfredEngine) -> tuple[str, frozenset]:
        return game_identity(self._pddl_env), frozenset()

    monkeypatch.setattr(AlfredEngine, "_state_key", game_only)
    assert play(envs[0], seed=2) != reference
    DERIVED.clear()


def test_the_cache_is_bounded(envs: list[gym.Env], monkeypatch: pytest.MonkeyPatch) -> None:
    cache = DerivedTexts(max_texts=40)
    for i in range(100):
        state = (f"game {i % 7}", frozenset({i}))
        for j in range(3):
            cache.put(state, (f"start {j}",), f"text {i} {j}")
        assert len(cache) <= 40
    assert cache.get(cache.texts(("game 1", frozenset({99}))), ("start 2",)) == "text 99 2"
    assert cache.get(cache.texts(("game 0", frozenset({0}))), ("start 0",)) is None
    held = cache.texts(("game 5", None))
    for j in range(41):  # one key over the bound alone is dropped too
        cache.put(("game 5", None), (f"start {j}",), "text")
    assert len(cache) <= 40 and held.get(("start 0",)) == "text"  # a dropped dict still answers what it holds
    DERIVED.clear()
    monkeypatch.setattr(DERIVED, "max_texts", 40)
    monkeypatch.setattr(DERIVED, "enabled", False)
    reference = play(envs[0], seed=3)
    monkeypatch.setattr(DERIVED, "enabled", True)
    assert play(envs[0], seed=3) == reference  # texts dropped mid-episode are derived again
    assert 0 < len(DERIVED) <= 40
    DERIVED.clear()


def test_chained_facts_are_textworlds_facts_in_its_order(envs: list[gym.Env]) -> None:
    """``engine_patches``' ``State.facts`` (chained in C) lists what textworld's generator lists,
    in its order; the broken case: the same facts in another order is told apart."""
    from textworld.logic import State

    from bpo_envs.alfworld._upstream import _chained_facts

    env = envs[0]
    env.reset(options={"task_id": TASKS[0]})
    rng = random.Random(4)
    info = env.unwrapped._info(TASKS[0])
    for i in range(6):
        info = env.step(_choose(rng, info["admissible_actions"], i))[4]
    state = env.unwrapped._engine._pddl_env._pddl_state
    textworld_order = list(State.__dict__["facts"].fget(state))  # outside an engine block: textworld's own generator
    assert list(_chained_facts(state)) == textworld_order
    assert list(reversed(list(_chained_facts(state)))) != textworld_order


def test_only_states_near_the_reset_are_kept(envs: list[gym.Env], monkeypatch: pytest.MonkeyPatch) -> None:
    """``DERIVED.depth`` 0: the reset's state texts are kept, a step's are not (its game texts
    are); the broken case, a step at depth 1 with depth 1 allowed, keeps more state texts."""
    env = envs[0]

    def state_texts() -> int:
        return len(DERIVED) - DERIVED.game_texts

    for depth, grows in ((0, False), (1, True)):
        DERIVED.clear()
        monkeypatch.setattr(DERIVED, "depth", depth)
        _, info = env.reset(options={"task_id": TASKS[0]})
        at_reset, games_at_reset = state_texts(), DERIVED.game_texts
        assert at_reset > 0 and games_at_reset > 0
        env.step(next(a for a in info["admissible_actions"] if a.startswith("go to ")))  # new places: new commands
        assert (state_texts() > at_reset) is grows
        assert DERIVED.game_texts > games_at_reset
    DERIVED.clear()


def test_game_texts_equal_textworlds_derivations_at_every_depth(envs: list[gym.Env], monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the reset's state texts kept (``depth`` 0), every step's game texts: the same
    episodes as textworld's own derivations, in the engine that kept them and in another; most
    of a walk's derivations are then answered by game texts (the commands)."""
    monkeypatch.setattr(DERIVED, "depth", 0)
    DERIVED.clear()
    monkeypatch.setattr(DERIVED, "enabled", False)
    reference = play(envs[0], seed=6)
    monkeypatch.setattr(DERIVED, "enabled", True)
    assert play(envs[0], seed=6) == reference
    misses = DERIVED.misses
    assert play(envs[1], seed=6) == reference
    assert DERIVED.game_hits > 0 and DERIVED.game_texts > 0
    assert DERIVED.misses - misses < DERIVED.game_hits  # the repeat derives only state texts
    DERIVED.clear()


def test_a_changing_predicate_taken_for_static_is_caught(envs: list[gym.Env], monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken case the equality check must catch: every predicate taken for static (what a
    receptacle holds, the inventory) keeps one state's feedback as the game's text."""
    monkeypatch.setattr(DERIVED, "depth", 0)
    DERIVED.clear()
    monkeypatch.setattr(DERIVED, "enabled", False)
    reference = play(envs[0], seed=7)
    monkeypatch.setattr(DERIVED, "enabled", True)

    def everything(self: AlfredEngine) -> frozenset[str]:
        names = {p.name.lower() for p in self._pddl_env._pddl_state.task.predicates}
        return frozenset(names | {"not_" + n for n in names})

    monkeypatch.setattr(AlfredEngine, "_static", everything)
    assert play(envs[0], seed=7) != reference
    DERIVED.clear()


def test_the_reader_counts_every_read_but_static_facts(envs: list[gym.Env]) -> None:
    """:class:`StateReader` answers what the state answers; a query of static predicates only
    (``receptacleatlocation``) is not a read of the state, a query of a changing one
    (``inreceptacle``), the variables by type, another attribute and any use of the facts are."""
    from textworld.logic import Rule

    from bpo_envs.alfworld.derived import static_predicates

    env = envs[0]
    env.reset(options={"task_id": TASKS[0]})
    state = env.unwrapped._engine._pddl_env._pddl_state
    static = static_predicates(state.task)
    assert {"receptacleatlocation", "not_receptacleatlocation", "openable"} <= static
    assert not {"inreceptacle", "not_inreceptacle", "atlocation", "holds", "opened"} & static
    assert not {axiom.name for axiom in state.task.axioms} & static

    def read(query: str) -> tuple[list[Any], bool]:
        reads = _Reads()
        rule = Rule.parse_conjunctive_query(query)
        found = list(StateReader(state, reads, static).all_assignments(rule, {}))
        assert found == list(state.all_assignments(rule, {}))
        return found, reads.state

    found, was_read = read("receptacleatlocation(r:receptacle, l:location)")
    assert found and not was_read
    found, was_read = read("inreceptacle(o:object, r:receptacle)")
    assert found and was_read
    for use in (lambda r, f: r.variables_of_type("receptacle"), lambda r, f: r.facts, lambda r, f: len(f),
                lambda r, f: list(f), lambda r, f: f[0], lambda r, f: bool(f)):
        reads = _Reads()
        use(StateReader(state, reads, static), _Reader(list(state.facts), reads))
        assert reads.state
    reads = _Reads()
    assert StateReader(state, reads, static)._logic is state._logic and not reads.state


def test_engine_patches_derive_textworlds_own_texts(envs: list[gym.Env]) -> None:
    """Inside an engine block (flags read once, expressions compiled once, facts chained, parses
    memoised) the grammar derives what textworld's unpatched code derives outside one: the intro
    and every applicable action's command text of a state some steps in. The broken case: another
    state's texts differ (the comparison can fail)."""
    from bpo_envs.alfworld._upstream import engine_patches

    env = envs[0]
    _, info = env.reset(options={"task_id": TASKS[1]})
    rng = random.Random(5)
    for i in range(5):
        info = env.step(_choose(rng, info["admissible_actions"], i))[4]
    pddl_env = env.unwrapped._engine._pddl_env

    def texts() -> list[str]:
        state, infos = pddl_env._pddl_state, pddl_env._entity_infos
        out = [pddl_env._logic.grammar.derive("#intro#", {"state": state, "facts": list(state.facts), "variables": {},
                                                          "mapping": {}, "entity_infos": infos})]
        for action in state.all_applicable_actions():
            context = {"state": state, "facts": list(state.facts), "mapping": action.mapping, "entity_infos": infos,
                       "variables": {ph.name: infos[var.name] for ph, var in action.mapping.items()}}
            out.append(pddl_env._logic.grammar.derive(pddl_env._logic.actions[action.name].template, context))
        return out

    textworld_own = texts()
    with engine_patches():
        patched = texts()
    assert patched == textworld_own
    env.step(next(a for a in info["admissible_actions"] if a.startswith("go to ")))  # another place: another state
    with engine_patches():
        assert texts() != textworld_own
