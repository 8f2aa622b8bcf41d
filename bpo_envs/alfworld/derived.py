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
  (a re-rooted problem is another text, so another game) and its entity names;
* *state facts*: the state's true facts (textworld propositions, hashed and compared by value),
  stored as their symmetric difference with the game's reference facts (the first fact set given
  for the game in this process, one shared set per game): injective in the facts, and a few
  propositions instead of ~160;
* *start, mapping, variables*: the start symbol, and the mapping's and variables' names as
  strings.

A derivation is cached only inside an engine call whose state does not change between its
derivations (:meth:`StateDerivations`), and only when its context reads that call's state. A
step whose states were met before (the first steps of every evaluation episode, which repeat at
every evaluation point of a run and across the runs of a process; a group's siblings) derives
nothing. At most :data:`DERIVED_TEXTS_KEPT` texts are kept, least recently used dropped (about
0.5 KiB a text, ~25 texts a state: 64 MiB, about 5,000 states).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

DERIVED_TEXTS_KEPT = int(os.environ.get("BPO_ALFWORLD_DERIVED_TEXTS", 2**17))
"""How many derived texts the process keeps ($BPO_ALFWORLD_DERIVED_TEXTS; 0 turns the cache off)."""
GAMES_KEPT = 4096
"""How many games' reference fact sets the process keeps (about 10 KiB a game)."""


def game_identity(pddl_env: Any) -> str:
    """A digest of what a derivation reads besides the state and its own arguments: the loaded
    game's domain, grammar and problem texts and its entity names (``id -> display name``)."""
    data = pddl_env._game_data
    digest = hashlib.blake2b(digest_size=20)
    for part in (data["pddl_domain"], data["grammar"], data["pddl_problem"]):
        digest.update(str(part).encode())
        digest.update(b"\x00")
    for key, info in sorted(pddl_env._entity_infos.items()):
        digest.update(f"{key}\x01{info.name}\x00".encode())
    return digest.hexdigest()


def arguments_key(context: dict[str, Any]) -> tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]]:
    """A derivation context's mapping (placeholder and variable names and types) and variables
    (placeholder name, entity id and display name), as strings."""
    mapping = tuple(f"{p.name}:{p.type}={v.name}:{v.type}" for p, v in context["mapping"].items())
    variables = tuple((k, info.id, info.name) for k, info in context["variables"].items())
    return mapping, variables


class DerivedTexts:
    """The process's cache of derived texts (module docstring). ``enabled`` False derives every
    time; ``hits`` and ``misses`` count the cached derivations asked for."""

    def __init__(self, max_texts: int = DERIVED_TEXTS_KEPT) -> None:
        self.max_texts = max_texts
        self.enabled = max_texts > 0
        self._texts: OrderedDict[tuple[Any, ...], str] = OrderedDict()
        self._references: OrderedDict[str, frozenset] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._texts)

    def clear(self) -> None:
        """Forget every kept text and game (and zero the counters)."""
        with self._lock:
            self._texts.clear()
            self._references.clear()
            self.hits = self.misses = 0

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

    def get(self, key: tuple[Any, ...]) -> str | None:
        with self._lock:
            text = self._texts.get(key)
            if text is None:
                self.misses += 1
            else:
                self.hits += 1
                self._texts.move_to_end(key)
            return text

    def put(self, key: tuple[Any, ...], text: str) -> None:
        with self._lock:
            self._texts[key] = text
            while len(self._texts) > self.max_texts:
                self._texts.popitem(last=False)


DERIVED = DerivedTexts()
"""The process's cache (shared by every ALFWorld engine of the process)."""

StateKey = Callable[[], tuple[str, frozenset]]


class StateDerivations:
    """``grammar.derive`` for the span of one engine call in which the state does not change
    between derivations (a reset after its new state is built, a step after its command is
    applied): each derivation that reads ``pddl_state`` is answered from :data:`DERIVED` under
    ``(state_key(), start, mapping, variables)``, the state's key taken once, at the first."""

    def __init__(self, derive: Callable[..., str], pddl_state: Callable[[], Any], state_key: StateKey) -> None:
        self._derive = derive
        self._pddl_state = pddl_state
        self._state_key = state_key
        self._key: tuple[str, frozenset] | None = None

    def __call__(self, start: str, context: dict[str, Any] = {}) -> str:  # noqa: B006 - textworld's signature
        if not DERIVED.enabled or context.get("state") is not self._pddl_state():
            return self._derive(start, context)
        if self._key is None:
            self._key = self._state_key()
        key = (self._key, start, *arguments_key(context))
        text = DERIVED.get(key)
        if text is None:
            text = self._derive(start, context)
            DERIVED.put(key, text)
        return text
