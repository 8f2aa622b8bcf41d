"""Where ALFWorld games come from: the user's ALFWorld data, or the offline generator's cache.

Both use alfworld's layout: ``json_2.1.1/<split>/<task folder>/<trial>/game.tw-pddl`` with
``traj_data.json`` beside it. A task id is ``"<task folder>/<trial>"`` relative to the split
folder, so it is the same in every process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bpo_envs.alfworld._upstream import cache_root, upstream
from bpo_envs.alfworld.game_index import GAME_FILE, TRAJ_FILE, game_digest, load_index
from bpo_envs.alfworld.generator import (
    GENERATOR_VERSION,
    GENERATOR_VERSIONS,
    SPLITS,
    TASK_TYPES,
    GenerationFailed,
    generate_problem,
)
from bpo_envs.alfworld.verify import PLANNER_TIMEOUT_S, worker

log = logging.getLogger(__name__)

_GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")
MAX_ATTEMPTS = 200


def _check_task_types(task_types: Sequence[str] | None) -> tuple[str, ...]:
    if task_types is None:
        return TASK_TYPES
    if isinstance(task_types, str):
        task_types = (task_types,)
    bad = [t for t in task_types if t not in TASK_TYPES]
    if bad or not task_types:
        raise ValueError(f"task_types must be a non-empty subset of {TASK_TYPES}, got {list(task_types)}")
    return tuple(t for t in TASK_TYPES if t in task_types)


def read_game(path: Path) -> dict[str, Any]:
    """Read a ``game.tw-pddl`` file; raise ``FileNotFoundError``/``ValueError`` naming ``path``."""
    if not path.is_file():
        raise FileNotFoundError(f"ALFWorld game file not found: {path}")
    try:
        game = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed ALFWorld game file {path}: {exc}") from exc
    if not isinstance(game, dict):
        raise ValueError(f"malformed ALFWorld game file {path}: expected a JSON object")
    missing = [k for k in _GAME_KEYS if not isinstance(game.get(k), str)]
    if missing:
        raise ValueError(f"malformed ALFWorld game file {path}: missing or non-text {missing}")
    return game


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _fill_goal(game: dict[str, Any], traj: dict[str, Any], task_id: str) -> dict[str, Any]:
    """alfworld's ``add_task_to_grammar`` with the template picked by the task id, not by the
    unseeded global ``random``."""
    if "UNKNOWN GOAL" not in game["grammar"]:
        return game
    params = traj.get("pddl_params") or {}
    kind = traj.get("task_type", "") + ("_slice" if params.get("object_sliced") else "")
    templates = upstream()["goal_library"].gdict.get(kind, {}).get("templates")
    if not templates:
        raise ValueError(f"traj_data for {task_id} has an unknown task_type {kind!r}")
    pick = int(hashlib.blake2b(task_id.encode(), digest_size=4).hexdigest(), 16) % len(templates)
    goal = templates[pick].format(
        obj=str(params.get("object_target", "")).lower(),
        recep=str(params.get("parent_target", "")).lower(),
        toggle=str(params.get("toggle_target", "")).lower(),
        mrecep=str(params.get("mrecep_target", "")).lower(),
    )
    return dict(game, grammar=game["grammar"].replace("UNKNOWN GOAL", goal))


def _listing(root: Path, task_types: tuple[str, ...]) -> tuple[list[str], int]:
    """The playable games under a split folder, as alfworld's ``collect_game_files`` lists them:
    not ``movable``/``Sliced`` task folders, of the wanted task type (``traj_data.json``'s, else
    the folder name's), and marked ``solvable: true`` in ``game.tw-pddl`` (a game without the key
    or marked false is skipped). Returns ``(task ids, number skipped as unsolvable)``."""
    ids, unsolvable = [], 0
    for game_path in sorted(root.glob(f"*/*/{GAME_FILE}")):
        task_dir = game_path.parent.parent.name
        if "movable" in task_dir or "Sliced" in task_dir:
            continue  # alfworld skips these too
        task_type = task_dir.split("-", 1)[0]
        traj_path = game_path.parent / TRAJ_FILE
        if traj_path.is_file():
            try:
                task_type = json.loads(traj_path.read_text()).get("task_type", task_type)
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
                raise ValueError(f"malformed {traj_path}: {exc}") from exc
        if task_type not in task_types:
            continue
        if read_game(game_path).get("solvable") is not True:
            unsolvable += 1
            continue
        ids.append(f"{task_dir}/{game_path.parent.name}")
    return ids, unsolvable


_LISTINGS: dict[tuple[str, tuple[str, ...], int], tuple[list[str], int]] = {}
_LISTINGS_LOCK = threading.Lock()


class DataGames:
    """Games from an ALFWorld data folder (``$ALFWORLD_DATA`` or its ``json_2.1.1`` child).

    Only games marked solvable are listed (see :func:`_listing`); the listing is read once per
    process and folder (again when the split folder's entries change).
    """

    def __init__(self, data_dir: str | os.PathLike, split: str, task_types: Sequence[str] | None) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        base = Path(data_dir).expanduser()
        root = base / "json_2.1.1" if (base / "json_2.1.1").is_dir() else base
        self.root = (root / split).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(
                f"no ALFWorld split folder {root / split} (expected {base}/json_2.1.1/{split}/"
                f"<task>/<trial>/{GAME_FILE})"
            )
        self.split = split
        self.task_types = _check_task_types(task_types)
        key = (str(self.root), self.task_types, self.root.stat().st_mtime_ns)
        with _LISTINGS_LOCK:
            if key not in _LISTINGS:
                _LISTINGS[key] = _listing(self.root, self.task_types)
            ids, self.unsolvable = _LISTINGS[key]
        if self.unsolvable:
            log.info("ALFWorld: skipped %d games not marked solvable under %s", self.unsolvable, self.root)
        if not ids:
            raise FileNotFoundError(
                f"no solvable {GAME_FILE} games of types {list(self.task_types)} under {self.root}"
                + (f" ({self.unsolvable} not marked solvable)" if self.unsolvable else "")
            )
        self._ids = list(ids)
        self.identity = ("data", str(self.root), self.task_types)

    def provenance(self) -> dict[str, Any]:
        """The data folder, a SHA-256 of every listed game's files, the split and counts."""
        from bpo_envs.provenance import hash_files

        files = []
        for task_id in self._ids:
            files.append(self.root / task_id / GAME_FILE)
            if (self.root / task_id / TRAJ_FILE).is_file():
                files.append(self.root / task_id / TRAJ_FILE)
        return {
            "data_source": "data_dir",
            "data_dir": str(self.root.parent),
            "files_sha256": hash_files(files, root=self.root),
            "split": self.split,
            "task_count": len(self._ids),
            "skipped_unsolvable": self.unsolvable,
            "task_types": list(self.task_types),
        }

    def task_ids(self) -> list[str]:
        return list(self._ids)

    def task_type(self, task_id: str) -> str:
        return task_id.split("-", 1)[0]

    def game_path(self, task_id: str) -> Path:
        """The task's ``game.tw-pddl`` (its ``traj_data.json``, where there is one, is beside it)."""
        return self.root / task_id / GAME_FILE

    def game(self, task_id: str) -> dict[str, Any]:
        folder = self.root / task_id
        game = read_game(folder / GAME_FILE)
        if game.get("solvable") is not True:
            raise ValueError(f"{folder / GAME_FILE} is not marked solvable")
        traj_path = folder / TRAJ_FILE
        traj: dict[str, Any] = {}
        if traj_path.is_file():
            try:
                traj = json.loads(traj_path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ValueError(f"malformed {traj_path}: {exc}") from exc
        elif "UNKNOWN GOAL" in game["grammar"]:
            raise FileNotFoundError(f"{traj_path} is missing and {folder / GAME_FILE} has no goal text")
        return _fill_goal(game, traj, task_id)


class GeneratedGames:
    """Games from the offline generator, cached on disk in alfworld's layout.

    Task ``"<task_type>/<index>"`` is made the first time it is asked for and read from the cache
    afterwards: rebuilt from the shipped game index where it lists the game (:mod:`.game_index`:
    about 3 ms), else generated and checked by the planner (0.2-15 s, at most about 2 minutes). Every cached game was solved by
    Fast Downward and does not hold its goal at the start. The cache folder names the generator
    version and seed, not ``planner_timeout``: the limit is a safety net that the problem-size
    bound keeps from firing (:mod:`.verify`); :attr:`rejected` counts this process's rejected
    attempts by reason, and a timeout is also logged.
    """

    def __init__(
        self, split: str, task_types: Sequence[str] | None, games_per_type: int, seed: int,
        version: int = GENERATOR_VERSION, planner_timeout: float = PLANNER_TIMEOUT_S,
    ) -> None:  # fmt: skip
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if isinstance(games_per_type, bool) or not isinstance(games_per_type, int) or games_per_type < 1:
            raise ValueError(f"games_per_type must be a positive int, got {games_per_type!r}")
        self.split = split
        self.seed = int(seed)
        self.task_types = _check_task_types(task_types)
        self.games_per_type = games_per_type
        if isinstance(version, bool) or version not in GENERATOR_VERSIONS:
            raise ValueError(f"generator_version must be one of {GENERATOR_VERSIONS}, got {version!r}")
        self.version = int(version)
        if isinstance(planner_timeout, bool) or not isinstance(planner_timeout, (int, float)) or not planner_timeout > 0:
            raise ValueError(f"planner_timeout must be a positive number of seconds, got {planner_timeout!r}")
        self.planner_timeout = float(planner_timeout)
        self.rejected: Counter = Counter()
        self.made: Counter = Counter()
        """Games this object wrote to the cache, by how: ``index`` (rebuilt) or ``planner``."""
        self.index = load_index(self.version, self.seed)
        self.root = cache_root() / f"generated-v{self.version}" / f"seed{self.seed}" / "json_2.1.1" / split
        self._ids = [f"{t}/{i:04d}" for t in self.task_types for i in range(games_per_type)]
        self._lock = threading.Lock()
        self.identity = ("generated", self.version, self.seed, split, self.task_types, games_per_type)

    def task_ids(self) -> list[str]:
        return list(self._ids)

    def task_type(self, task_id: str) -> str:
        return task_id.split("/", 1)[0]

    def provenance(self) -> dict[str, Any]:
        """The generator (module, version, seed), the split and counts."""
        return {
            "data_source": "bundled-generator",
            "generator": "bpo_envs.alfworld.generator",
            "generator_version": self.version,
            "generator_seed": self.seed,
            "games_per_type": self.games_per_type,
            "planner_timeout_s": self.planner_timeout,
            "planner_timeouts": self.rejected["timeout"],
            "game_index": None if self.index is None else {"file": self.index.path.name, "games": self.index.count(self.split)},
            "split": self.split,
            "task_count": len(self._ids),
            "task_types": list(self.task_types),
        }

    def game_path(self, task_id: str) -> Path:
        """The task's ``game.tw-pddl`` in the cache (with ``traj_data.json`` beside it), made first
        if it is not there yet."""
        path = self.root / task_id / GAME_FILE
        if not path.is_file():
            self.game(task_id)
        return path

    def game(self, task_id: str) -> dict[str, Any]:
        """The game ``task_id``: from the cache; else rebuilt from the shipped game index
        (:mod:`.game_index`, milliseconds); else generated and planner-checked (seconds). A cached
        game that is damaged, or that is not the game the index records (a cache written by
        another generator version), is rebuilt, with a warning that says so."""
        path = self.root / task_id / GAME_FILE
        entry = self.index.entry(self.split, task_id) if self.index is not None else None
        start_ns = time.time_ns()
        if path.is_file():
            try:
                game = read_game(path)
            except ValueError as exc:
                log.warning("ALFWorld: the cached game %s is damaged (%s): rebuilding it", path, exc)
            else:
                if entry is None or game_digest(game) == entry["sha256"]:
                    return game
                log.warning(
                    "ALFWorld: the cached game %s is not the one the game index %s records (a cache written by "
                    "another generator version?): rebuilding it from the index", path, self.index.path,
                )
        task_type, index = task_id.split("/", 1)
        with self._lock, _game_lock(path.parent):
            if path.is_file() and path.stat().st_mtime_ns > start_ns:  # made by another process meanwhile
                return read_game(path)
            if entry is not None:
                game, traj = self.index.rebuild(self.split, task_id)
                self.made["index"] += 1
            else:
                game, traj = make_verified_game(
                    task_type, self.split, int(index), self.seed, self.version, self.planner_timeout, self.rejected
                )
                self.made["planner"] += 1
            _write_json(path.parent / TRAJ_FILE, traj)
            _write_json(path, game)
        return game


@contextlib.contextmanager
def _game_lock(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder/.lock``, waiting for it: two processes that need the same
    game (a run and ``scripts/alfworld_pack_games.py``) make it once, not twice."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def make_verified_game(
    task_type: str, split: str, index: int, seed: int = 0, version: int = GENERATOR_VERSION,
    planner_timeout: float = PLANNER_TIMEOUT_S, rejected: Counter | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """Generate game ``index`` and check it with the planner (:mod:`.verify`): not won at the
    start, and the planner's plan, played command by command, wins. Attempts that fail are
    counted in ``rejected`` by reason (``generation_failed`` or a verdict of :data:`.verify.VERDICTS`)
    and the next ``attempt`` is drawn. Returns ``(game, traj_data)``; ``traj_data["generator"]``
    records the attempt kept and the rejections before it."""
    counts: Counter = Counter()
    for attempt in range(MAX_ATTEMPTS):
        try:
            problem = generate_problem(task_type, split, index, seed, attempt, version)
        except GenerationFailed:
            counts["generation_failed"] += 1
            continue
        game = problem.game()
        verdict = worker().verify(game, f"v{version}:seed{seed}:{split}:{task_type}:{index}:{attempt}", planner_timeout)
        if verdict.status != "solved":
            counts[verdict.status] += 1
            continue
        game["solvable"] = True
        game["walkthrough"] = verdict.plan
        traj = dict(problem.traj_data)
        traj["generator"] = dict(traj["generator"], rejected=dict(sorted(counts.items())), planner_timeout=planner_timeout)
        if rejected is not None:
            rejected.update(counts)
        return game, traj
    if rejected is not None:
        rejected.update(counts)
    raise RuntimeError(
        f"could not generate a solvable {task_type} game #{index} in {MAX_ATTEMPTS} attempts ({dict(counts)})"
    )
