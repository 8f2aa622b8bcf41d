"""The bundled SWE-bench-format instances: small real Python repos, built from shipped source.

:func:`bundled_instances` builds each repository as a git repo with history (deterministic
commit ids), computes the gold ``patch`` and the ``test_patch`` with git in a scratch clone (so
neither is in the repo's objects), and returns SWE-bench rows with ``repo_path`` pointing at the
built repo. Builds are cached under ``$BPO_SWEBENCH_CACHE`` (default
``~/.cache/bpo-gym/swebench``), keyed by a digest of the source.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bpo_envs.swebench._git import git, git_text, require_git
from bpo_envs.swebench.bundled import inicfg, intervals, romans, textkit
from bpo_envs.swebench.bundled.spec import Commit, RepoSource

SOURCES: tuple[RepoSource, ...] = (textkit.REPO, intervals.REPO, inicfg.REPO, romans.REPO)
_FORMAT = "bpo-swebench-bundled/1"

__all__ = ["SOURCES", "Commit", "RepoSource", "build_repo", "bundled_instances", "cache_root"]


def cache_root() -> Path:
    """Where built repositories are cached (``$BPO_SWEBENCH_CACHE`` overrides)."""
    env = os.environ.get("BPO_SWEBENCH_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "bpo-gym" / "swebench"


def _digest(sources: tuple[RepoSource, ...]) -> str:
    return hashlib.blake2b(repr((_FORMAT, sources)).encode(), digest_size=8).hexdigest()


def _write(root: Path, files: dict[str, str | None] | Any) -> None:
    for rel, content in files.items():
        path = root / rel
        if content is None:
            path.unlink(missing_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")


def _diff_after(repo: Path, base: str, files: Any) -> str:
    """The diff that writing ``files`` on top of ``base`` makes (computed in a scratch clone)."""
    with tempfile.TemporaryDirectory(prefix="bpo-swe-scratch-") as tmp:
        scratch = Path(tmp) / "r"
        git("clone", "-q", "--no-local", str(repo), str(scratch))
        _write(scratch, files)
        git("add", "-A", cwd=scratch)
        return git("diff", "--cached", base, cwd=scratch).decode("utf-8")


def build_repo(source: RepoSource, dest: Path) -> dict[str, Any]:
    """Build ``source`` as a git repo at ``dest``; return its SWE-bench row."""
    require_git()
    dest.mkdir(parents=True)
    git("init", "-q", "-b", "main", str(dest))
    for i, commit in enumerate(source.commits):
        _write(dest, commit.files)
        git("add", "-A", cwd=dest)
        date = f"2024-01-{i + 1:02d}T12:00:00+00:00"
        git(
            "commit", "-q", "-m", commit.message, cwd=dest,
            env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date},
        )
    base = git_text("rev-parse", "HEAD", cwd=dest)
    return {
        "instance_id": f"bpo-gym__{source.name}-1",
        "repo": f"bpo-gym/{source.name}",
        "base_commit": base,
        "patch": _diff_after(dest, base, source.fix),
        "test_patch": _diff_after(dest, base, source.tests),
        "problem_statement": source.problem_statement,
        "hints_text": "",
        "created_at": f"2024-01-{len(source.commits) + 1:02d}T12:00:00+00:00",
        "version": source.version,
        "FAIL_TO_PASS": json.dumps(list(source.fail_to_pass)),
        "PASS_TO_PASS": json.dumps(list(source.pass_to_pass)),
        "environment_setup_commit": base,
        "test_cmd": source.test_cmd,
        "log_parser": source.log_parser,
        **dict(source.extra),
    }


def bundled_instances(sources: tuple[RepoSource, ...] = SOURCES) -> list[dict[str, Any]]:
    """Build (once, cached) and return the bundled rows, each with an absolute ``repo_path``."""
    root = cache_root() / _digest(sources)
    rows_file = root / "instances.json"
    if not rows_file.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root.parent))
        try:
            rows = []
            for source in sources:
                row = build_repo(source, tmp / source.name)
                row["repo_path"] = source.name
                rows.append(row)
            (tmp / "instances.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
            try:
                os.rename(tmp, root)
            except OSError:  # another process finished the same build first
                if not rows_file.exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = json.loads(rows_file.read_text(encoding="utf-8"))
    for row in rows:
        row["repo_path"] = str(root / row["repo_path"])
    return rows
