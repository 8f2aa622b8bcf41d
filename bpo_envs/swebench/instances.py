"""Loading SWE-bench rows: json / jsonl / parquet files, task-repo folders, or the bundled set."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REQUIRED = ("instance_id", "repo", "base_commit", "test_patch", "problem_statement",
            "FAIL_TO_PASS", "PASS_TO_PASS")
"""Columns every row needs (``patch`` too, for ``expert_actions``; ``version`` for classic grading)."""


class InstanceError(ValueError):
    """A row or instance file is malformed; the message names the row and the problem."""


def _test_list(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise InstanceError(f"{where}: not a JSON list of test names: {exc}") from exc
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise InstanceError(f"{where}: expected a list of test names, got {type(value).__name__}")
    return list(value)


def normalize_row(row: Mapping[str, Any], base_dir: Path | None = None) -> dict[str, Any]:
    """Check one row and return a copy with test lists as lists and ``repo_path`` absolute."""
    if not isinstance(row, Mapping):
        raise InstanceError(f"an instance must be a mapping, got {type(row).__name__}")
    name = row.get("instance_id", "<no instance_id>")
    missing = [k for k in REQUIRED if k not in row or row[k] is None]
    if missing:
        raise InstanceError(f"instance {name!r} lacks required column(s) {missing}")
    out = {k: (v.item() if hasattr(v, "item") and not isinstance(v, str) else v) for k, v in row.items()}
    out["FAIL_TO_PASS"] = _test_list(row["FAIL_TO_PASS"], f"{name} FAIL_TO_PASS")
    out["PASS_TO_PASS"] = _test_list(row["PASS_TO_PASS"], f"{name} PASS_TO_PASS")
    out.setdefault("patch", "")
    out.setdefault("version", "")
    out["version"] = str(out["version"] or "")
    repo_path = out.get("repo_path")
    if repo_path:
        path = Path(repo_path)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        out["repo_path"] = str(path.resolve())
    return out


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        try:
            import pandas as pd
        except ImportError as exc:
            raise InstanceError(
                f"{path}: reading parquet needs pyarrow or pandas (pip install pyarrow)"
            ) from exc
        return pd.read_parquet(path).to_dict("records")
    return pq.read_table(path).to_pylist()


def _read_task_repo(root: Path) -> list[dict[str, Any]]:
    """A swebench 5.x task-repo folder: ``tasks/<instance_id>/{task.yaml, gold.patch, ...}``."""
    try:
        import yaml
    except ImportError as exc:
        raise InstanceError(f"{root}: reading a task repo needs PyYAML (pip install pyyaml)") from exc
    rows = []
    files = {"patch": "gold.patch", "test_patch": "test.patch", "eval_script": "eval.sh",
             "problem_statement": "problem_statement.md", "hints_text": "hints.md"}
    for task_dir in sorted(p for p in (root / "tasks").iterdir() if p.is_dir()):
        meta_file = task_dir / "task.yaml"
        if not meta_file.exists():
            raise InstanceError(f"{task_dir}: no task.yaml")
        row = dict(yaml.safe_load(meta_file.read_text(encoding="utf-8")) or {})
        row.setdefault("instance_id", task_dir.name)
        for column, fname in files.items():
            if (task_dir / fname).exists():
                row[column] = (task_dir / fname).read_text(encoding="utf-8")
        tests_file = task_dir / "tests.json"
        if tests_file.exists():
            row.update(json.loads(tests_file.read_text(encoding="utf-8")))
        rows.append(row)
    return rows


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read raw rows from a json / jsonl / parquet file or a task-repo folder."""
    path = Path(path)
    if not path.exists():
        raise InstanceError(f"instance file {path} does not exist")
    if path.is_dir():
        if (path / "tasks").is_dir():
            return _read_task_repo(path)
        raise InstanceError(f"{path} is a folder but not a swebench task repo (no tasks/ in it)")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    text = path.read_text(encoding="utf-8")
    if suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if suffix == ".json":
        data = json.loads(text)
        if isinstance(data, dict):
            data = data.get("instances", [data])
        return list(data)
    raise InstanceError(f"{path}: unknown instance format {suffix!r} (use .json, .jsonl, .parquet)")


def load_instances(source: str | Path | Iterable[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Rows from ``source`` (a path, a list of rows, or None for the bundled set), checked."""
    if source is None:
        from bpo_envs.swebench.bundled import bundled_instances

        raw: list[Any] = bundled_instances()
        base_dir = None
    elif isinstance(source, str | Path):
        raw = read_rows(source)
        base_dir = Path(source).resolve()
        base_dir = base_dir if base_dir.is_dir() else base_dir.parent
    else:
        raw = list(source)
        base_dir = None
    rows = [normalize_row(r, base_dir) for r in raw]
    if not rows:
        raise InstanceError(f"no instances in {source!r}")
    seen: set[str] = set()
    for row in rows:
        if row["instance_id"] in seen:
            raise InstanceError(f"duplicate instance_id {row['instance_id']!r}")
        seen.add(row["instance_id"])
    return rows
