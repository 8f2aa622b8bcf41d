"""Command-line flags generated from the config dataclasses, help text from their docstrings.

Every field of a dataclass becomes a flag (``learning_rate`` -> ``--learning-rate``; a prefix
names the holder: ``--bpo.branch-factor`` for ``BPOOptions.branch_factor``), typed from its
annotation (``int``, ``float``, ``str``, ``bool`` as ``--x/--no-x``, ``X | None`` also taking
``none``, ``tuple[int, ...]`` as several values; a field ``X | dict[str, X]`` takes one
``X`` for every env), with the field's docstring (the string under it, or its line in the
class's ``Attributes:`` section) as its help. A flag that is not given leaves the field alone.
Adding a field to a dataclass is all it takes to get its flag.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from collections.abc import Iterable
from typing import Any

NONE_WORDS = ("none", "None", "null")


def field_docs(cls: type) -> dict[str, str]:
    """``{field: first paragraph of its docstring}`` over ``cls`` and its bases: the string
    literal under a field, or the field's entry in an ``Attributes:``/``Args:`` section."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        docs.update(_section_docs(inspect.getdoc(klass) or ""))
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = _first_paragraph(after.value.value)
    return docs


def _section_docs(doc: str) -> dict[str, str]:
    out: dict[str, str] = {}
    lines = doc.splitlines()
    inside, name, text = False, None, []
    for line in [*lines, ""]:
        if line.strip() in ("Attributes:", "Args:"):
            inside = True
            continue
        if not inside:
            continue
        if line.startswith("    ") and not line.startswith("     ") and ":" in line:
            if name:
                out[name] = " ".join(text)
            name, _, rest = line.strip().partition(":")
            text = [rest.strip()]
        elif line.startswith("      ") and name:
            text.append(line.strip())
        else:
            if name:
                out[name] = " ".join(text)
            inside, name, text = (bool(line.strip()) and inside), None, []
    return out


def _first_paragraph(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


def _parts(annotation: Any) -> list[Any]:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return list(typing.get_args(annotation))
    return [annotation]


def _converter(kind: type, optional: bool) -> Any:
    def convert(text: str) -> Any:
        if optional and text in NONE_WORDS:
            return None
        return kind(text)

    convert.__name__ = kind.__name__  # argparse names the type in its errors
    return convert


def flag_spec(annotation: Any) -> dict[str, Any] | None:
    """argparse keywords for a field of type ``annotation`` (None: no flag for this type)."""
    parts = _parts(annotation)
    optional = type(None) in parts
    parts = [p for p in parts if p is not type(None)]
    # a per-env field: X | dict[str, X] takes one X (dict alone: one value for every env)
    plain = [p for p in parts if typing.get_origin(p) is not dict] or [typing.get_args(parts[0])[1]] if parts else []
    if len(plain) != 1:
        return None
    kind = plain[0]
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        return {"nargs": "+", "type": _converter(item, False)} if item in (int, float, str) else None
    if kind in (int, float, str):
        return {"type": _converter(kind, optional)}
    return None


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    prefix: str = "",
    skip: Iterable[str] = (),
    taken: set[str] | None = None,
) -> dict[str, str]:
    """Add a flag per field of dataclass ``cls``; returns ``{dest: field name}``.

    ``prefix`` (e.g. ``"bpo."``) goes before the flag name; fields in ``skip`` and flags in
    ``taken`` (already defined) get none."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    dests: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        flag = "--" + prefix + f.name.replace("_", "-")
        if f.name in skip or (taken is not None and flag in taken):
            continue
        spec = flag_spec(hints[f.name])
        if spec is None:
            continue
        dest = (prefix + f.name).replace(".", "__").replace("-", "_")
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = docs.get(f.name, "")
        if spec.get("action") is None and default is not None and not isinstance(default, dict):
            help_text = f"{help_text} (default: {default})".strip()
        parser.add_argument(flag, dest=dest, default=argparse.SUPPRESS, help=help_text.replace("%", "%%"), **spec)
        if taken is not None:
            taken.add(flag)
        dests[dest] = f.name
    return dests


def given(args: argparse.Namespace, dests: dict[str, str]) -> dict[str, Any]:
    """``{field: value}`` of the flags of ``dests`` that were given on the command line."""
    values = vars(args)  # a flag not given is absent (its default is argparse.SUPPRESS)
    return {name: values[dest] for dest, name in dests.items() if dest in values}
