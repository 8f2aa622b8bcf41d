"""Named tables of plugins (algorithms, advantage estimators) and their entry-point groups.

A table maps a name to a callable. :func:`load_entry_points` fills one from the entry points
of every installed distribution in a group (``bpo_algos.algorithms``:
:mod:`bpo_algos.registry`; ``bpo_algos.advantages``: :mod:`bpo_algos.advantages`).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

ALGORITHM_GROUP = "bpo_algos.algorithms"
ADVANTAGE_GROUP = "bpo_algos.advantages"
PROJECT = "bpo-gym"
"""This project's distribution: its entry points come first."""

_LOADED: set[str] = set()
_SOURCES: dict[tuple[str, str], Any] = {}
"""The object each loaded entry point (group, name) gave."""


def add_named(table: dict[str, Any], kind: str, name: str, fn: Any, *, overwrite: bool = False) -> None:
    """``table[name] = fn`` for a registry of ``kind``s (``"algorithm"``, ``"estimator"``):
    ``name`` a non-empty string without spaces, ``fn`` callable, a taken name only with
    ``overwrite``."""
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"an {kind} name must be a non-empty string without spaces, got {name!r}")
    if not callable(fn):
        raise TypeError(f"the {kind} {name!r} must be callable, got {type(fn).__name__}")
    if name in table and not overwrite:
        raise ValueError(f"{kind} {name!r} is already registered (pass overwrite=True to replace it)")
    table[name] = fn


def load_entry_points(group: str, table: dict[str, Any], kind: str, convert: Callable[[Any], Any] | None = None) -> None:
    """Add every entry point of ``group`` to ``table``, once per group: this project's first,
    then other distributions' by name. A name taken by another object is an error (the same
    object twice, one distribution found on two paths, counts once), and so is an entry point
    that fails to load: a broken plugin must not silently drop out of a comparison. ``convert``
    turns a loaded object into what the table holds (the algorithm registry: an
    ``AlgorithmFactory``)."""
    if group in _LOADED:
        return
    _LOADED.add(group)

    def order(point: Any) -> tuple[bool, str]:
        dist = point.dist.name if point.dist else ""
        return dist != PROJECT, dist

    for point in sorted(entry_points(group=group), key=order):
        try:
            obj = point.load()
        except Exception as exc:
            _LOADED.discard(group)
            dist = point.dist.name if point.dist else "?"
            raise ImportError(f"the {kind} entry point {point.name!r} ({point.value}, from {dist}) failed to load: {exc}") from exc
        if point.name in table and _SOURCES.get((group, point.name)) is obj:
            continue  # the same object twice (one distribution on two paths)
        add_named(table, kind, point.name, obj)
        _SOURCES[(group, point.name)] = obj
        if convert is not None:
            table[point.name] = convert(obj)
