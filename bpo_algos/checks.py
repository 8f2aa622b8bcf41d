"""Argument checks shared by the engine, the algorithms and the policies (one implementation,
in the env layer, so both layers use the same check)."""

from __future__ import annotations

from typing import Any

from bpo_envs.args import check_count

__all__ = ["add_named", "check_count"]


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
