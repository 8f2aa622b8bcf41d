"""A per-process cache of the texts textworld derives from an ALFWorld game state.

On every reset and step textworld's ``PddlEnv`` derives text with the game's grammar,
``grammar.derive(start, context)``: the intro (reset), the command's feedback (step), and the
command text of every applicable action (``_gather_infos``, after both): a grammar walk with
state queries, about 80% of an env step's CPU. A derivation reads the game's grammar, the
entity names, the state, and the start symbol, mapping and variables it is given, nothing else
(``context`` is built from those), so::

    derive(start, context) = f(game, state, start, mapping, variables)

and, where the derivation reads of the state only what every state of the game shares (below)::

    derive(start, context) = f(game, start, mapping, variables)

The cache keeps each text under one of two keys:

* ``(game, None)`` + *start, mapping* (a *game text*), at any depth, when the derivation read
  nothing of the state but its static facts (:class:`StateReader` records every read);
* ``(game, state facts)`` + *start, mapping* (a *state text*), for a state at most
  :data:`CACHED_DEPTH` moves from its reset, when it read more;

where

* *game* (:func:`game_identity`): a digest of the loaded game's domain, grammar and problem texts
  (a re-rooted problem is another text, so another game) and its entity infos (names, types,
  articles);
* *state facts*: the state's true facts (textworld propositions, hashed and compared by value),
  stored as their symmetric difference with the game's reference facts (the first fact set given
  for the game in this process, one shared set per game): injective in the facts, and a few
  propositions instead of ~160;
* *start, mapping*: the start symbol, and the mapping's placeholder and variable names and
  types (the variables are the mapping's entities: checked, else the derivation is not cached).

*Static facts* are those of a predicate that no action of the game's domain adds or deletes and
no axiom derives (:func:`static_predicates`, with textworld's ``not_`` form of each): a state's
facts change only by an action's effects (``PddlState.apply``), so every state reached from the
game's reset (restored snapshots included: they were reached so) holds the problem's own static
facts, a function of the game. A derivation reads the state only by ``all_assignments`` (a
rule's condition, a ``{x | query}`` symbol) or by an expression of its own (``{...}``, which sees
``context``); :class:`StateReader` runs textworld's ``all_assignments`` with itself as the state
and counts a read of anything but ``facts_with_signature`` of a static predicate and the game's
logic (types) as a read of the state (the variables by type, another predicate, any other
attribute), as it counts any use of ``context["facts"]``. The derivation is deterministic, so
one that read no non-static part of one state reads none of any other state of the game and
derives the same text: a game text answers every state soundly. Command texts ("take apple 1
from countertop 2", "go to fridge 1": a query of the static ``receptacleatlocation``) are game
texts; the intro and most feedback (what a receptacle holds, the inventory) are state texts.

A derivation is cached only inside an engine call whose state does not change between its
derivations (:class:`StateDerivations`), and only when its context reads that call's state. A
step whose texts were met before (every applicable command of a game met before; the first steps
of every evaluation episode, which repeat at every evaluation point of a run and across the runs
of a process; a group's siblings) derives nothing. At most :data:`DERIVED_TEXTS_KEPT` texts are
kept, the least recently used states' (and games') dropped first: about 350 bytes a text
(measured with ``tracemalloc`` on random walks, ~25 texts a state), so about 90 MiB at the bound.
"""

from __future__ import annotations

import copy
import hashlib
import operator
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


StateKey = tuple[str, frozenset | None]
"""``(game identity, state facts)`` of a state's texts; ``(game identity, None)`` of the game's."""


def static_predicates(task: Any) -> frozenset[str]:
    """The names of the predicates of a game (its Fast Downward ``task``: the parsed domain and
    problem) whose facts no action changes: neither the literal of an effect of any action nor
    the head of an axiom, each with textworld's ``not_`` form (a negated effect's fact)."""
    changed = {effect.literal.predicate for action in task.actions for effect in action.effects}
    changed |= {axiom.name for axiom in task.axioms}
    static = {p.name for p in task.predicates} - changed - {"="}
    return frozenset(static | {"not_" + name for name in static})


class _Reads:
    """Whether a derivation read the state beyond its static facts."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = False


def _recorded(operation: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Any, *args: Any) -> Any:
        object.__getattribute__(self, "_reads").state = True
        return operation(object.__getattribute__(self, "_target"), *args)

    return method


class _Reader:
    """``target`` as a derivation sees it: every use of it counts as a read of the state."""

    __slots__ = ("_target", "_reads")

    def __init__(self, target: Any, reads: _Reads) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_reads", reads)

    def __getattr__(self, name: str) -> Any:
        object.__getattribute__(self, "_reads").state = True
        return getattr(object.__getattribute__(self, "_target"), name)

    __iter__ = _recorded(iter)
    __len__ = _recorded(len)
    __getitem__ = _recorded(operator.getitem)
    __contains__ = _recorded(operator.contains)
    __bool__ = _recorded(bool)
    __eq__ = _recorded(operator.eq)
    __ne__ = _recorded(operator.ne)
    __hash__ = _recorded(hash)
    __repr__ = _recorded(repr)
    __str__ = _recorded(str)
    __reversed__ = _recorded(reversed)

    def __copy__(self) -> Any:
        object.__getattribute__(self, "_reads").state = True
        return copy.copy(object.__getattribute__(self, "_target"))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        object.__getattribute__(self, "_reads").state = True
        return copy.deepcopy(object.__getattribute__(self, "_target"), memo)


class StateReader(_Reader):
    """The state as a derivation sees it: textworld's ``all_assignments`` (and the two helpers it
    calls) runs with the reader as its state, and of what it reads only ``facts_with_signature`` of a predicate in
    ``static`` and the game's logic (``_logic``: its types) are not counted as reads of the state
    (module docstring); anything else is, and is answered by the state itself."""

    __slots__ = ("_static",)

    def __init__(self, target: Any, reads: _Reads, static: frozenset[str]) -> None:
        super().__init__(target, reads)
        object.__setattr__(self, "_static", static)

    def all_assignments(self, *args: Any, **kwargs: Any) -> Any:
        return type(self._target).all_assignments(self, *args, **kwargs)

    def _all_applicable_assignments(self, *args: Any, **kwargs: Any) -> Any:
        return type(self._target)._all_applicable_assignments(self, *args, **kwargs)

    def _all_assignments(self, *args: Any, **kwargs: Any) -> Any:
        return type(self._target)._all_assignments(self, *args, **kwargs)

    def facts_with_signature(self, sig: Any) -> Any:
        if sig.name not in self._static:
            self._reads.state = True
        return self._target.facts_with_signature(sig)

    @property
    def _logic(self) -> Any:
        return self._target._logic


class DerivedTexts:
    """The process's cache of derived texts (module docstring): per state key, the texts of the
    derivations asked there, least recently used states dropped while more than ``max_texts``
    texts are kept (a game's texts under ``(game, None)``). ``enabled`` False derives every time;
    ``hits`` and ``misses`` count the derivations asked for that a key fits (``game_hits`` of
    the hits those a game text answered), ``game_texts`` the game texts kept."""

    def __init__(self, max_texts: int = DERIVED_TEXTS_KEPT) -> None:
        self.max_texts = max_texts
        self.enabled = max_texts > 0
        self.depth = CACHED_DEPTH
        self._states: OrderedDict[StateKey, dict[tuple[str, ...], str]] = OrderedDict()
        self._count = 0
        self._references: OrderedDict[str, frozenset] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.game_hits = 0

    def __len__(self) -> int:
        """How many texts are kept."""
        return self._count

    def clear(self) -> None:
        """Forget every kept text and game (and zero the counters)."""
        with self._lock:
            self._states.clear()
            self._references.clear()
            self._count = self.hits = self.misses = self.game_hits = 0

    @property
    def game_texts(self) -> int:
        """How many game texts (keyed without a state) are kept."""
        with self._lock:
            return sum(len(texts) for (_, facts), texts in self._states.items() if facts is None)

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

    def get(self, texts: dict[tuple[str, ...], str], arguments: tuple[str, ...], *, game: bool = False,
            last: bool = True) -> str | None:
        """The text kept under ``arguments`` in ``texts`` (None if none), counted as a hit (``game``:
        ``texts`` are a game's, and a game hit too) or, where ``last`` (no other key is asked
        after this one), as a miss."""
        with self._lock:
            text = texts.get(arguments)
            if text is not None:
                self.hits += 1
                self.game_hits += game
            elif last:
                self.misses += 1
            return text

    def put(self, key: StateKey, arguments: tuple[str, ...], text: str) -> None:
        """Keep ``text`` under ``key`` and ``arguments``; then drop the least recently used keys'
        texts (this one's too, if it alone is over the bound) while more than ``max_texts`` are
        kept. A dict :meth:`texts` gave earlier may so be dropped: it still answers what it holds
        (the same texts), and a put under its key starts a new one."""
        with self._lock:
            texts = self._states.get(key)
            if texts is None:
                texts = self._states[key] = {}
            if arguments not in texts:
                self._count += 1
            texts[arguments] = text
            while self._count > self.max_texts and self._states:
                _, dropped = self._states.popitem(last=False)
                self._count -= len(dropped)


DERIVED = DerivedTexts()
"""The process's cache (shared by every ALFWorld engine of the process)."""


class StateDerivations:
    """``grammar.derive`` for the span of one engine call in which the state does not change
    between derivations (a reset after its new state is built, a step after its command is
    applied). A derivation whose context reads ``pddl_state`` and whose variables are its
    mapping's (:func:`arguments_key`) is answered from :data:`DERIVED`: from the game's texts
    (``(game(), None)``, taken at the first), else, where ``keep_state``, from the state's
    (``state_key()``, taken at the first that needs it); else it is derived with the state and
    the facts behind a :class:`StateReader` and kept as a game text if it read no more than the
    static facts (``static()``), else as a state text where ``keep_state``."""

    def __init__(
        self,
        derive: Callable[..., str],
        pddl_state: Callable[[], Any],
        game: Callable[[], str],
        static: Callable[[], frozenset[str]],
        state_key: Callable[[], StateKey],
        keep_state: bool,
    ) -> None:
        self._derive = derive
        self._pddl_state = pddl_state
        self._game = game
        self._static = static
        self._state_key = state_key
        self._keep_state = keep_state
        # (key, its texts) of the game and of the state, taken at the first derivation that needs each
        self._game_entry: tuple[StateKey, dict[tuple[str, ...], str]] | None = None
        self._state_entry: tuple[StateKey, dict[tuple[str, ...], str]] | None = None

    def __call__(self, start: str, context: dict[str, Any] = {}) -> str:  # noqa: B006 - textworld's signature
        state = context.get("state")
        if not DERIVED.enabled or state is not self._pddl_state():
            return self._derive(start, context)
        arguments = arguments_key(start, context)
        if arguments is None:
            return self._derive(start, context)
        if self._game_entry is None:
            key: StateKey = (self._game(), None)
            self._game_entry = (key, DERIVED.texts(key))
        text = DERIVED.get(self._game_entry[1], arguments, game=True, last=not self._keep_state)
        if text is not None:
            return text
        if self._keep_state:
            if self._state_entry is None:
                key = self._state_key()
                self._state_entry = (key, DERIVED.texts(key))
            text = DERIVED.get(self._state_entry[1], arguments)
            if text is not None:
                return text
        reads = _Reads()
        seen = dict(context, state=StateReader(state, reads, self._static()), facts=_Reader(context["facts"], reads))
        text = self._derive(start, seen)
        if not reads.state:
            DERIVED.put(self._game_entry[0], arguments, text)
        elif self._state_entry is not None:
            DERIVED.put(self._state_entry[0], arguments, text)
        return text
