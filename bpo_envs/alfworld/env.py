"""``BPO-ALFWorld-v0``: ALFWorld's text engine (textworld PDDL + Fast Downward) with snapshots."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bpo_envs.alfworld.engine import NOTHING_HAPPENS, AlfredEngine, FactState, NativeState
from bpo_envs.alfworld.games import DataGames, GeneratedGames
from bpo_envs.core import SnapshotEnv


@dataclass
class _Saved:
    """The task part of a snapshot: a native state (fast, this engine and reset only) and/or the
    facts it stands for (portable, restored by re-rooting)."""

    task_id: str
    native: NativeState | None
    facts: FactState | None
    at_start: bool  # no command has changed the state since reset: reloading the game suffices
    names: tuple[tuple[str, str], ...]
    predicates: frozenset[str]
    problem_key: str

    def fact_state(self) -> FactState:
        if self.facts is None:
            assert self.native is not None
            atoms = sorted(
                "(" + " ".join([p.name, *(v.name for v in p.arguments)]) + ")"
                for props in self.native.facts.values()
                for p in props
                if p.name in self.predicates
            )
            self.facts = FactState(self.problem_key, tuple(atoms), self.names)
        return self.facts


def _canonical(action: str) -> str:
    return " ".join(action.split()).lower()


class ALFWorldEnv(SnapshotEnv):
    """ALFWorld as text: ``reset`` gives the room and "Your task is to: ...", actions are the
    engine's commands (``go to cabinet 1``, ``take apple 1 from countertop 2``, ...).

    Args:
        data_dir: an ALFWorld data folder (the one ``alfworld-download`` fills: it holds
            ``json_2.1.1/<split>/<task>/<trial>/game.tw-pddl`` and ``traj_data.json``). Default:
            ``$ALFWORLD_DATA`` when it holds a ``json_2.1.1/<split>`` folder, else the offline
            generator's games.
        split: ``train``, ``valid_seen`` or ``valid_unseen``.
        task_types: a subset of :data:`TASK_TYPES` (default: all six).
        games_per_type: how many generated games per task type the task ids cover (generated
            games only; each is made and planner-checked the first time it is used, then cached
            under ``$BPO_ALFWORLD_CACHE`` or ``$XDG_CACHE_HOME/bpo_gym/alfworld``).
        generator_seed: selects another deterministic set of generated games.
        max_episode_steps: the step limit (truncation), default 50.

    Reward 1 when the goal holds (the episode then terminates), else 0. ``info`` has
    ``admissible_actions`` (sorted), ``won``, ``task_type``, and ``invalid_action`` after a
    command the engine does not accept (answered "Nothing happens.", state unchanged). Commands
    are matched after collapsing whitespace and lower-casing.
    """

    restore_prefers_origin = True  # native state-id restores only on the env that took them

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        split: str = "train",
        task_types: Sequence[str] | None = None,
        games_per_type: int = 200,
        generator_seed: int = 0,
        max_episode_steps: int = 50,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(max_episode_steps=max_episode_steps, render_mode=render_mode)
        if data_dir is None:
            env_data = os.environ.get("ALFWORLD_DATA")
            if env_data and os.path.isdir(os.path.join(env_data, "json_2.1.1", split)):
                data_dir = env_data
        if data_dir is not None:
            self.games: DataGames | GeneratedGames = DataGames(data_dir, split, task_types)
        else:
            self.games = GeneratedGames(split, task_types, games_per_type, generator_seed)
        self._ids = self.games.task_ids()
        self._engine = AlfredEngine()
        self._moved = False

    # ---- tasks ---------------------------------------------------------------------------
    def task_ids(self) -> list[str]:
        return self._ids

    def task_type(self, task_id: str | None = None) -> str:
        """The ALFWorld task type of ``task_id`` (default: the current task)."""
        return self.games.task_type(task_id if task_id is not None else self.task_id)

    def _key(self, task_id: str) -> str:
        return repr((self.games.identity, task_id))

    def _info(self, task_id: str) -> dict[str, Any]:
        return {
            "admissible_actions": self._engine.admissible_commands,
            "won": self._engine.won,
            "task_type": self.games.task_type(task_id),
        }

    def _reset_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        key = self._key(task_id)
        if self._engine.problem_key == key:
            intro = self._engine.reset()
        else:
            intro = self._engine.load(self.games.game(task_id), key)
        self._moved = False
        return intro, self._info(task_id)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        command = _canonical(action)
        if not self._engine.is_admissible(command):
            info = self._info(self.task_id)
            info["invalid_action"] = True
            return NOTHING_HAPPENS, 0.0, False, info
        feedback = self._engine.step(command)
        self._moved = True
        info = self._info(self.task_id)
        won = info["won"]
        return feedback, 1.0 if won else 0.0, won, info

    def expert_actions(self) -> list[str]:
        """Fast Downward's plan from the current state (alfworld's "planner" expert)."""
        if not self._started:
            raise RuntimeError("call reset() before expert_actions()")
        return self._engine.plan()

    # ---- snapshots -----------------------------------------------------------------------
    def _snapshot_kind(self) -> Any:
        return ("ALFWorld", self.games.identity)

    def _get_state(self) -> _Saved:
        engine = self._engine
        return _Saved(
            task_id=self.task_id,
            native=engine.capture(),
            facts=None,
            at_start=not self._moved,
            names=engine.names,
            predicates=engine.predicates,
            problem_key=str(engine.problem_key),
        )

    def _set_state(self, state: _Saved) -> None:
        engine = self._engine
        if state.native is not None and engine.can_restore(state.native):
            engine.restore(state.native)
        elif state.at_start:
            self._reset_task(state.task_id)
        else:
            engine.reroot(self.games.game(state.task_id), self._key(state.task_id), state.fact_state())
        self._moved = not state.at_start

    def _portable_task_state(self, inner: _Saved) -> dict[str, Any]:
        facts = inner.fact_state()
        return {"task_id": inner.task_id, "facts": facts.facts, "names": facts.names, "at_start": inner.at_start}

    def _task_state_from_portable(self, obj: dict[str, Any]) -> _Saved:
        key = self._key(obj["task_id"])
        facts = FactState(key, tuple(obj["facts"]), tuple(map(tuple, obj["names"])))
        return _Saved(obj["task_id"], None, facts, bool(obj["at_start"]), facts.names, frozenset(), key)

    def _release_task_state(self, inner: _Saved) -> None:
        # the native state holds copies of every fact set; a released snapshot is never restored
        inner.native = None

    def close(self) -> None:
        self._engine.close()
        super().close()
