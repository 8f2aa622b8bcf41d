"""Loading SWE-bench rows: json / jsonl / parquet files, task-repo folders, Hugging Face
dataset names from the local cache, or the bundled set.

A dataset name (``"princeton-nlp/SWE-bench_Verified"``, ``"SWE-bench/SWE-bench_Lite"``) is read
from the local Hugging Face cache only, never downloaded, looked for in this order:

1. the hub cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``):
   ``datasets--<org>--<name>/snapshots/<revision>/**/<split>-*.parquet`` (or ``.jsonl`` /
   ``.json``), the revision ``refs/main`` names (else the newest snapshot);
2. the datasets cache (``$HF_DATASETS_CACHE``, else ``$HF_HOME/datasets``, else
   ``~/.cache/huggingface/datasets``): ``<org>___<name lowercased>/<config>/<version>/<hash>/
   *-<split>[-NNNNN-of-NNNNN].arrow`` (the newest such folder).

A folder saved with ``datasets``' ``save_to_disk`` (``state.json`` and ``data-*.arrow``; for a
``DatasetDict``, one such folder per split) is read too.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_DATASET_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_FILE_SUFFIXES = (".json", ".jsonl", ".parquet")

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
    if hasattr(value, "tolist"):  # third-party: numpy arrays from parquet
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
    # third-party: numpy scalars from parquet (hasattr below)
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


def _read_arrow(paths: list[Path]) -> list[dict[str, Any]]:
    """Rows of ``datasets`` arrow files (the streaming IPC format, or the file format)."""
    import pyarrow as pa

    rows: list[dict[str, Any]] = []
    for path in paths:
        with pa.memory_map(str(path), "r") as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                table = pa.ipc.open_file(source).read_all()
        rows += table.to_pylist()
    return rows


def _hf_home() -> Path:
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface"


def _split_files(folder: Path, split: str) -> list[Path]:
    """Files of ``split`` below ``folder`` (``<split>-00000-of-00001.parquet``, ``<split>.jsonl``)."""
    pattern = re.compile(rf"(^|[-_]){re.escape(split)}(-\d+-of-\d+)?\.(parquet|jsonl|json|arrow)$")
    return sorted(p for p in folder.rglob("*") if p.is_file() and pattern.search(p.name))


def _read_files(paths: list[Path]) -> list[dict[str, Any]]:
    arrow = [p for p in paths if p.suffix == ".arrow"]
    if arrow:
        return _read_arrow(arrow)
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows += read_rows(path)
    return rows


def hf_cache_candidates(name: str) -> list[Path]:
    """The folders where ``name``'s cached copy would be (hub cache, then datasets cache)."""
    org, _, repo = name.partition("/")
    hub = Path(os.environ.get("HF_HUB_CACHE") or _hf_home() / "hub")
    ds = Path(os.environ.get("HF_DATASETS_CACHE") or _hf_home() / "datasets")
    return [hub / f"datasets--{org}--{repo}", ds / f"{org}___{repo.lower()}"]


def read_hf_cached(name: str, split: str = "test") -> list[dict[str, Any]]:
    """Rows of dataset ``name``'s ``split`` from the local Hugging Face cache; never downloads."""
    hub_dir, ds_dir = hf_cache_candidates(name)
    snapshots = hub_dir / "snapshots"
    if snapshots.is_dir():
        ref = hub_dir / "refs" / "main"
        revision = ref.read_text().strip() if ref.is_file() else None
        folders = sorted((p for p in snapshots.iterdir() if p.is_dir()),
                         key=lambda p: (p.name == revision, p.stat().st_mtime), reverse=True)
        for folder in folders:
            files = _split_files(folder, split)
            if files:
                return _read_files(files)
    if ds_dir.is_dir():
        folders = sorted((p for p in ds_dir.glob("*/*/*") if p.is_dir()),
                         key=lambda p: p.stat().st_mtime, reverse=True)
        for folder in folders:
            files = [p for p in _split_files(folder, split) if p.suffix == ".arrow"]
            if files:
                return _read_arrow(files)
    raise InstanceError(
        f"dataset {name!r} (split {split!r}) is not in the local Hugging Face cache (looked in "
        f"{hub_dir} and {ds_dir}); nothing is downloaded here. Where a network exists run "
        f"`huggingface-cli download --repo-type dataset {name}` (or `datasets.load_dataset`) and "
        "copy the cache folder here (HF_HOME / HF_HUB_CACHE point at it), or save the split as "
        ".parquet / .jsonl and pass that path"
    )


def _read_saved_dataset(folder: Path, split: str | None) -> list[dict[str, Any]] | None:
    """Rows of a ``save_to_disk`` folder (a Dataset, or a DatasetDict's ``split``), else None."""
    if (folder / "state.json").is_file():
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        return _read_arrow([folder / f["filename"] for f in state.get("_data_files", [])])
    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        chosen = split or "test"
        if chosen not in splits:
            raise InstanceError(f"{folder}: no split {chosen!r} (it has {splits})")
        return _read_saved_dataset(folder / chosen, None)
    return None


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read raw rows from a json / jsonl / parquet file or a task-repo folder."""
    path = Path(path)
    if not path.exists():
        raise InstanceError(f"instance file {path} does not exist")
    if path.is_dir():
        if (path / "tasks").is_dir():
            return _read_task_repo(path)
        saved = _read_saved_dataset(path, None)
        if saved is not None:
            return saved
        raise InstanceError(
            f"{path} is a folder but neither a swebench task repo (no tasks/ in it) nor a saved "
            "dataset (no state.json)"
        )
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


def is_dataset_name(source: str | Path) -> bool:
    """Whether ``source`` names a Hugging Face dataset (``org/name``) rather than a path."""
    text = str(source)
    return (not Path(text).exists() and bool(_DATASET_NAME.match(text))
            and not text.lower().endswith(_FILE_SUFFIXES))


def load_instances(
    source: str | Path | Iterable[Mapping[str, Any]] | None,
    split: str | None = None,
    instance_ids: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """Rows from ``source``, checked.

    ``source``: a path (file or folder), a Hugging Face dataset name (local cache only, see the
    module docstring), a list of rows, or None for the bundled set. ``split``: for a dataset
    name or a saved ``DatasetDict`` (default ``test``). ``instance_ids``: keep only these rows
    (in the source's order); an id not in the source is an error.
    """
    if split is not None and (not isinstance(split, str) or not split):
        raise InstanceError(f"split must be a non-empty string, got {split!r}")
    base_dir = None
    if source is None:
        from bpo_envs.swebench.bundled import bundled_instances

        raw: list[Any] = bundled_instances()
    elif isinstance(source, str | Path) and is_dataset_name(source):
        raw = read_hf_cached(str(source), split or "test")
    elif isinstance(source, str | Path):
        path = Path(source)
        saved = _read_saved_dataset(path, split) if path.is_dir() else None
        if split is not None and saved is None:
            raise InstanceError(
                f"split={split!r} applies to a dataset name or a saved DatasetDict, not to {path}"
            )
        raw = saved if saved is not None else read_rows(source)
        base_dir = path.resolve()
        base_dir = base_dir if base_dir.is_dir() else base_dir.parent
    else:
        raw = list(source)
        base_dir = None
    if instance_ids is not None:
        wanted = [instance_ids] if isinstance(instance_ids, str) else list(instance_ids)
        present = {r.get("instance_id") for r in raw if isinstance(r, Mapping)}
        unknown = [i for i in wanted if i not in present]
        if unknown:
            raise InstanceError(f"instance_ids not in {source!r}: {unknown}")
        keep = set(wanted)
        raw = [r for r in raw if isinstance(r, Mapping) and r.get("instance_id") in keep]
    rows = [normalize_row(r, base_dir) for r in raw]
    if not rows:
        raise InstanceError(f"no instances in {source!r}")
    seen: set[str] = set()
    for row in rows:
        if row["instance_id"] in seen:
            raise InstanceError(f"duplicate instance_id {row['instance_id']!r}")
        seen.add(row["instance_id"])
    return rows


def check_disjoint(
    train: Iterable[Mapping[str, Any]], evaluation: Iterable[Mapping[str, Any]], *, disjoint_repos: bool = False, limit: int = 10
) -> None:
    """Raise :class:`InstanceError` when training and evaluation rows share an ``instance_id``
    (or, with ``disjoint_repos``, a ``repo``); the message names the first ``limit`` of them.

    Verified is an evaluation set: papers train on other rows (SWE-Gym, SWE-smith, R2E-Gym) and
    evaluate on Verified's 500; a row in both would be trained on and then graded."""
    train, evaluation = list(train), list(evaluation)
    shared = sorted({r["instance_id"] for r in train} & {r["instance_id"] for r in evaluation})
    if shared:
        more = f" and {len(shared) - limit} more" if len(shared) > limit else ""
        raise InstanceError(
            f"{len(shared)} instance(s) are both training and evaluation rows: {shared[:limit]}{more}; "
            "train on rows disjoint from the evaluation set (e.g. SWE-Gym or SWE-smith for Verified)"
        )
    if disjoint_repos:
        repos = sorted({r["repo"] for r in train} & {r["repo"] for r in evaluation})
        if repos:
            more = f" and {len(repos) - limit} more" if len(repos) > limit else ""
            raise InstanceError(
                f"--swe-disjoint-repos: {len(repos)} repo(s) have both training and evaluation rows: {repos[:limit]}{more}"
            )
