"""A per-process cache of the texts textworld derives from an ALFWorld game state.

On every reset and step textworld's ``PddlEnv`` derives text with the game's grammar,
``grammar.derive(start, context)``: the intro (reset), the command's feedback (step), and the
command text of every applicable action (``_gather_infos``, after both): a grammar walk with
state queries, about 80% of an env step's CPU. A derivation reads the game's grammar, the
entity names, the state's facts, and the start symbol, mapping and variables it is given, nothing
else (``context`` is built from those), so::

    derive(start, context) = f(game, state facts, start, mapping, variables)

and the cache keeps each text under exactly that key:

* *game* (:func:`game_identity`): a digest of the loaded game's domain, grammar and problem texts
  (a re-rooted problem is another text, so another game) and its entity infos (names, types,
  articles);
* *state facts*: the state's true facts (textworld propositions, hashed and compared by value),
  stored as their symmetric difference with the game's reference facts (the first fact set given
  for the game in this process, one shared set per game): injective in the facts, and a few
  propositions instead of ~160;
* *start, mapping*: the start symbol, and the mapping's placeholder and variable names and
  types (the variables are the mapping's entities: checked, else the derivation is not cached).

A derivation is cached only inside an engine call whose state does not change between its
derivations (:class:`StateDerivations`), and only when its context reads that call's state. A
step whose states were met before (the first steps of every evaluation episode, which repeat at
every evaluation point of a run and across the runs of a process; a group's siblings) derives
nothing. At most :data:`DERIVED_TEXTS_KEPT` texts are kept, the least recently used states'
dropped first: about 350 bytes a text (measured with ``tracemalloc`` on random walks, ~25 texts
a state), so about 90 MiB at the bound.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from sys import intern
from typing import Any

DERIVED_TEXTS_KEPT = int(os.environ.get("BPO_ALFWORLD_DERIVED_TEXTS", 2**18))
"""How many derived texts the process keeps ($BPO_ALFWORLD_DERIVED_TEXTS; 0 turns the cache off)."""
CACHED_DEPTH = int(os.environ.get("BPO_ALFWORLD_DERIVED_DEPTH", 4))
"""The deepest state (moves since its reset) whose texts are cached ($BPO_ALFWORLD_DERIVED_DEPTH):
the states near a reset are met again (every evaluation point plays the same games from the same
seeds, a group's episodes start alike); deeper ones seldom are (a full ALFWorld run with every
state cached found 15% of its derivations kept, and its keys cost 7% of its CPU samples:
docs/main-job.md, "ALFWorld's runs")."""
GAMES_KEPT = 4096
"""How many games' reference fact sets the process keeps (about 10 KiB a game)."""


def game_identity(pddl_env: Any) -> str:
    """A digest of what a derivation reads besides the state and its own arguments: the loaded
    game's domain, grammar and problem texts and its entity infos (id, display name, type and
    articles)."""
    data = pddl_env._game_data
    digest = hashlib.blake2b(digest_size=20)
    for part in (data["pddl_domain"], data["grammar"], data["pddl_problem"]):
        digest.update(str(part).encode())
        digest.update(b"\x00")
    for key, info in sorted(pddl_env._entity_infos.items()):
        digest.update(repr((key, info.name, info.type, info.definite, info.indefinite)).encode())
    return digest.hexdigest()


def arguments_key(start: str, context: dict[str, Any]) -> tuple[str, ...] | None:
    """A derivation's start symbol and its context's mapping (placeholder and variable names and
    types), flat, as strings; None (not cached) unless the context's variables are the mapping's
    entities as textworld builds them (``{placeholder name: entity_infos[variable name]}``), so
    that the mapping and the game's entity infos determine them."""
    mapping, variables, infos = context["mapping"], context["variables"], context["entity_infos"]
    if len(variables) != len(mapping):
        return None
    key = [start]
    for p, v in mapping.items():
        if variables.get(p.name) is not infos.get(v.name):
            return None
        key += (intern(p.name), p.type, intern(v.name), v.type)
    return tuple(key)


StateKey = tuple[str, frozenset]


class DerivedTexts:
    """The process's cache of derived texts (module docstring): per state key, the texts of the
    derivations asked there, least recently used states dropped while more than ``max_texts``
    texts are kept. ``enabled`` False derives every time; ``hits`` and ``misses`` count the
    cached derivations asked for."""

    def __init__(self, max_texts: int = DERIVED_TEXTS_KEPT) -> None:
        self.max_texts = max_texts
        self.enabled = max_texts > 0
        self.depth = CACHED_DEPTH
        self._states: OrderedDict[StateKey, dict[tuple[str, ...], str]] = OrderedDict()
        self._count = 0
        self._references: OrderedDict[str, frozenset] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        """How many texts are kept."""
        return self._count

    def clear(self) -> None:
        """Forget every kept text and game (and zero the counters)."""
        with self._lock:
            self._states.clear()
            self._references.clear()
            self._count = self.hits = self.misses = 0

    def reference(self, game: str, facts: frozenset) -> frozenset:
        """The game's reference fact set: the first one given for ``game`` while it is kept."""
        with self._lock:
            kept = self._references.get(game)
            if kept is None:
                kept = self._references[game] = facts
                while len(self._references) > GAMES_KEPT:
                    self._references.popitem(last=False)
            else:
                self._references.move_to_end(game)
            return kept

    def texts(self, state: StateKey) -> dict[tuple[str, ...], str]:
        """The state's kept texts (a new, empty entry for a state not kept), marked as used."""
        with self._lock:
            texts = self._states.get(state)
            if texts is None:
                texts = self._states[state] = {}
            else:
                self._states.move_to_end(state)
            return texts

    def get(self, texts: dict[tuple[str, ...], str], arguments: tuple[str, ...]) -> str | None:
        with self._lock:
            text = texts.get(arguments)
            if text is None:
                self.misses += 1
            else:
                self.hits += 1
            return text

    def put(self, texts: dict[tuple[str, ...], str], arguments: tuple[str, ...], text: str) -> None:
        with self._lock:
            if arguments not in texts:
                self._count += 1
            texts[arguments] = text
            while self._count > self.max_texts and len(self._states) > 1:
                _, dropped = self._states.popitem(last=False)
                self._count -= len(dropped)


DERIVED = DerivedTexts()
"""The process's cache (shared by every ALFWorld engine of the process)."""


class StateDerivations:
    """``grammar.derive`` for the span of one engine call in which the state does not change
    between derivations (a reset after its new state is built, a step after its command is
    applied): each derivation that reads ``pddl_state`` is answered from :data:`DERIVED` under
    ``state_key()`` (taken once, at the first) and :func:`arguments_key`."""

    def __init__(self, derive: Callable[..., str], pddl_state: Callable[[], Any], state_key: Callable[[], StateKey]) -> None:
        self._derive = derive
        self._pddl_state = pddl_state
        self._state_key = state_key
        self._texts: dict[tuple[str, ...], str] | None = None

    def __call__(self, start: str, context: dict[str, Any] = {}) -> str:  # noqa: B006 - textworld's signature
        if not DERIVED.enabled or context.get("state") is not self._pddl_state():
            return self._derive(start, context)
        if self._texts is None:
            self._texts = DERIVED.texts(self._state_key())
        arguments = arguments_key(start, context)
        if arguments is None:
            return self._derive(start, context)
        text = DERIVED.get(self._texts, arguments)
        if text is None:
            text = self._derive(start, context)
            DERIVED.put(self._texts, arguments, text)
        return text
