"""The shipped index of generated ALFWorld games: planner-checked games rebuilt in milliseconds.

The generator (:mod:`.generator`) is pure, so a game is fixed by ``(version, seed, split, task
type, index, attempt)``; what is slow is finding the attempt that Fast Downward solves (about
1.8 s a game on one core, minutes for a few). The index records, for every game generated here
once, the attempt the planner accepted, its plan, the attempts rejected before it and a SHA-256
of the game's text. :class:`~.games.GeneratedGames` rebuilds an indexed game from it (about
3 ms, no planner) and checks the digest, so a game from the index is byte for byte the game the
planner checked here.

File: ``bpo_envs/alfworld/data/games-v<version>-seed<seed>.json.gz``, gzipped JSON::

    {"format": "bpo-alfworld-game-index/1", "generator_version": 3, "seed": 0,
     "engine": {"alfworld": "0.4.2", ...}, "checksum": "<sha256 of the canonical games JSON>",
     "games": {"<split>": {"<task_type>/<index>": {"attempt": 0, "sha256": "...",
                                                  "walkthrough": [...], "rejected": {...}}}}}

Errors are loud, never a silent mix: a file that is not gzip JSON of this format, whose
checksum does not match its games, or that names another version or seed raises
:class:`GameIndexError`; a rebuilt game whose digest differs (the generator or the alfworld
wheel it reads rooms and templates from changed since the index was written) raises
:class:`GameIndexMismatch`, which says how to regenerate (``scripts/alfworld_pack_games.py``)
or to bypass the index (``BPO_ALFWORLD_INDEX=0``: every game generated and planner-checked).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

INDEX_FORMAT = "bpo-alfworld-game-index/1"
GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
DATA_DIR = Path(__file__).parent / "data"


class GameIndexError(ValueError):
    """The game index file is damaged or is not the index asked for."""


class GameIndexMismatch(GameIndexError):
    """A game rebuilt from the index is not the game the index recorded."""


def game_digest(game: Mapping[str, Any]) -> str:
    """SHA-256 over the game's three texts (domain, grammar with the goal, problem)."""
    digest = hashlib.sha256()
    for key in ("pddl_domain", "grammar", "pddl_problem"):
        digest.update(str(game[key]).encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def _checksum(games: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(games, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def index_path(version: int, seed: int) -> Path:
    """The shipped index of generator ``version`` and ``seed`` (it may not exist)."""
    return DATA_DIR / f"games-v{int(version)}-seed{int(seed)}.json.gz"


def _engine_versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("alfworld", "textworld", "fast-downward-textworld"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "?"
    return out


class GameIndex:
    """A loaded, checked index (see the module docstring)."""

    def __init__(self, data: Mapping[str, Any], path: Path, version: int, seed: int) -> None:
        if not isinstance(data, Mapping) or data.get("format") != INDEX_FORMAT:
            raise GameIndexError(f"{path} is not an ALFWorld game index (format {INDEX_FORMAT!r})")
        if data.get("generator_version") != version or data.get("seed") != seed:
            raise GameIndexError(
                f"{path} indexes generator v{data.get('generator_version')} seed {data.get('seed')}, not v{version} seed {seed}"
            )
        games = data.get("games")
        if not isinstance(games, Mapping) or _checksum(games) != data.get("checksum"):
            raise GameIndexError(f"{path} is damaged: its games do not match its checksum")
        self.path, self.version, self.seed = path, version, seed
        self.engine: dict[str, str] = dict(data.get("engine") or {})
        self._games: dict[str, dict[str, Any]] = {split: dict(entries) for split, entries in games.items()}

    def entry(self, split: str, task_id: str) -> dict[str, Any] | None:
        """The recorded game ``task_id`` of ``split``, or None when the index lacks it."""
        return self._games.get(split, {}).get(task_id)

    def count(self, split: str) -> int:
        """How many games of ``split`` the index holds."""
        return len(self._games.get(split, {}))

    def rebuild(self, split: str, task_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The indexed game and its ``traj_data``, generated from the recorded attempt without the
        planner; raises :class:`GameIndexMismatch` when the text differs from the recorded one."""
        from bpo_envs.alfworld.generator import GenerationFailed, generate_problem

        entry = self.entry(split, task_id)
        if entry is None:
            raise KeyError(f"{task_id} of {split} is not in the game index {self.path}")
        task_type, index = task_id.split("/", 1)
        try:
            problem = generate_problem(task_type, split, int(index), self.seed, int(entry["attempt"]), self.version)
            game = problem.game()
        except GenerationFailed as exc:
            game, problem = None, exc
        if game is None or game_digest(game) != entry["sha256"]:
            raise GameIndexMismatch(
                f"ALFWorld {split} game {task_id} rebuilt from the game index {self.path} is not the game the "
                f"index recorded (generator or alfworld changed since it was written: index made with "
                f"{self.engine}, this process has {_engine_versions()}). Regenerate the index with "
                f"scripts/alfworld_pack_games.py, or set BPO_ALFWORLD_INDEX=0 to generate and planner-check every game"
            )
        game["solvable"] = True
        game["walkthrough"] = list(entry["walkthrough"])
        traj = dict(problem.traj_data)
        traj["generator"] = dict(traj["generator"], rejected=dict(entry.get("rejected") or {}),
                                 planner_timeout=entry.get("planner_timeout"), from_index=True)  # fmt: skip
        return game, traj


def index_enabled() -> bool:
    """False when ``$BPO_ALFWORLD_INDEX`` is ``0``: every game is generated and planner-checked."""
    return os.environ.get("BPO_ALFWORLD_INDEX", "1") != "0"


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int, version: int, seed: int) -> GameIndex:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GameIndexError(f"{path} is damaged ({type(exc).__name__}: {exc}); reinstall the package or regenerate it") from exc
    return GameIndex(data, Path(path), version, seed)


def load_index(version: int, seed: int, path: Path | None = None) -> GameIndex | None:
    """The index of ``version`` and ``seed`` (``path``: another file than the shipped one), or
    None when there is none or :func:`index_enabled` is off; raises :class:`GameIndexError` for a
    damaged one."""
    path = index_path(version, seed) if path is None else Path(path)
    if not index_enabled() or not path.is_file():
        return None
    return _load(str(path), path.stat().st_mtime_ns, int(version), int(seed))


def write_index(path: Path, root: Path, wanted: Mapping[str, Sequence[str]], version: int, seed: int) -> dict[str, Any]:
    """Write the index of the cached games ``wanted`` (``{split: task ids}``) found under
    ``root`` (a ``GeneratedGames`` cache's ``json_2.1.1`` folder); every one must be there,
    planner-checked. Returns a summary (games per split, bytes)."""
    games: dict[str, dict[str, Any]] = {}
    for split, ids in wanted.items():
        entries = games.setdefault(split, {})
        for task_id in ids:
            folder = root / split / task_id
            game = json.loads((folder / GAME_FILE).read_text())
            meta = json.loads((folder / TRAJ_FILE).read_text())["generator"]
            if game.get("solvable") is not True or meta.get("version") != version or meta.get("seed") != seed:
                raise ValueError(f"{folder} is not a planner-checked v{version} seed {seed} game")
            entries[task_id] = {
                "attempt": int(meta["attempt"]), "sha256": game_digest(game), "walkthrough": list(game["walkthrough"]),
                "rejected": dict(meta.get("rejected") or {}), "planner_timeout": meta.get("planner_timeout"),
            }  # fmt: skip
    data = {"format": INDEX_FORMAT, "generator_version": version, "seed": seed, "engine": _engine_versions(),
            "checksum": _checksum(games), "games": games}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.GzipFile(tmp, "wb", mtime=0) as f:  # mtime=0: the same games give the same bytes
        f.write(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
    os.replace(tmp, path)
    return {"path": str(path), "bytes": path.stat().st_size, "games": {s: len(e) for s, e in games.items()}}
