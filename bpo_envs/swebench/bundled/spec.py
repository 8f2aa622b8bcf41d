"""The shape of a bundled repository's source: its commits, the fix, the tests, the issue."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Commit:
    """One commit: a message and the files it writes (``None`` deletes a file)."""

    message: str
    files: Mapping[str, str | None]


@dataclass(frozen=True)
class RepoSource:
    """A small repository with one bug, in the pieces a SWE-bench row is built from.

    ``commits`` end at the base commit; ``fix`` (files) becomes the gold ``patch`` and
    ``tests`` the ``test_patch``; the fix and the new tests never enter the repo's history.
    """

    name: str
    version: str
    commits: tuple[Commit, ...]
    fix: Mapping[str, str]
    tests: Mapping[str, str]
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    test_cmd: str = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider"
    log_parser: str = "parse_log_pytest"
    extra: Mapping[str, str] = field(default_factory=dict)
