"""Console commands end on Ctrl-C with one line that says how to go on, not a traceback."""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

INTERRUPTED_EXIT = 130
"""The exit status of a command ended by Ctrl-C (128 + SIGINT, as a shell reports it)."""


def resume_hint(command: str, argv: list[str] | None = None) -> str:
    """How to continue: the same command line (``argv``: default ``sys.argv[1:]``) with ``--resume``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--resume" not in args:
        args.append("--resume")
    return f"finished work is kept; continue with: {shlex.join([command, *args])}"


def interrupted_line(command: str, resumable: bool, argv: list[str] | None = None) -> str:
    """The one line a command prints when Ctrl-C ends it."""
    hint = resume_hint(command, argv) if resumable else "it keeps nothing to --resume from: run it again to redo it"
    return f"{command}: interrupted (Ctrl-C); {hint}"


def ends_on_ctrl_c(command: str, *, resumable: bool = False) -> Callable[[F], F]:
    """Decorate a console entry point: Ctrl-C (``KeyboardInterrupt``) prints
    :func:`interrupted_line` on stderr and exits with :data:`INTERRUPTED_EXIT`."""

    def wrap(main: F) -> F:
        @functools.wraps(main)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                print(f"\n{interrupted_line(command, resumable)}", file=sys.stderr)
                raise SystemExit(INTERRUPTED_EXIT) from None

        return run  # type: ignore[return-value]

    return wrap
