"""ALFWorld's own exploring expert (``alfworld.agents.expert.HandCodedTWAgent``), driven from the
env's state the way alfworld's ``AlfredExpert`` wrapper drives it (``expert_type: handcoded``).

The agent is told the intro text at reset, then after every step the command and the new game
state (feedback, admissible commands, facts); it answers the next command. It searches the
receptacles it was told about in the intro, opens closed ones and acts on the objects it has
seen in the feedback, so (unlike the planner) it does not walk to a hidden object directly.
Its decisions read the facts only for what the agent holds and for what the goal's objects
already are (hot, clean, placed), as upstream.

As upstream: the first action after reset is ``look``; an answer that is not admissible becomes
``look``; the upstream agent answers a random admissible command where it would repeat the last
one. Two differences:

* Determinism: upstream's unseeded ``random`` is replaced, during each call, by a generator
  seeded from the task id and the step index, so the expert's answer is a function of the
  episode's history (the same after a snapshot is restored, in any process).
* The put command's wording: alfworld 0.4.2's expert answers ``move X to Y`` (the grammar's
  command) but its state tracker recognises a put only in a command containing ``put`` (the
  grammar's earlier ``put X in/on Y``), so it would go on believing it holds the object it just
  placed: every pick-two game stalls after the first object. The command is therefore told to
  the tracker in that earlier wording (:func:`tracker_wording`).

When the agent gives up (upstream's ``HandCodedAgentFailed`` / ``HandCodedAgentTimeout``, or an
error of its heuristics on a room it does not expect, e.g. no microwave), :attr:`failure` says
why and it has no next action.
"""

from __future__ import annotations

import copy
import logging
import random
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

EXPERTS = ("planner", "handcoded")
"""The ``expert=`` choices of ``BPO-ALFWorld-v0``."""
MAX_EXPERT_STEPS = 200
"""The agent's own step limit (alfworld's ``AlfredExpert`` uses 200)."""

_RANDOM_LOCK = threading.RLock()


def check_expert(expert: Any) -> str:
    if expert not in EXPERTS:
        raise ValueError(f"expert must be one of {EXPERTS}, got {expert!r}")
    return str(expert)


def readable_facts(facts: Any, names: dict[str, str]) -> list[Any]:
    """``facts`` (textworld propositions over PDDL ids) with the entities' display names, as
    textworld's ``PddlEnv`` gives them in ``state["facts"]``."""
    from textworld.logic import Proposition, Variable

    return [Proposition(f.name, [Variable(names.get(v.name) or v.name, v.type) for v in f.arguments]) for f in facts]


def tracker_wording(command: str) -> str:
    """``command`` as the handcoded expert's state tracker expects it: ``move X to Y`` is told
    as ``put X in/on Y`` (see the module docstring); anything else unchanged."""
    if command.startswith("move ") and " to " in command:
        obj, recep = command[len("move ") :].split(" to ", 1)
        return f"put {obj} in/on {recep}"
    return command


def _modules() -> tuple[Any, Any]:
    from bpo_envs.alfworld._upstream import upstream

    upstream()  # tames alfworld's import side effects first
    import alfworld.agents.expert.handcoded_expert as base
    from alfworld.agents.expert import HandCodedTWAgent

    return base, HandCodedTWAgent


@dataclass
class ExpertState:
    """The agent's state after a number of steps of one episode (a copy, never aliased)."""

    agent: Any  # a HandCodedTWAgent (its per-task policy holds the memory)
    steps: int
    next_action: str | None
    failure: str | None


class HandcodedExpert:
    """One episode of alfworld's handcoded expert (see the module docstring).

    Args:
        game_path: the game's ``game.tw-pddl``; upstream's ``reset`` reads the task's
            ``pddl_params`` from the ``traj_data.json`` beside it.
        task_id: names the task in log lines and seeds the expert's random choices.
        intro: the reset observation (the room's receptacles).
    """

    def __init__(self, game_path: str | Path, task_id: str, intro: str) -> None:
        base, agent_cls = _modules()
        self._base = base
        self.task_id = str(task_id)
        self.failure: str | None = None
        self.next_action: str | None = "look"
        self.steps = 0
        self.agent = agent_cls(max_steps=MAX_EXPERT_STEPS)
        try:
            self.agent.reset(game=str(game_path))
            self.agent.observe(intro)
        except Exception as exc:  # noqa: BLE001 - a game it cannot read: no expert, said why
            self._fail(f"the handcoded expert cannot start on this game ({type(exc).__name__}: {exc})")

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self.next_action = None
        log.info("ALFWorld handcoded expert, task %s, step %d: %s", self.task_id, self.steps, reason)

    def update(self, command: str, feedback: str, admissible: list[str], facts: list[Any], won: bool) -> None:
        """Tell the agent the command just run and the game state it led to."""
        self.steps += 1
        if self.failure is not None:
            return
        if won:
            self.next_action = None
            return
        game_state = {"feedback": feedback, "admissible_commands": admissible, "facts": facts, "won": won}
        seed = zlib.crc32(f"{self.task_id}\x00{self.steps}".encode())
        base = self._base
        try:
            with _RANDOM_LOCK:
                base.random = random.Random(seed)
                try:
                    action = self.agent.act(game_state, 0, won, tracker_wording(command))
                finally:
                    base.random = random
        except base.HandCodedAgentFailed:
            self._fail("the handcoded expert ran out of subgoals without reaching the goal")
            return
        except base.HandCodedAgentTimeout:
            self._fail(f"the handcoded expert passed its {MAX_EXPERT_STEPS}-step limit")
            return
        except Exception as exc:  # noqa: BLE001 - upstream heuristics on a room they do not expect
            self._fail(f"the handcoded expert's heuristics failed ({type(exc).__name__}: {exc})")
            return
        self.next_action = action if action in admissible else "look"

    # ---- state ---------------------------------------------------------------------------
    @classmethod
    def from_state(cls, task_id: str, state: ExpertState) -> HandcodedExpert:
        """The expert of ``task_id`` in a saved :class:`ExpertState` (a copy of it)."""
        expert = cls.__new__(cls)
        expert._base = _modules()[0]
        expert.task_id = str(task_id)
        expert.set_state(state)
        return expert

    def state(self) -> ExpertState:
        return ExpertState(copy.deepcopy(self.agent), self.steps, self.next_action, self.failure)

    def set_state(self, state: ExpertState) -> None:
        self.agent = copy.deepcopy(state.agent)
        self.steps, self.next_action, self.failure = state.steps, state.next_action, state.failure
