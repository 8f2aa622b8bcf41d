"""Imports of the upstream ``alfworld`` / ``textworld`` / ``fast_downward`` packages, tamed.

* ``import alfworld`` creates ``$ALFWORLD_DATA`` (default ``~/.cache/alfworld``) and writes the
  variable into ``os.environ``. When the user has not set it, the import here points it at this
  project's cache folder and removes it from ``os.environ`` again, so nothing lands in
  ``~/.cache/alfworld`` and later code still sees the user's own setting (or none).
* ``fast_downward.pddl2sas`` overwrites ``sys.argv`` and re-runs the PDDL -> SAS translation on
  every load; textworld's text grammar re-parses every template with TatSu and deep-copies its
  derivation context on every step (≈40-70 ms a step). :func:`engine_patches` swaps in, for the
  duration of a block, a translation that keeps ``sys.argv`` and is memoised per (domain,
  problem) text, a memoised parse of the game's grammar file, memoised template/query parses
  shallow context copies, and a state's ``facts`` chained in C instead of a Python generator
  (the same facts in the same order; ``_gather_infos`` lists them once per applicable action).
  The derived text is the same (the derivation only reads the copied contexts); only the time
  changes.
* The first load of a game in a process still translates its problem and parses its grammar
  (≈0.2-0.5 s). :func:`load_translation` / :func:`save_translation` keep both on disk, in a
  file beside the game (:func:`translation_path`), so a new process reads them instead.
* The process keeps the translations it read or made within :data:`TRANSLATION_CACHE_BYTES`,
  dropping first the problems whose next game load is furthest away as predicted from their
  last two (:func:`_victim`: the evaluation's games come back in the same order at every point,
  a cyclic scan on which LRU keeps nothing), and, within :data:`PARSED_FACTS_BYTES`, each
  problem's facts that textworld's ``PddlState`` parses from text at every load and reset
  (:func:`_state_from_parsed`: the same propositions added in the same order, so the same state).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import itertools
import logging
import os
import pickle
import sys
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bpo_envs.files import atomic_write, user_cache_dir
from bpo_envs.sealed import seal, unseal

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "BPO-ALFWorld-v0 needs the ALFWorld text engine: pip install 'bpo-gym[alfworld]' and then "
    "run bpo-gym-setup alfworld (it installs alfworld==0.4.2, textworld==1.7.0, "
    "fast-downward-textworld==20.6.4 and jericho==3.3.1 with --no-deps)."
)


def cache_root() -> Path:
    """Where generated games live: ``$BPO_ALFWORLD_CACHE``, else ``$XDG_CACHE_HOME/bpo_gym/alfworld``."""
    explicit = os.environ.get("BPO_ALFWORLD_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    return user_cache_dir("alfworld")


def _import_upstream() -> dict[str, Any]:
    user_value = os.environ.get("ALFWORLD_DATA")
    if not user_value:
        scratch = cache_root() / "alfworld_data"
        scratch.mkdir(parents=True, exist_ok=True)
        os.environ["ALFWORLD_DATA"] = str(scratch)
    argv = list(sys.argv)
    try:
        import alfworld.gen.constants as constants
        import alfworld.gen.goal_library as goal_library
        import alfworld.info as info
        import fast_downward
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        from textworld.envs import PddlEnv
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
    finally:
        sys.argv[:] = argv
        if user_value is None:
            os.environ.pop("ALFWORLD_DATA", None)
        else:
            os.environ["ALFWORLD_DATA"] = user_value
    return {
        "constants": constants,
        "goal_library": goal_library,
        "pddl_path": info.ALFRED_PDDL_PATH,
        "grammar_path": info.ALFRED_TWL2_PATH,
        "layouts": Path(constants.__file__).parent / "layouts",
        "fast_downward": fast_downward,
        "textworld": textworld,
        "PddlEnv": PddlEnv,
        "AlfredDemangler": AlfredDemangler,
    }


_UPSTREAM: dict[str, Any] | None = None
_LOCK = threading.RLock()


def upstream() -> dict[str, Any]:
    """The upstream modules and data paths (imported once, on first use)."""
    global _UPSTREAM
    with _LOCK:
        if _UPSTREAM is None:
            _UPSTREAM = _import_upstream()
        return _UPSTREAM


def domain_text() -> str:
    """alfworld's PDDL domain (``alfworld/data/alfred.pddl``)."""
    return Path(upstream()["pddl_path"]).read_text()


def grammar_text() -> str:
    """alfworld's text grammar (``alfworld/data/alfred.twl2``), goal still ``UNKNOWN GOAL``."""
    return Path(upstream()["grammar_path"]).read_text()


# ---- translation cache -------------------------------------------------------------------
# Every re-rooted restore translates a new problem text (two translations: plain and optimised),
# and one translation holds 0.3-1.2 MiB of Python objects (the parsed task plus the SAS text).
# The cache is therefore bounded by an estimate of its bytes, not by a count: 256 entries of
# re-rooted states alone held ~200 MiB. Measured Python-side size / len(SAS text) was 1.4-3.1, so
# _BYTES_PER_SAS_CHAR = 3 over-estimates; the cache keeps at most TRANSLATION_CACHE_BYTES of
# estimated size (plus the newest problem's entries, whatever their size). 192 MiB holds both
# translations of ~80 of the CPU default's games (2.3 MiB estimated each, 0.6-3.8), so training
# on a few dozen tasks does not re-translate at every reset (a miss costs 0.2-0.9 s, or 10-20 ms
# to read a stored translation from disk);
# $BPO_ALFWORLD_TRANSLATION_CACHE_MB overrides it. Which problem leaves: see _victim.
TRANSLATION_CACHE_BYTES = int(float(os.environ.get("BPO_ALFWORLD_TRANSLATION_CACHE_MB", 192)) * 2**20)
_BYTES_PER_SAS_CHAR = 3
_TRANSLATIONS: dict[tuple[str, bool], tuple[Any, int]] = {}
"""(problem digest, optimised) -> (the translation, its estimated bytes)."""
_PROBLEM_BYTES: dict[str, int] = {}
"""problem digest -> the estimated bytes of its translations kept (in the order first kept)."""
_translation_bytes = 0
PARSED_FACTS_BYTES = int(float(os.environ.get("BPO_ALFWORLD_PARSED_FACTS_MB", 32)) * 2**20)
"""The bound on the parsed facts kept ($BPO_ALFWORLD_PARSED_FACTS_MB): a game's are ~800
references to textworld's propositions (which textworld memoises for the process anyway), about
7 kB, so 32 MiB keeps every game of the CPU default's splits (1,274) with room to spare."""
_PARSED_FACTS: dict[str, tuple[tuple[tuple[Any, ...], ...], int]] = {}
"""problem digest -> (the facts ``PddlState.__init__`` parses from text, per ``add_facts`` call;
their bytes), kept apart from the translations: a game whose translation is read from disk again
is not parsed again."""
_parsed_facts_bytes = 0
LOAD_HISTORY_KEPT = 1 << 16
_LOADS: OrderedDict[str, tuple[int, int | None]] = OrderedDict()
"""problem digest -> (the index of its last game load, the loads between its last two), the
:data:`LOAD_HISTORY_KEPT` problems loaded last."""
_loads_counted = 0
_original_pddl2sas: Any = None
_patch_depth = 0


def _key(domain: str, problem: str, optimize: bool) -> tuple[str, bool]:
    digest = hashlib.blake2b(digest_size=20)
    digest.update(domain.encode())
    digest.update(b"\x00")
    digest.update(problem.encode())
    return digest.hexdigest(), bool(optimize)


def _estimated_bytes(result: Any) -> int:
    sas = result[1] if isinstance(result, tuple) and len(result) == 2 else result
    return _BYTES_PER_SAS_CHAR * len(sas) if isinstance(sas, str) else 2**20


def note_game_load(game: dict[str, Any]) -> None:
    """Record that a game is being loaded (``AlfredEngine.load``): the cache's eviction
    predicts a problem's next load from its last two (:func:`_victim`)."""
    global _loads_counted
    digest = _key(game["pddl_domain"], game["pddl_problem"], False)[0]
    with _LOCK:
        now = _loads_counted
        _loads_counted += 1
        last = _LOADS.pop(digest, None)
        _LOADS[digest] = (now, None if last is None else now - last[0])
        if len(_LOADS) > LOAD_HISTORY_KEPT:
            _LOADS.popitem(last=False)


def _cached_pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
    key = _key(domain, problem, optimize)
    with _LOCK:
        hit = _TRANSLATIONS.get(key)
        if hit is not None:
            return hit[0]
        argv = list(sys.argv)
        try:
            result = _original_pddl2sas(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            sys.argv[:] = argv
        _store_translation(key, result)
        return result


def _store_translation(key: tuple[str, bool], result: Any) -> None:
    global _translation_bytes
    with _LOCK:
        if key in _TRANSLATIONS:
            _forget(key[0])
        size = _estimated_bytes(result)
        _TRANSLATIONS[key] = (result, size)
        _PROBLEM_BYTES[key[0]] = _PROBLEM_BYTES.get(key[0], 0) + size
        _translation_bytes += size
        _evict(key[0])


def _forget(digest: str) -> None:
    """Drop everything the cache keeps for the problem ``digest``."""
    global _translation_bytes
    for optimize in (False, True):
        _TRANSLATIONS.pop((digest, optimize), None)
    _translation_bytes -= _PROBLEM_BYTES.pop(digest, 0)


def _evict(newest: str) -> None:
    """Drop problems (:func:`_victim`) until the cache is within :data:`TRANSLATION_CACHE_BYTES`
    or holds only ``newest``'s entries (the problem being loaded: its two translations are
    stored one after the other and both are read right after)."""
    while _translation_bytes > TRANSLATION_CACHE_BYTES and len(_PROBLEM_BYTES) > 1:
        _forget(_victim(newest))


def _victim(newest: str) -> str:
    """The problem whose translations to drop (any but ``newest``): :func:`_furthest`."""
    return _furthest(newest, _PROBLEM_BYTES)


def _furthest(newest: str, among: Any) -> str:
    """The problem of ``among`` (any but ``newest``) whose next game load is predicted
    furthest away, counted in game loads (:func:`note_game_load`). A problem loaded twice is
    predicted to come back one gap after its last load (the loads between its last two): the
    evaluation games come back in the same order at every evaluation point, so their gaps
    repeat. The order, first to go:

    1. problems never loaded as a game (the states of re-rooted restores), the oldest first;
    2. problems loaded once, the most recently loaded first: on a scan larger than the cache
       (every evaluation point's games, in the same order) those kept from the scan's start
       are found at its next pass, where LRU would keep none (each would be dropped before
       its next load);
    3. problems whose prediction failed (not loaded again within twice their gap: a game
       played in a burst, such as one task's group of episodes), the longest overdue first;
    4. the rest, the furthest predicted load first (a problem a little overdue ranks by its
       predicted load, now past, and stays: the gaps between evaluation points vary with the
       training loads between them).
    """
    now = _loads_counted - 1

    def rank(digest: str) -> tuple[int, int]:
        last, gap = _LOADS.get(digest, (None, None))
        if last is None:
            return 4, 0
        if gap is None:
            return 3, last
        if now - last > 2 * gap:
            return 2, now - last - 2 * gap
        return 1, last + gap

    return max((d for d in among if d != newest), key=rank)


# ---- grammar parses ------------------------------------------------------------------------
# textworld parses each game's grammar file (its action templates and the goal text) with TatSu
# on every load (≈0.1-0.4 s). The parse is kept pickled, per text, and unpickled per load (≈1 ms),
# so no two loads share mutable objects.
_LOGIC_PARSES: OrderedDict[str, bytes] = OrderedDict()
LOGIC_PARSES_KEPT = 512


def _logic_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return hashlib.blake2b(repr((args, sorted(kwargs.items()))).encode(), digest_size=20).hexdigest()


def _cached_logic_parse(original: Any) -> Any:
    def parse_and_convert(*args: Any, **kwargs: Any) -> Any:
        key = _logic_key(args, kwargs)
        with _LOCK:
            blob = _LOGIC_PARSES.get(key)
            if blob is not None:
                _LOGIC_PARSES.move_to_end(key)
        if blob is None:
            result = original(*args, **kwargs)
            blob = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
            with _LOCK:
                _LOGIC_PARSES[key] = blob
                while len(_LOGIC_PARSES) > LOGIC_PARSES_KEPT:
                    _LOGIC_PARSES.popitem(last=False)
        return pickle.loads(blob)

    return parse_and_convert


# ---- the on-disk translation of a game ---------------------------------------------------------
TRANSLATION_FORMAT = "bpo-alfworld-translation/1"
TRANSLATION_SUFFIX = ".translated.pkl"


@functools.lru_cache(maxsize=1)
def _versions() -> tuple[str, ...]:
    from importlib import metadata

    out = []
    for name in ("textworld", "fast-downward-textworld"):
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name}==?")
    return tuple(out)


def _game_digest(game: dict[str, Any]) -> str:
    digest = hashlib.blake2b(digest_size=20)
    for part in (game["pddl_domain"], game["grammar"], game["pddl_problem"], *_versions()):
        digest.update(part.encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def translation_path(game: dict[str, Any]) -> Path:
    """Where the translation of ``game`` is kept: this library's cache folder,
    ``cache_root()/translations/``, under a hash of the game's texts and the engine versions.
    Never beside the game: a file there may come with someone else's games."""
    return cache_root() / "translations" / f"{_game_digest(game)}{TRANSLATION_SUFFIX}"


def has_translation(game: dict[str, Any]) -> bool:
    """Whether this process holds the game's translations and grammar parse already."""
    domain, problem = game["pddl_domain"], game["pddl_problem"]
    with _LOCK:
        return (
            _key(domain, problem, False) in _TRANSLATIONS
            and _key(domain, problem, True) in _TRANSLATIONS
            and _logic_key((game["grammar"],), {"rule_name": "pddlStart"}) in _LOGIC_PARSES
        )


def load_translation(game_path: Path | None, game: dict[str, Any]) -> bool:
    """Fill the in-process caches with the game's on-disk translation (the problem's two
    PDDL -> SAS translations and the grammar's parse), if one is stored for exactly this game
    text and these engine versions in this library's cache folder (:func:`translation_path`).
    Returns whether one was. The file is a pickle sealed with the user's key
    (:mod:`bpo_envs.sealed`), checked before it is unpickled; a damaged, stale or foreign file
    is ignored (and later rewritten). A game with no file (``game_path=None``: e.g. a
    generator's candidate) has none."""
    if game_path is None:
        return False
    path = translation_path(game)
    try:
        blob = unseal(path.read_bytes(), TRANSLATION_FORMAT, f"the translation cache {path}")
        payload = pickle.loads(blob)  # noqa: S301 - sealed with the user's key: written by this library
    except FileNotFoundError:
        return False
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign cache file is ignored
        log.info("ALFWorld: ignoring the translation cache %s (%s)", path, exc)
        return False
    if not isinstance(payload, dict) or payload.get("format") != TRANSLATION_FORMAT or payload.get("digest") != _game_digest(game):
        return False
    domain, problem = game["pddl_domain"], game["pddl_problem"]
    with _LOCK:
        for optimize, result in ((False, payload["plain"]), (True, payload["optimized"])):
            _store_translation(_key(domain, problem, optimize), result)
        _LOGIC_PARSES[_logic_key((game["grammar"],), {"rule_name": "pddlStart"})] = payload["logic"]
    return True


def save_translation(game_path: Path | None, game: dict[str, Any]) -> Path | None:
    """Write the game's translation (from the in-process caches, right after it was loaded),
    sealed, to :func:`translation_path`. Returns the file written (None when the caches no
    longer hold it, when the cache folder is not writable, or for ``game_path=None``)."""
    if game_path is None:
        return None
    domain, problem = game["pddl_domain"], game["pddl_problem"]
    with _LOCK:
        plain = _TRANSLATIONS.get(_key(domain, problem, False))
        optimized = _TRANSLATIONS.get(_key(domain, problem, True))
        logic = _LOGIC_PARSES.get(_logic_key((game["grammar"],), {"rule_name": "pddlStart"}))
    if plain is None or optimized is None or logic is None:
        return None
    payload = {
        "format": TRANSLATION_FORMAT, "digest": _game_digest(game),
        "plain": plain[0], "optimized": optimized[0], "logic": logic,
    }  # fmt: skip
    blob = seal(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL), TRANSLATION_FORMAT)
    path = translation_path(game)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, blob)
        return path
    except OSError as exc:
        log.info("ALFWorld: cannot write the translation cache %s (%s)", path, exc)
    return None


def translation_cache_bytes() -> int:
    """The translation cache's estimated size in bytes (at most :data:`TRANSLATION_CACHE_BYTES`
    unless the newest problem's translations alone are more)."""
    return _translation_bytes


def _clone(obj: Any) -> Any:
    """A copy of a parsed symbol (list) that shares nothing mutable with ``obj``."""
    if isinstance(obj, list):
        return [_clone(x) for x in obj]
    if isinstance(obj, _TEXTGEN_SYMBOL[0]):
        new = copy.copy(obj)
        for name in ("symbol", "expression"):
            value = getattr(obj, name, None)  # third-party: a textgen symbol, which may lack either
            if isinstance(value, (list, _TEXTGEN_SYMBOL[0])):
                setattr(new, name, _clone(value))
        return new
    return copy.deepcopy(obj)


_TEXTGEN_SYMBOL: list[Any] = [type(None)]
_FLAGS: dict[tuple[str, bool], bool] = {}
_EVAL_CODE: dict[str, Any] = {}
_PARSES: dict[tuple[Any, ...], Any] = {}
_QUERIES: dict[str, Any] = {}


def _fast_textgen(textgen: Any) -> dict[str, Any]:
    """Replacements for textworld.envs.pddl.textgen's module names (see the module docstring)."""
    original_parse = textgen._parse_and_convert
    rule_cls = textgen.Rule

    def parse_and_convert(*args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items())))
        hit = _PARSES.get(key)
        if hit is None:
            hit = _PARSES[key] = original_parse(*args, **kwargs)
        return _clone(hit)

    class RuleShim:
        @staticmethod
        def parse_conjunctive_query(expr: str) -> Any:
            hit = _QUERIES.get(expr)
            if hit is None:
                hit = _QUERIES[expr] = rule_cls.parse_conjunctive_query(expr)
            return hit

    def copy_context(context: dict[str, Any]) -> dict[str, Any]:
        return {
            "state": context["state"],
            "facts": context["facts"],
            "variables": dict(context["variables"]),
            "mapping": dict(context["mapping"]),
            "entity_infos": context["entity_infos"],
        }

    def deepcopy(obj: Any, memo: Any = None) -> Any:
        return _clone(obj)

    original_check_flag = textgen.check_flag

    def check_flag(flag: str, default: bool = False) -> bool:
        # read once per engine block (the derivation asks at every symbol it pops)
        key = (flag, default)
        value = _FLAGS.get(key)
        if value is None:
            value = _FLAGS[key] = original_check_flag(flag, default)
        return value

    terminal = textgen.TerminalSymbol

    def eval_derive(self: Any, context: Any = None) -> Any:
        # EvalSymbol.derive: ``eval`` of the expression in the method's own scope (``self``,
        # ``context``, then the variables, as its ``locals().update``) and textgen's globals,
        # with the expression compiled once instead of at every call
        context = context or self.context
        scope = {"self": self, "context": context}
        scope.update(context["variables"])
        code = _EVAL_CODE.get(self.expression)
        if code is None:
            code = _EVAL_CODE[self.expression] = compile(self.expression, "<string>", "eval", dont_inherit=True)
        return [terminal(eval(code, textgen.__dict__, scope))]  # noqa: S307 - textworld's own grammar expression, as upstream

    _saved["__fast_eval__"] = eval_derive
    return {
        "check_flag": check_flag,
        "_parse_and_convert": parse_and_convert,
        "Rule": RuleShim,
        "copy_context": copy_context,
        "deepcopy": deepcopy,
    }


# textworld's PddlEnv builds the game's state (a Fast Downward task load plus ~1k fact parses)
# in load() and again in reset(); right after load() the second is the same as the first. Any
# other build of a problem takes its parsed facts from _PARSED_FACTS where they are kept,
# recorded at its first build (the facts of each add_facts call, in order).
class _Reusable(threading.local):
    state: Any = None  # per thread: the state reuse_loaded_state left, else None


_REUSE = _Reusable()


def reuse_loaded_state(state: Any) -> None:
    """Let the next ``PddlState`` this thread builds, if for the same problem, logic and Fast
    Downward library as ``state`` (a state just built by ``PddlEnv.load`` and not played), be
    ``state`` itself."""
    _REUSE.state = state


def _pddl_state_factory(original: Any) -> Any:
    recording = type("RecordingPddlState", (original,), {"add_facts": _recorded_add_facts})

    def make(downward_lib: Any, pddl_problem: str, logic: Any) -> Any:
        pending = _REUSE.state
        _REUSE.state = None
        if (
            pending is not None
            and pending.downward_lib is downward_lib
            and pending.pddl_problem is pddl_problem
            and pending._logic is logic
        ):
            return pending
        digest = _key(logic.domain, pddl_problem, False)[0]
        with _LOCK:
            kept = _PARSED_FACTS.get(digest)
        if kept is not None:
            return _state_from_parsed(original, downward_lib, pddl_problem, logic, kept[0])
        state = recording(downward_lib, pddl_problem, logic)
        state.__class__ = original
        _keep_parsed(digest, tuple(state.__dict__.pop("_added_facts")))
        return state

    return make


def _recorded_add_facts(self: Any, props: Any) -> None:
    """``State.add_facts`` that also records each call's facts, in order (``_added_facts``):
    ``PddlState.__init__`` adds the problem's ``:init`` facts, then those of Fast Downward's
    initial state, each parsed from text."""
    props = list(props)
    self.__dict__.setdefault("_added_facts", []).append(tuple(props))
    for prop in props:
        self.add_fact(prop)


def _parsed_bytes(parsed: tuple[tuple[Any, ...], ...]) -> int:
    # the tuples only: textworld's propositions live in its own memo (mementos) for the process
    return sys.getsizeof(parsed) + sum(sys.getsizeof(facts) for facts in parsed)


def _keep_parsed(digest: str, parsed: tuple[tuple[Any, ...], ...]) -> None:
    """Keep a problem's parsed facts within :data:`PARSED_FACTS_BYTES` (plus the newest's),
    dropping first the problem whose next load is predicted furthest (:func:`_furthest`)."""
    global _parsed_facts_bytes
    with _LOCK:
        if digest in _PARSED_FACTS:
            _parsed_facts_bytes -= _PARSED_FACTS.pop(digest)[1]
        size = _parsed_bytes(parsed)
        _PARSED_FACTS[digest] = (parsed, size)
        _parsed_facts_bytes += size
        while _parsed_facts_bytes > PARSED_FACTS_BYTES and len(_PARSED_FACTS) > 1:
            _parsed_facts_bytes -= _PARSED_FACTS.pop(_furthest(digest, _PARSED_FACTS))[1]


def parsed_facts_bytes() -> int:
    """The bytes of the parsed facts kept (at most :data:`PARSED_FACTS_BYTES` unless the newest
    problem's alone are more)."""
    return _parsed_facts_bytes


def _state_from_parsed(cls: Any, downward_lib: Any, pddl_problem: str, logic: Any, parsed: tuple[tuple[Any, ...], ...]) -> Any:
    """``PddlState(downward_lib, pddl_problem, logic)`` as textworld 1.7.0's ``__init__`` builds
    it, but with the facts it parses from text (the ``:init`` atoms, Fast Downward's initial
    state's atoms) taken from ``parsed``, the same propositions (textworld memoises each) added
    in the same order, so every set holds them in the same order. Fast Downward still loads
    both SAS texts into ``downward_lib``; only reading its initial state back (``get_state``) is
    skipped, which changes nothing in the library."""
    fd = upstream()["fast_downward"]
    textworld_logic = upstream()["textworld"].logic
    state = cls.__new__(cls)
    state._facts = defaultdict(set)
    state._vars_by_name = {}
    state._vars_by_type = defaultdict(set)
    state._var_counts = Counter()
    state._logic = logic
    state.downward_lib = downward_lib
    state.pddl_problem = pddl_problem
    verbose = _check_flag("TW_PDDL_DEBUG")
    state.task, state.sas = fd.pddl2sas(logic.domain, pddl_problem, verbose=verbose)
    _, state.sas_replan = fd.pddl2sas(logic.domain, pddl_problem, verbose=verbose, optimize=True)
    state._actions = {a.name: a for a in state.task.actions}
    for type_ in state.task.types:
        try:
            logic.types.add(textworld_logic.Type(type_.name, type_.supertype_names))
        except ValueError:
            pass
    downward_lib.load_sas(state.sas.encode("utf-8"))
    downward_lib.load_sas_replan(state.sas_replan.encode("utf-8"))
    state.name2type = {o.name: o.type_name for o in state.task.objects}
    for facts in parsed:
        state.add_facts(facts)
    return state


def _check_flag(name: str) -> bool:
    from textworld.envs.pddl.logic import check_flag

    return check_flag(name)


def _chained_facts(self: Any) -> Iterator[Any]:
    """``State.facts``: the facts of every signature's set, in the order textworld's generator
    yields them, iterated in C (``_gather_infos`` lists them once per applicable action)."""
    return itertools.chain.from_iterable(self._facts.values())


_CHAINED_FACTS = property(_chained_facts)
_saved: dict[str, Any] = {}
_ENGINE_LOCK = threading.RLock()
"""Held for every engine block: textworld parses with module-level TatSu parsers and grammar
state that two threads corrupt (``IndexError: pop from empty list`` in TatSu's rule stack when
two envs of one process step at once, e.g. two sessions of one ``bpo-serve``)."""


@contextlib.contextmanager
def engine_patches() -> Iterator[None]:
    """Within the block, textworld's PDDL env reuses cached translations and template parses,
    copies contexts shallowly and keeps ``sys.argv`` (see the module docstring); one thread of
    the process at a time runs an engine block (:data:`_ENGINE_LOCK`)."""
    with _ENGINE_LOCK, _patched():
        yield


@contextlib.contextmanager
def _patched() -> Iterator[None]:
    global _original_pddl2sas, _patch_depth
    fd = upstream()["fast_downward"]
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as textworld_logic

    with _LOCK:
        if _patch_depth == 0:
            _original_pddl2sas = fd.pddl2sas
            fd.pddl2sas = _cached_pddl2sas
            if not _saved:
                _TEXTGEN_SYMBOL[0] = textgen.Symbol
                _saved.update({name: getattr(textgen, name) for name in ("check_flag", "_parse_and_convert", "Rule", "copy_context", "deepcopy")})
                _saved["__eval__"] = textgen.EvalSymbol.__dict__["derive"]
                _saved["__fast__"] = _fast_textgen(textgen)
                _saved["__logic__"] = pddl_logic._parse_and_convert
                _saved["__fast_logic__"] = _cached_logic_parse(pddl_logic._parse_and_convert)
                _saved["__state__"] = pddl_logic.PddlState
                _saved["__fast_state__"] = _pddl_state_factory(pddl_logic.PddlState)
                _saved["__facts__"] = textworld_logic.State.__dict__["facts"]
            for name, value in _saved["__fast__"].items():
                setattr(textgen, name, value)
            pddl_logic._parse_and_convert = _saved["__fast_logic__"]
            pddl_logic.PddlState = _saved["__fast_state__"]
            textworld_logic.State.facts = _CHAINED_FACTS
            textgen.EvalSymbol.derive = _saved["__fast_eval__"]
            _FLAGS.clear()
        _patch_depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _patch_depth -= 1
            if _patch_depth == 0:
                fd.pddl2sas = _original_pddl2sas
                for name in _saved["__fast__"]:
                    setattr(textgen, name, _saved[name])
                pddl_logic._parse_and_convert = _saved["__logic__"]
                pddl_logic.PddlState = _saved["__state__"]
                textworld_logic.State.facts = _saved["__facts__"]
                textgen.EvalSymbol.derive = _saved["__eval__"]
                _REUSE.state = None


def clear_translation_cache() -> None:
    """Forget every cached translation, parsed fact and load (for benchmarks of the cold path)."""
    global _translation_bytes, _loads_counted, _parsed_facts_bytes
    with _LOCK:
        _TRANSLATIONS.clear()
        _PARSED_FACTS.clear()
        _PROBLEM_BYTES.clear()
        _LOGIC_PARSES.clear()
        _LOADS.clear()
        _translation_bytes = 0
        _parsed_facts_bytes = 0
        _loads_counted = 0
