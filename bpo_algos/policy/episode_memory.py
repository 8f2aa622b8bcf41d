"""What an ALFWorld episode has shown the agent so far, read from its observations and actions.

:func:`episode_memory` replays a context's history (the reset observation, then each action and
the observation that answered it) through ALFWorld's feedback sentences and keeps:

* ``receptacles``: those the reset observation lists ("Looking quickly around you, you see ...");
* ``location``: where the last ``go to`` arrived; ``visits``: arrivals per receptacle;
* ``opened`` / ``closed``: receptacles seen opened by the agent / last seen closed;
* ``contents``: per receptacle, the objects the last look into it listed (a receptacle seen
  closed and never opened has no entry: its contents were never observed);
* ``held``: what the agent picked up and has not put down; ``processed``: objects it heated,
  cooled or cleaned (and how); ``placed``: where it put what;
* ``steps`` and ``counts`` (how often each action was taken).

:func:`action_features` turns the memory, the task sentence and one admissible action into
:data:`MEMORY_FEATURES` numbers (names in that tuple, each in [0, 1]) for the text scorer.
Everything comes from the context's text; nothing from the game's hidden state, so two games
that differ only where the agent has not looked give the same features.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from bpo_envs.prompting import Context

_NAME = re.compile(r"\b[a-z]+ \d+\b")
_WORD = re.compile(r"[a-z]+")
_PROCESS = {"heat": "hot", "cool": "cool", "clean": "clean"}

MEMORY_FEATURES = (
    "target_visited",  # the receptacle the action goes to / acts on was visited before
    "target_opened",  # ... was opened by the agent before
    "target_holds_task_object",  # ... was seen holding an object the task names (not one the agent placed)
    "target_in_task",  # its class is named in the task
    "target_searched_empty",  # its contents were seen and hold nothing the task names
    "target_unseen_inside",  # it was seen closed and never looked into
    "target_is_here",  # it is where the agent stands
    "target_visits",  # arrivals there so far (/ 3, at most 1)
    "object_in_task",  # the object the action takes / uses / puts is of a class the task names
    "object_placed_before",  # ... is one the agent already put somewhere
    "object_processed",  # ... was already heated / cooled / cleaned
    "holding_anything",
    "holding_task_object",
    "holding_processed",
    "placed_task_objects",  # task objects put into receptacles the task names (/ 2)
    "task_object_located",  # some receptacle is known to hold a task object
    "times_taken",  # how often this very action was taken (/ 3, at most 1)
    "progress",  # steps so far / 50 (at most 1)
)


@dataclass
class EpisodeMemory:
    """See the module docstring."""

    receptacles: tuple[str, ...] = ()
    location: str | None = None
    visits: Counter = field(default_factory=Counter)
    opened: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    contents: dict[str, frozenset[str]] = field(default_factory=dict)
    held: str | None = None
    processed: dict[str, set[str]] = field(default_factory=dict)
    placed: dict[str, str] = field(default_factory=dict)
    steps: int = 0
    counts: Counter = field(default_factory=Counter)

    def copy(self) -> EpisodeMemory:
        return EpisodeMemory(
            self.receptacles, self.location, Counter(self.visits), set(self.opened), set(self.closed),
            dict(self.contents), self.held, {k: set(v) for k, v in self.processed.items()}, dict(self.placed),
            self.steps, Counter(self.counts),
        )  # fmt: skip


def _cls(name: str) -> str:
    return name.split(" ", 1)[0]


def _seen(text: str) -> frozenset[str] | None:
    """The objects a "you see ..." sentence lists (empty for "you see nothing"); None if none."""
    lowered = text.lower()
    if "you see" not in lowered:
        return None
    return frozenset(_NAME.findall(lowered.split("you see", 1)[1]))


def task_sentence(initial_observation: str) -> str:
    """The task ("put a hot cup in countertop.") from the reset observation ("" if none)."""
    _, _, task = initial_observation.partition("Your task is to:")
    return task.strip().lower()


def _intro_receptacles(initial_observation: str) -> tuple[str, ...]:
    room = initial_observation.split("Your task is to:", 1)[0].lower()
    if "you see" not in room:
        return ()
    return tuple(_NAME.findall(room.split("you see", 1)[1]))


def _apply(memory: EpisodeMemory, action: str, result: str) -> EpisodeMemory:
    m = memory.copy()
    m.steps += 1
    m.counts[action] += 1
    text = result.lower()
    if text.startswith("nothing happens"):
        return m
    if action.startswith("go to ") and text.startswith("you arrive at"):
        where = action[len("go to ") :]
        m.location = where
        m.visits[where] += 1
        if f"the {where} is closed" in text:
            m.closed.add(where)
        seen = _seen(text)
        if seen is not None:
            m.contents[where] = seen
    elif action.startswith("open ") and text.startswith("you open"):
        where = action[len("open ") :]
        m.opened.add(where)
        m.closed.discard(where)
        seen = _seen(text)
        m.contents[where] = seen if seen is not None else frozenset()
    elif action.startswith("close ") and text.startswith("you close"):
        m.closed.add(action[len("close ") :])
    elif action.startswith("examine ") and _seen(text) is not None:
        m.contents[action[len("examine ") :]] = _seen(text)  # type: ignore[assignment]
    elif action.startswith("take ") and text.startswith("you pick up"):
        obj, _, where = action[len("take ") :].partition(" from ")
        m.held = obj
        if where in m.contents:
            m.contents[where] = m.contents[where] - {obj}
    elif action.startswith("move ") and text.startswith("you move"):
        obj, _, where = action[len("move ") :].partition(" to ")
        m.held = None
        m.placed[obj] = where
        m.contents[where] = m.contents.get(where, frozenset()) | {obj}
    elif action.split(" ", 1)[0] in _PROCESS and text.startswith("you "):
        verb, rest = action.split(" ", 1)
        obj = rest.split(" with ", 1)[0]
        m.processed.setdefault(obj, set()).add(_PROCESS[verb])
    elif action == "inventory":
        carried = _NAME.findall(text)
        m.held = carried[0] if carried and "carrying:" in text else None
    return m


@lru_cache(maxsize=1 << 15)
def _memory(initial_observation: str, steps: tuple[tuple[str, str], ...]) -> EpisodeMemory:
    if not steps:
        return EpisodeMemory(receptacles=_intro_receptacles(initial_observation))
    return _apply(_memory(initial_observation, steps[:-1]), *steps[-1])


def episode_memory(context: Context) -> EpisodeMemory:
    """The memory of ``context``'s episode so far (see the module docstring)."""
    history = context.history
    results = [turn.observation for turn in history[1:]] + ([context.observation] if history else [])
    steps = tuple((" ".join(turn.action.split()).lower(), result) for turn, result in zip(history, results, strict=True))
    return _memory(context.initial_observation or (history[0].observation if history else context.observation), steps)


def _parse(action: str) -> tuple[str | None, str | None]:
    """``(object, receptacle)`` an ALFWorld command names (None where it names none)."""
    a = " ".join(action.split()).lower()
    for verb, sep in (("take ", " from "), ("move ", " to "), ("heat ", " with "), ("cool ", " with "), ("clean ", " with "), ("slice ", " with ")):
        if a.startswith(verb) and sep in a:
            obj, recep = a[len(verb) :].split(sep, 1)
            return obj, recep
    for verb in ("go to ", "open ", "close ", "examine "):
        if a.startswith(verb):
            return None, a[len(verb) :]
    if a.startswith("use "):
        return None, a[len("use ") :]
    return None, None


def _state_features(memory: EpisodeMemory, relevant: Callable[[str], bool]) -> list[float]:
    held = memory.held
    placed_relevant = sum(1 for o, r in memory.placed.items() if relevant(o) and relevant(r) and o != held)
    located = any(relevant(o) and o not in memory.placed for objs in memory.contents.values() for o in objs)
    return [
        float(held is not None),
        float(held is not None and relevant(held)),
        float(held is not None and bool(memory.processed.get(held))),
        min(placed_relevant / 2, 1.0),
        float(located),
    ]


def _action_features(memory: EpisodeMemory, relevant: Callable[[str], bool], state: list[float], action: str) -> list[float]:
    obj, recep = _parse(action)
    f = [0.0] * 11
    if recep is not None:
        contents = memory.contents.get(recep)
        task_objects = [o for o in contents or () if relevant(o) and o not in memory.placed]
        visits = memory.visits[recep]
        f[0] = float(visits > 0)
        f[1] = float(recep in memory.opened)
        f[2] = float(bool(task_objects))
        f[3] = float(relevant(recep))
        f[4] = float(contents is not None and not task_objects)
        f[5] = float(recep in memory.closed and contents is None)
        f[6] = float(memory.location == recep)
        f[7] = min(visits / 3, 1.0)
    if obj is not None:
        f[8] = float(relevant(obj))
        f[9] = float(obj in memory.placed)
        f[10] = float(bool(memory.processed.get(obj)))
    return [*f, *state, min(memory.counts[action] / 3, 1.0), min(memory.steps / 50, 1.0)]


def action_features(memory: EpisodeMemory, task_words: frozenset[str], actions: Sequence[str]) -> list[list[float]]:
    """:data:`MEMORY_FEATURES` of each of ``actions`` given the episode's memory and the task's words."""
    relevant = lambda name: _cls(name) in task_words  # noqa: E731
    state = _state_features(memory, relevant)
    return [_action_features(memory, relevant, state, " ".join(a.split()).lower()) for a in actions]


def context_features(context: Context, actions: Sequence[str]) -> list[list[float]]:
    """:func:`action_features` of every action at ``context``."""
    memory = episode_memory(context)
    return action_features(memory, _task_words(context.initial_observation or context.observation), actions)


@lru_cache(maxsize=1 << 12)
def _task_words(initial_observation: str) -> frozenset[str]:
    return frozenset(_WORD.findall(task_sentence(initial_observation)))
