"""The ALFWorld text engine as alfworld runs it (textworld ``PddlEnv`` + Fast Downward, wrapped
in alfworld's ``AlfredDemangler``), with snapshots.

Two kinds of saved state:

* :class:`NativeState` — Fast Downward's state id (``get_state_id``/``set_state_id`` of the
  shared library every ``PddlEnv`` loads its own copy of) plus the Python-side facts and the
  derived game state. Taking one costs a few dict copies; restoring one a few more. It is only
  valid in the engine that took it and until that engine loads or resets again (a reset
  rebuilds Fast Downward's state registry): :attr:`NativeState.epoch` records that.
* :class:`FactState` — the true facts themselves (PDDL atoms). Restoring one *re-roots* the
  game: the problem's ``:init`` is rewritten to those facts and loaded (one PDDL -> SAS
  translation the first time, cached afterwards). It works in any engine and any process.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bpo_envs.alfworld._upstream import (
    engine_patches,
    has_translation,
    load_translation,
    note_game_load,
    reuse_loaded_state,
    save_translation,
    upstream,
)
from bpo_envs.alfworld.derived import DERIVED, StateDerivations, game_identity, static_predicates

NOTHING_HAPPENS = "Nothing happens."
_EPOCHS = itertools.count(1)


@dataclass(frozen=True)
class FactState:
    """A portable game state: the problem it belongs to, its true facts and entity names."""

    problem_key: str
    facts: tuple[str, ...]  # sorted PDDL atoms, e.g. "(inreceptacle apple_bar_1 fridge_bar_1)"
    names: tuple[tuple[str, str], ...]  # (pddl id, display name) as the demangler gave them


@dataclass
class NativeState:
    """A state inside one engine's Fast Downward registry (see the module docstring)."""

    epoch: int
    state_id: int
    facts: Any
    vars_by_name: dict
    vars_by_type: Any
    var_counts: Any
    game_state: Any
    operators: dict
    moves: int


def _split_init(problem: str) -> tuple[str, str]:
    """Return the problem text before ``(:init`` and after its closing parenthesis."""
    match = re.search(r"\(\s*:init\b", problem, flags=re.IGNORECASE)
    if match is None:
        raise ValueError("the PDDL problem has no (:init ...) section")
    depth = 0
    for i in range(match.start(), len(problem)):
        ch = problem[i]
        if ch == ";":  # a comment runs to the end of the line
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return problem[: match.start()], problem[i + 1 :]
    raise ValueError("the PDDL problem's (:init ...) section is not closed")


def rerooted_problem(problem: str, facts: tuple[str, ...]) -> str:
    """``problem`` with its ``:init`` replaced by ``facts`` (objects and goal unchanged)."""
    head, tail = _split_init(problem)
    init = "(:init\n    (= (total-cost) 0)\n    " + "\n    ".join(facts) + "\n    )"
    return head + init + tail


class AlfredEngine:
    """One textworld ``PddlEnv`` (its own Fast Downward library) wrapped as alfworld wraps it."""

    def __init__(self) -> None:
        u = upstream()
        infos = u["textworld"].EnvInfos(admissible_commands=True, won=True)
        self._pddl_env = u["PddlEnv"](infos)
        self.env = u["AlfredDemangler"](self._pddl_env, shuffle=False)
        self.epoch = 0
        self.problem_key: str | None = None
        self._game: dict[str, Any] | None = None
        self._game_path: Path | None = None
        self._rooted = False  # the loaded problem is a re-rooted copy of self._game's
        self.predicates: frozenset[str] = frozenset()
        self.names: tuple[tuple[str, str], ...] = ()
        self._admissible: tuple[str, ...] = ()
        self._admissible_set: frozenset[str] = frozenset()
        self._game_ref: tuple[str, frozenset, frozenset[str]] | None = None  # the loaded game's identity, reference facts, static predicates

    # ---- loading ---------------------------------------------------------------------------
    def load(self, game: dict[str, Any], problem_key: str, game_path: Path | None = None) -> str:
        """Load ``game`` (a ``game.tw-pddl`` dict) and reset it; return the intro text.

        The game's translation is read from disk where one is stored (beside ``game_path``, see
        :func:`~bpo_envs.alfworld._upstream.load_translation`) and stored after a first load; the
        load is recorded for the process's translation cache, whose eviction predicts each
        game's next load from its last two (:func:`~bpo_envs.alfworld._upstream.note_game_load`)."""
        note_game_load(game)
        store = not has_translation(game) and not load_translation(game_path, game)
        self._game_ref = None
        with engine_patches():
            self.env.load(game)
            reuse_loaded_state(self._pddl_env._pddl_state)
            with self._derivations(0):
                state = self.env.reset()
        if store:
            save_translation(game_path, game)
        self._game, self._game_path = game, game_path
        self._rooted = False
        self.problem_key = problem_key
        self._loaded()
        return state.feedback

    def reset(self) -> str:
        """Reset the loaded game to its initial state; return the intro text."""
        if self._game is None:
            raise RuntimeError("no game loaded")
        if self._rooted:
            return self.load(self._game, str(self.problem_key), self._game_path)
        with engine_patches(), self._derivations(0):
            state = self.env.reset()
        self._new_epoch()
        return state.feedback

    def _loaded(self) -> None:
        env = self._pddl_env
        self.predicates = frozenset(p.name.lower() for p in env._pddl_state.task.predicates)
        self.names = tuple(sorted((k, info.name) for k, info in env._entity_infos.items()))
        self._new_epoch()

    def _new_epoch(self) -> None:
        self.epoch = next(_EPOCHS)
        self._sync()

    @contextlib.contextmanager
    def _derivations(self, depth: int) -> Iterator[None]:
        """Within the block (one reset after its load, or one step: the state is the same for
        every derivation after the reset's new state or the step's command), the game's grammar
        answers from the process's cache of derived texts (:mod:`.derived`): from the game's texts
        at any depth, from the state's when the block's state is ``depth`` <= ``DERIVED.depth``
        moves from its reset (deeper states are seldom met twice)."""
        env = self._pddl_env
        grammar = env._logic.grammar
        grammar.derive = StateDerivations(
            grammar.derive, lambda: env._pddl_state, self._game_key, self._static, self._state_key, depth <= DERIVED.depth
        )
        try:
            yield
        finally:
            del grammar.derive

    def _game_key(self) -> str:
        """The loaded game's identity (:func:`~.derived.game_identity`, taken at the first
        derivation since a load, with the game's reference facts and static predicates)."""
        if self._game_ref is None:
            env = self._pddl_env
            identity = game_identity(env)
            reference = DERIVED.reference(identity, frozenset(env._pddl_state.facts))
            self._game_ref = (identity, reference, static_predicates(env._pddl_state.task))
        return self._game_ref[0]

    def _static(self) -> frozenset[str]:
        """The loaded game's static predicates (:func:`~.derived.static_predicates`)."""
        self._game_key()
        return self._game_ref[2]

    def _state_key(self) -> tuple[str, frozenset]:
        """``(game identity, the state's facts ^ the game's reference facts)``."""
        identity = self._game_key()
        reference = self._game_ref[1]
        facts = frozenset(self._pddl_env._pddl_state.facts)
        return identity, frozenset(iter(facts ^ reference))  # a new table sized for the few facts that differ

    def _sync(self) -> None:
        self._admissible = tuple(self._pddl_env.state["admissible_commands"])
        self._admissible_set = frozenset(self._admissible)

    # ---- playing ---------------------------------------------------------------------------
    @property
    def admissible_commands(self) -> list[str]:
        return list(self._admissible)

    def is_admissible(self, command: str) -> bool:
        return command in self._admissible_set

    @property
    def won(self) -> bool:
        return bool(self._pddl_env.state["won"])

    def step(self, command: str) -> str:
        """Run an admissible ``command`` and return the feedback (callers check admissibility:
        anything else is answered with the engine's "Nothing happens." and changes nothing)."""
        if command not in self._admissible_set:
            return NOTHING_HAPPENS
        # the step's new state is at depth moves + 1 (textworld counts the moves since the reset)
        with engine_patches(), self._derivations(self._pddl_env._moves + 1):
            state, _, _ = self.env.step(command)
        self._sync()
        return state.feedback

    def game_state(self) -> Any:
        """textworld's game state of the current step (feedback, admissible commands, ``_facts``)."""
        return self._pddl_env.state

    def plan(self) -> list[str]:
        """The planner's (Fast Downward) commands from the current state to the goal."""
        if self.won:
            return []
        with engine_patches():
            return list(self._pddl_env._pddl_state.replan(self._pddl_env._entity_infos))

    # ---- snapshots -------------------------------------------------------------------------
    def capture(self) -> NativeState:
        env = self._pddl_env
        ps = env._pddl_state
        return NativeState(
            epoch=self.epoch,
            state_id=int(ps.downward_lib.get_state_id()),
            facts={sig: set(props) for sig, props in ps._facts.items()},
            vars_by_name=dict(ps._vars_by_name),
            vars_by_type={t: set(v) for t, v in ps._vars_by_type.items()},
            var_counts=ps._var_counts.copy(),
            game_state=env.state,
            operators=getattr(ps, "_operators", {}),  # third-party: textworld's PddlState, absent before first use
            moves=env._moves,
        )

    def can_restore(self, state: NativeState) -> bool:
        return state.epoch == self.epoch

    def restore(self, state: NativeState) -> None:
        """Return to a :class:`NativeState` taken by this engine in the current epoch."""
        if state.epoch != self.epoch:
            raise ValueError("this native state belongs to another engine or an earlier reset")
        env = self._pddl_env
        ps = env._pddl_state
        ps.downward_lib.set_state_id(state.state_id)
        ps._facts.clear()
        for sig, props in state.facts.items():
            ps._facts[sig] = set(props)
        ps._vars_by_name = dict(state.vars_by_name)
        ps._vars_by_type.clear()
        for t, v in state.vars_by_type.items():
            ps._vars_by_type[t] = set(v)
        ps._var_counts = state.var_counts.copy()
        ps._operators = state.operators
        env.state = state.game_state
        env._moves = state.moves
        self._sync()

    def facts(self, state: NativeState | None = None) -> FactState:
        """The portable form of ``state`` (default: the current state)."""
        fact_sets = state.facts if state is not None else self._pddl_env._pddl_state._facts
        atoms = sorted(
            "(" + " ".join([p.name, *(v.name for v in p.arguments)]) + ")"
            for props in fact_sets.values()
            for p in props
            if p.name in self.predicates
        )
        if self.problem_key is None:
            raise RuntimeError("no game loaded")
        return FactState(self.problem_key, tuple(atoms), self.names)

    def reroot(self, game: dict[str, Any], problem_key: str, state: FactState, game_path: Path | None = None) -> None:
        """Load ``game`` re-rooted at ``state`` (see the module docstring)."""
        problem = rerooted_problem(game["pddl_problem"], state.facts)
        rooted = dict(game, pddl_problem=problem)
        self._game_ref = None
        with engine_patches():
            self._pddl_env.load(rooted)
            names = dict(state.names)
            for key, info in self._pddl_env._entity_infos.items():
                info.name = names.get(key, info.name)
            with self._derivations(0):
                self._pddl_env.reset()
        self._game, self._game_path = game, game_path
        self._rooted = True
        self.problem_key = problem_key
        self._loaded()

    def close(self) -> None:
        self._game = None
