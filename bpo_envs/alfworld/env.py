"""``BPO-ALFWorld-v0``: ALFWorld's text engine (textworld PDDL + Fast Downward) with snapshots."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bpo_envs.alfworld.engine import NOTHING_HAPPENS, AlfredEngine, FactState, NativeState
from bpo_envs.alfworld.expert import (
    EXPERTS,
    ExpertState,
    HandcodedExpert,
    check_expert,
    readable_facts,
)
from bpo_envs.alfworld.games import DataGames, GeneratedGames
from bpo_envs.alfworld.generator import GENERATOR_VERSION
from bpo_envs.alfworld.transitions import MEMO, Answer, CommandPath
from bpo_envs.alfworld.verify import PLANNER_TIMEOUT_S
from bpo_envs.core import SnapshotEnv
from bpo_envs.reward_settings import REWARD_SETTINGS, VERL_AGENT_REWARD, reward_settings

log = logging.getLogger(__name__)

ENV_ID = "BPO-ALFWorld-v0"
UPSTREAM_HOME = "~/.cache/alfworld"
"""Where ``alfworld-download`` puts the data when ``$ALFWORLD_DATA`` is unset."""
__all__ = ["ENV_ID", "EXPERTS", "REWARD_SETTINGS", "UPSTREAM_HOME", "VERL_AGENT_REWARD", "ALFWorldEnv", "find_data"]


def _has_split(folder: str | os.PathLike, split: str) -> bool:
    base = Path(folder).expanduser()
    return (base / "json_2.1.1" / split).is_dir() or (base.name == "json_2.1.1" and (base / split).is_dir())


def find_data(data_dir: str | os.PathLike | None, split: str) -> tuple[str | None, str]:
    """Where the games come from, as upstream looks: ``data_dir=``, then ``$ALFWORLD_DATA``, then
    ``~/.cache/alfworld``; ``(None, "generated")`` when none holds ``json_2.1.1/<split>``.

    Returns ``(folder, source)`` with ``source`` one of ``"data_dir"``, ``"$ALFWORLD_DATA"``,
    ``"~/.cache/alfworld"``, ``"generated"``. An explicit ``data_dir`` is used as given (a
    missing split there is an error later, naming the path); a ``$ALFWORLD_DATA`` without the
    split is logged and passed over.
    """
    if data_dir is not None:
        return str(data_dir), "data_dir"
    env_data = os.environ.get("ALFWORLD_DATA")
    if env_data:
        if _has_split(env_data, split):
            return env_data, "$ALFWORLD_DATA"
        log.warning("ALFWorld: $ALFWORLD_DATA=%s has no json_2.1.1/%s; looking further", env_data, split)
    home = os.path.expanduser(UPSTREAM_HOME)
    if _has_split(home, split):
        return home, UPSTREAM_HOME
    return None, "generated"


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
    # the handcoded expert: its inputs so far (command, feedback, admissible commands, facts, won: a _Told, or
    # plain data from portable bytes), its intro, and the expert's own state where it was asked during the episode
    trace: tuple[Any, ...] | None = None
    intro: str = ""
    expert: ExpertState | None = None
    # the episode's commands (canonical, and whether each was admissible): what the transition
    # memo is read by after a restore in this process (None: not known, memo off)
    commands: tuple[tuple[str, bool], ...] | None = None

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


@dataclass(frozen=True)
class _Told:
    """What the handcoded expert is told after one step, as the engine left it: the command,
    the feedback, and the step's own admissible list, facts (textworld propositions) and won
    flag, read from the game state that step made (never changed afterwards). Turned into plain
    data (:meth:`plain`) only where it must travel (portable bytes), so a step whose expert is
    never asked pays nothing for it."""

    command: str
    feedback: str
    admissible: Any
    facts: Any
    won: Any

    def plain(self) -> tuple[Any, ...]:
        """``(command, feedback, admissible commands, facts, won)`` as strings and tuples."""
        facts = tuple((f.name, tuple((v.name, v.type) for v in f.arguments)) for f in self.facts)
        return (self.command, self.feedback, tuple(self.admissible), facts, bool(self.won))


def _plain_told(told: Any) -> tuple[Any, ...]:
    return told.plain() if isinstance(told, _Told) else told


def _canonical(action: str) -> str:
    return " ".join(action.split()).lower()


class ALFWorldEnv(SnapshotEnv):
    """ALFWorld as text: ``reset`` gives the room and "Your task is to: ...", actions are the
    engine's commands (``go to cabinet 1``, ``take apple 1 from countertop 2``, ...).

    Args:
        data_dir: an ALFWorld data folder (the one ``alfworld-download`` fills: it holds
            ``json_2.1.1/<split>/<task>/<trial>/game.tw-pddl`` and ``traj_data.json``). Default:
            as upstream looks (:func:`find_data`): ``$ALFWORLD_DATA``, then
            ``~/.cache/alfworld``, when it holds a ``json_2.1.1/<split>`` folder, else the
            offline generator's games. A log line and ``info["data_source"]`` say which; only
            games marked ``solvable`` are listed, as upstream.
        split: ``train``, ``valid_seen`` (upstream's ``eval_in_distribution``) or
            ``valid_unseen`` (``eval_out_of_distribution``), upstream's folder names.
        task_types: a subset of :data:`TASK_TYPES` (default: all six).
        games_per_type: how many generated games per task type the task ids cover (generated
            games only; each is made and planner-checked the first time it is used, then cached
            under ``$BPO_ALFWORLD_CACHE`` or ``$XDG_CACHE_HOME/bpo_gym/alfworld``).
        generator_seed: selects another deterministic set of generated games.
        generator_version: ``3`` (default: ALFRED's rooms with every receptacle, ALFRED's
            instance counts within a problem-size bound, ALFRED's valid_unseen floor plans), ``2``
            or ``1`` (earlier, easier rooms, kept reproducible); see :mod:`.generator`.
        planner_timeout: seconds one planner check of a generated game may take before it is
            killed and the next attempt drawn (logged and counted; see :mod:`.verify`).
        reward_mode, reward_scale, invalid_penalty: see :mod:`bpo_envs.reward_settings`
            (both modes pay 1 on success here; ``REWARD_SETTINGS["verl-agent"]`` pays 10 and
            -0.1 per invalid command).
        max_episode_steps: the step limit (truncation), default 50.
        expert: what :meth:`~ALFWorldEnv.expert_actions` answers: ``"planner"`` (default: Fast
            Downward's plan on the full game state, which walks straight to hidden objects) or
            ``"handcoded"`` (alfworld's own exploring expert, which acts only on what the
            agent has observed; one action at a time; see :mod:`.expert`).

    Reward ``reward_scale`` when the goal holds (the episode then terminates), else 0, and
    ``-invalid_penalty`` after an invalid command. ``info`` has ``admissible_actions``
    (sorted), ``won``, ``task_type``, ``data_source`` (where :func:`find_data` found the games,
    or ``"generated-v<version>"``), and ``invalid_action`` after a command the
    engine does not accept (answered "Nothing happens.", state unchanged). Commands are matched
    after collapsing whitespace and lower-casing.
    """

    restore_prefers_origin = True  # native state-id restores only on the env that took them
    has_expert = True  # the planner's (or alfworld's handcoded) plan: expert=
    # step_may_block stays True (the default), by measurement. A step alone is bounded work in
    # process (Fast Downward's successor and textworld's admissible-command grounding on a
    # finite game; random admissible actions on generated games, thread CPU time: median 3.2 ms,
    # p99 6.1 ms, max 53 ms over 900 steps; with the handcoded expert asked at every step, its
    # heuristics inside step: median 7 ms, p99 48 ms, max 67 ms). But the declaration covers
    # reset, snapshot and restore too, and those wait on more than that: reset makes a generated
    # game on first use (the planner, a process killed after planner_timeout: 0.2-15 s, up to
    # about 2 minutes) and a restore on another env re-roots the game (a PDDL translation). What
    # the threads cost here is small: a 360-step RLOO collection used 1.7-2.0 CPU s with the
    # steps on the pool's thread and 1.5-1.7 s with a subclass declaring False (wall time the
    # same within the noise of a loaded machine). benchmarks/bench_pool_handoff.py: 11% of the
    # steps' CPU with one hand-off per step, about 1% since a call's steps go as one job.

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        split: str = "train",
        task_types: Sequence[str] | None = None,
        games_per_type: int = 200,
        generator_seed: int = 0,
        generator_version: int = GENERATOR_VERSION,
        planner_timeout: float = PLANNER_TIMEOUT_S,
        reward_mode: str = "score",
        reward_scale: float = 1.0,
        invalid_penalty: float = 0.0,
        max_episode_steps: int = 50,
        render_mode: str | None = None,
        expert: str = "planner",
    ) -> None:
        super().__init__(max_episode_steps=max_episode_steps, render_mode=render_mode)
        self.expert = check_expert(expert)
        self.rewards = reward_settings(reward_mode, reward_scale, invalid_penalty)
        folder, self.data_source = find_data(data_dir, split)
        if folder is not None:
            self.games: DataGames | GeneratedGames = DataGames(folder, split, task_types)
            log.info("ALFWorld %s: %d games from %s (%s)", split, len(self.games.task_ids()), self.games.root, self.data_source)
        else:
            self.games = GeneratedGames(
                split, task_types, games_per_type, generator_seed, generator_version, planner_timeout
            )
            log.info(
                "ALFWorld %s: no ALFWorld data (data_dir=, $ALFWORLD_DATA, %s); %d generated games (generator v%s)",
                split, UPSTREAM_HOME, len(self.games.task_ids()), self.games.identity[1],
            )  # fmt: skip
        self.split = split
        # info names the generator's version, as provenance() does
        self._info_source = self.data_source if folder is not None else f"generated-v{self.games.version}"
        self._ids = self.games.task_ids()
        self._engine = AlfredEngine()
        self._moved = False
        # the episode as the env shows it (bpo_envs.alfworld.transitions): its game, its commands
        # (None: unknown after a portable restore or a re-rooting, so the memo is off until the
        # next reset), the admissible ones as the path, what the env shows now, and how many of
        # the commands the engine has run since its reset of this episode (None: not reset for it)
        self._episode, self._episode_key = "", ""
        self._commands: list[tuple[str, bool]] | None = []
        self._path: CommandPath = ()
        self._now = Answer("", (), False)
        self._engine_at: int | None = None
        # handcoded expert: the episode's steps, and the expert once asked (then kept current)
        self._intro = ""
        self._trace: list[Any] | None = [] if self.expert == "handcoded" else None
        self._handcoded: HandcodedExpert | None = None

    # ---- tasks ---------------------------------------------------------------------------
    def task_ids(self) -> list[str]:
        return self._ids

    def task_type(self, task_id: str | None = None) -> str:
        """The ALFWorld task type of ``task_id`` (default: the current task)."""
        return self.games.task_type(task_id if task_id is not None else self.task_id)

    def _key(self, task_id: str) -> str:
        return repr((self.games.identity, task_id))

    def provenance(self) -> dict[str, Any]:
        """Which data (generator + version, or folder + files hash), split and task count."""
        return {"env": ENV_ID, **self.games.provenance(), "found_via": self.data_source, "reward": self.rewards.as_dict()}

    def _info(self, task_id: str) -> dict[str, Any]:
        return {
            "admissible_actions": list(self._now.admissible),
            "won": self._now.won,
            "task_type": self.games.task_type(task_id),
            "data_source": self._info_source,
        }

    def _engine_answer(self, text: str) -> Answer:
        return Answer(text, tuple(self._engine.admissible_commands), self._engine.won)

    def _engine_reset(self, task_id: str) -> Answer:
        """Load (or, when it holds the game already, reset) the engine at ``task_id``'s start."""
        key = self._key(task_id)
        if self._engine.problem_key == key:
            intro = self._engine.reset()
        else:
            intro = self._engine.load(self.games.game(task_id), key, self.games.game_path(task_id))
        return self._engine_answer(intro)

    def _memo_reads(self) -> bool:
        """Whether this step may be answered from the memo: the path is known and no live
        handcoded expert needs to be told the engine's state at every step."""
        return MEMO.enabled and self._commands is not None and self._handcoded is None

    def _sync_engine(self) -> None:
        """Bring the engine to the episode's current state: reset it for this episode if it is
        not, then replay the commands it has not run (recording them for the handcoded expert as
        playing them did). Everything that reads the engine's own state calls this first."""
        if self._commands is None or self._engine_at == len(self._commands):
            return
        if self._engine_at is None:
            self._engine_reset(self._episode)
            self._engine_at = 0
            if self._trace is not None:
                self._trace = []
        for command, valid in self._commands[self._engine_at :]:
            self._record(command, self._engine.step(command) if valid else NOTHING_HAPPENS)
        self._engine_at = len(self._commands)

    def _reset_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        key = self._key(task_id)
        answer = MEMO.get(key, ()) if MEMO.enabled else None
        self._engine_at = None  # the engine is this episode's only once reset for it
        if answer is None:
            answer = self._engine_reset(task_id)
            MEMO.put(key, (), answer)
            self._engine_at = 0
        self._episode, self._episode_key, self._commands, self._path, self._now = task_id, key, [], (), answer
        self._moved = False
        self._intro = answer.text
        if self.expert == "handcoded":
            self._trace, self._handcoded = [], None
        return answer.text, self._info(task_id)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        command = _canonical(action)
        valid = command in self._now.admissible
        answer = None
        if valid:
            path = self._path + (command,)
            answer = MEMO.get(self._episode_key, path) if self._memo_reads() else None
        # the engine runs a command the memo cannot answer; an invalid one changes nothing, so
        # it is recorded now only where the engine is in step already, else at the next sync
        in_step = self._commands is None or self._engine_at == len(self._commands)
        if answer is None and valid:
            self._sync_engine()
            in_step = True
        if self._commands is not None:
            self._commands.append((command, valid))
        if not valid:
            if in_step:
                self._record(command, NOTHING_HAPPENS)
                if self._commands is not None:
                    self._engine_at = len(self._commands)
            info = self._info(self.task_id)
            info["invalid_action"] = True
            return NOTHING_HAPPENS, self.rewards.invalid, False, info
        if answer is None:
            answer = self._engine_answer(self._engine.step(command))
            self._record(command, answer.text)
            if self._commands is not None:
                MEMO.put(self._episode_key, path, answer)
                self._engine_at = len(self._commands)
        self._path, self._now = path, answer
        self._moved = True
        info = self._info(self.task_id)
        won = answer.won
        return answer.text, self.rewards.terminal(1.0 if won else 0.0, won), won, info

    def expert_actions(self) -> list[str]:
        """The expert's actions from the current state: with ``expert="planner"`` Fast
        Downward's whole plan; with ``expert="handcoded"`` the handcoded expert's next action
        (one), or ``[]`` when the task is won or the expert gave up (the reason is logged and
        in :attr:`expert_failure`)."""
        if not self._started:
            raise RuntimeError("call reset() before expert_actions()")
        if self.expert == "planner":
            self._sync_engine()
            return self._engine.plan()
        if self._now.won:
            return []
        expert = self._handcoded_expert()
        return [expert.next_action] if expert.next_action is not None else []

    @property
    def expert_failure(self) -> str | None:
        """Why the handcoded expert has no action in this episode (None while it has one)."""
        if self.expert != "handcoded" or not self._started:
            return None
        return self._handcoded_expert().failure

    # ---- the handcoded expert --------------------------------------------------------------
    def _record(self, command: str, feedback: str) -> None:
        if self.expert != "handcoded":
            return
        state = self._engine.game_state()
        # kept as the engine's own objects; plain data (strings and tuples) only when the history
        # travels in portable bytes (_Told.plain)
        told = _Told(command, feedback, state["admissible_commands"], state["_facts"], state["won"])
        if self._trace is not None:
            self._trace.append(told)
        if self._handcoded is not None:
            self._tell(self._handcoded, told, dict(self._engine.names))

    @staticmethod
    def _tell(expert: HandcodedExpert, told: Any, names: dict[str, str]) -> None:
        if isinstance(told, _Told):  # the step's own propositions: what plain data would rebuild
            command, feedback, admissible, propositions, won = told.command, told.feedback, told.admissible, told.facts, told.won
        else:
            from textworld.logic import Proposition, Variable

            command, feedback, admissible, facts, won = told
            propositions = [Proposition(name, [Variable(v, t) for v, t in args]) for name, args in facts]
        expert.update(command, feedback, list(admissible), readable_facts(propositions, names), bool(won))

    def _build_expert(self, task_id: str, intro: str, trace: Any, names: dict[str, str]) -> HandcodedExpert:
        expert = HandcodedExpert(self.games.game_path(task_id), task_id, intro)
        for told in trace:
            self._tell(expert, told, names)
        return expert

    def _handcoded_expert(self) -> HandcodedExpert:
        if self._handcoded is None:
            self._sync_engine()
            if self._trace is None:
                raise RuntimeError("the handcoded expert's episode history is missing")
            self._handcoded = self._build_expert(self.task_id, self._intro, self._trace, dict(self._engine.names))
        return self._handcoded

    # ---- snapshots -----------------------------------------------------------------------
    def _snapshot_kind(self) -> Any:
        return ("ALFWorld", self.games.identity, self.rewards, self.expert)

    def _get_state(self) -> _Saved:
        self._sync_engine()
        engine = self._engine
        return _Saved(
            task_id=self.task_id,
            native=engine.capture(),
            facts=None,
            at_start=not self._moved,
            names=engine.names,
            predicates=engine.predicates,
            problem_key=str(engine.problem_key),
            trace=tuple(self._trace) if self._trace is not None else None,
            intro=self._intro,
            expert=self._handcoded.state() if self._handcoded is not None else None,
            commands=tuple(self._commands) if self._commands is not None else None,
        )

    def _set_state(self, state: _Saved) -> None:
        engine = self._engine
        if state.native is not None and engine.can_restore(state.native):
            engine.restore(state.native)
            self._episode, self._episode_key, self._now = state.task_id, self._key(state.task_id), self._engine_answer("")
            self._commands = list(state.commands) if state.commands is not None else None
            self._path = tuple(command for command, valid in self._commands or () if valid)
            self._engine_at = len(self._commands) if self._commands is not None else None
        elif state.at_start:
            self._reset_task(state.task_id)
        else:
            engine.reroot(
                self.games.game(state.task_id), self._key(state.task_id), state.fact_state(), self.games.game_path(state.task_id)
            )
            # a re-rooted game is another problem text: its steps are not read from or written to the memo
            self._episode, self._episode_key = state.task_id, self._key(state.task_id)
            self._commands, self._path, self._now = None, (), self._engine_answer("")
            self._engine_at = None
        self._moved = not state.at_start
        self._intro = state.intro
        if self.expert == "handcoded":
            self._trace = list(state.trace) if state.trace is not None else None
            self._handcoded = None
            if state.expert is not None:
                self._handcoded = HandcodedExpert.from_state(state.task_id, state.expert)

    def _portable_task_state(self, inner: _Saved) -> dict[str, Any]:
        facts = inner.fact_state()
        out = {"task_id": inner.task_id, "facts": facts.facts, "names": facts.names, "at_start": inner.at_start, "intro": inner.intro}
        if self.expert == "handcoded":
            # the expert's inputs (plain data) travel; the expert is rebuilt from them when asked
            out["trace"] = tuple(_plain_told(told) for told in inner.trace or ())
        return out

    def _task_state_from_portable(self, obj: dict[str, Any]) -> _Saved:
        key = self._key(obj["task_id"])
        facts = FactState(key, tuple(obj["facts"]), tuple(map(tuple, obj["names"])))
        return _Saved(
            obj["task_id"], None, facts, bool(obj["at_start"]), facts.names, frozenset(), key,
            trace=tuple(obj["trace"]) if "trace" in obj else None, intro=str(obj.get("intro", "")), expert=None,
        )  # fmt: skip

    def _release_task_state(self, inner: _Saved) -> None:
        # the native state holds copies of every fact set; a released snapshot is never restored
        inner.native = None
        inner.trace = inner.expert = None

    def close(self) -> None:
        self._engine.close()
        super().close()
