"""Imports of the upstream ``alfworld`` / ``textworld`` / ``fast_downward`` packages, tamed.

* ``import alfworld`` creates ``$ALFWORLD_DATA`` (default ``~/.cache/alfworld``) and writes the
  variable into ``os.environ``. When the user has not set it, the import here points it at this
  project's cache folder and removes it from ``os.environ`` again, so nothing lands in
  ``~/.cache/alfworld`` and later code still sees the user's own setting (or none).
* ``fast_downward.pddl2sas`` overwrites ``sys.argv`` and re-runs the PDDL -> SAS translation on
  every load; textworld's text grammar re-parses every template with TatSu and deep-copies its
  derivation context on every step (≈40-70 ms a step). :func:`engine_patches` swaps in, for the
  duration of a block, a translation that keeps ``sys.argv`` and is memoised per (domain,
  problem) text, memoised template/query parses and shallow context copies. The derived text is
  the same (the derivation only reads the copied contexts); only the time changes.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "bpo_gym" / "alfworld"


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
# estimated size (plus the newest entry, whatever its size). 192 MiB holds both translations of
# ~64 games, so training on a few dozen tasks does not re-translate at every reset (a miss costs
# 0.2-0.9 s); $BPO_ALFWORLD_TRANSLATION_CACHE_MB overrides it.
TRANSLATION_CACHE_BYTES = int(float(os.environ.get("BPO_ALFWORLD_TRANSLATION_CACHE_MB", 192)) * 2**20)
_BYTES_PER_SAS_CHAR = 3
_TRANSLATIONS: OrderedDict[tuple[str, bool], tuple[Any, int]] = OrderedDict()
_translation_bytes = 0
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


def _cached_pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
    global _translation_bytes
    key = _key(domain, problem, optimize)
    with _LOCK:
        hit = _TRANSLATIONS.get(key)
        if hit is not None:
            _TRANSLATIONS.move_to_end(key)
            return hit[0]
        argv = list(sys.argv)
        try:
            result = _original_pddl2sas(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            sys.argv[:] = argv
        size = _estimated_bytes(result)
        _TRANSLATIONS[key] = (result, size)
        _translation_bytes += size
        while _translation_bytes > TRANSLATION_CACHE_BYTES and len(_TRANSLATIONS) > 1:
            _, (_, old) = _TRANSLATIONS.popitem(last=False)
            _translation_bytes -= old
        return result


def translation_cache_bytes() -> int:
    """The translation cache's estimated size in bytes (at most :data:`TRANSLATION_CACHE_BYTES`
    unless its newest entry alone is larger)."""
    return _translation_bytes


def _clone(obj: Any) -> Any:
    """A copy of a parsed symbol (list) that shares nothing mutable with ``obj``."""
    if isinstance(obj, list):
        return [_clone(x) for x in obj]
    if isinstance(obj, _TEXTGEN_SYMBOL[0]):
        new = copy.copy(obj)
        for name in ("symbol", "expression"):
            value = getattr(obj, name, None)
            if isinstance(value, (list, _TEXTGEN_SYMBOL[0])):
                setattr(new, name, _clone(value))
        return new
    return copy.deepcopy(obj)


_TEXTGEN_SYMBOL: list[Any] = [type(None)]
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

    return {
        "_parse_and_convert": parse_and_convert,
        "Rule": RuleShim,
        "copy_context": copy_context,
        "deepcopy": deepcopy,
    }


_saved: dict[str, Any] = {}


@contextlib.contextmanager
def engine_patches() -> Iterator[None]:
    """Within the block, textworld's PDDL env reuses cached translations and template parses,
    copies contexts shallowly and keeps ``sys.argv`` (see the module docstring)."""
    global _original_pddl2sas, _patch_depth
    fd = upstream()["fast_downward"]
    import textworld.envs.pddl.textgen as textgen

    with _LOCK:
        if _patch_depth == 0:
            _original_pddl2sas = fd.pddl2sas
            fd.pddl2sas = _cached_pddl2sas
            if not _saved:
                _TEXTGEN_SYMBOL[0] = textgen.Symbol
                _saved.update({name: getattr(textgen, name) for name in ("_parse_and_convert", "Rule", "copy_context", "deepcopy")})
                _saved["__fast__"] = _fast_textgen(textgen)
            for name, value in _saved["__fast__"].items():
                setattr(textgen, name, value)
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


def clear_translation_cache() -> None:
    """Forget every cached translation (for benchmarks of the cold path)."""
    global _translation_bytes
    with _LOCK:
        _TRANSLATIONS.clear()
        _translation_bytes = 0
