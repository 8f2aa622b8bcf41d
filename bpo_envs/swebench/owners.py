"""Who made a sandbox resource, and the clean-up of those whose maker is gone.

Every container and snapshot image of the docker backend carries the labels of the process that
made it (:func:`owner_labels`): ``bpo-gym.host`` (the host name), ``bpo-gym.pid``,
``bpo-gym.pid-start`` (the process's start time in clock ticks since boot, from
``/proc/<pid>/stat``, so a reused pid is not taken for the owner) and ``bpo-gym.run`` (a random
id per process). The local backend's files (its git object stores, working copies, the conda
shim, grading folders) live in one folder per process, ``$TMPDIR/bpo-gym-run-<pid>-<start>-<run>``
with an ``owner.json`` holding the same four fields, and its pids cgroups are named
``bpo-swe-<pid>-<start>-<hex>``; its sandbox processes are in those cgroups and name the run
folder in their command line (the ``/testbed`` bind).

:func:`clean_up` removes what belongs to a process of *this host* that is no longer running:
containers (``remove(force=True)``), snapshot images (``bpo-gym/swebench-snapshot:*``), run
folders, cgroups and the processes in them or bound to a dead run folder. A resource that lacks
any of the four labels, names another host, or whose owner still runs is never touched (so
neither another user's containers nor a labelled-alike one, nor instance images built as a
cache). The docker backend runs it when an env starts (at most once a minute per process), the
local backend when its first sandbox is made; ``bpo-gym-setup clean`` runs it on demand.

Not recovered: a process killed while another host's daemon runs its containers (it is not
this host's to judge), and processes of a dead run outside both its cgroups and its folder
(none exist: a sandbox command runs under ``bwrap --die-with-parent`` in a pid namespace).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bpo_envs.swebench.tree import remove_tree

log = logging.getLogger(__name__)

LABEL_KIND = "bpo-gym"
LABEL_HOST = "bpo-gym.host"
LABEL_PID = "bpo-gym.pid"
LABEL_START = "bpo-gym.pid-start"
LABEL_RUN = "bpo-gym.run"
OWNER_KEYS = (LABEL_HOST, LABEL_PID, LABEL_START, LABEL_RUN)
SNAPSHOT_REPO = "bpo-gym/swebench-snapshot"
RUN_DIR_PREFIX = "bpo-gym-run-"
CGROUP_PREFIX = "bpo-swe-"
CLEAN_EVERY_S = 60.0
"""How often (at most) an env start in one process runs the clean-up."""

_lock = threading.RLock()
_run: dict[int, tuple[str, Path | None]] = {}  # pid -> (run id, run folder): a fork is a new run
_last_clean: dict[str, float] = {}


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ")"
    return stat.rsplit(")", 1)[1].split()[19]


def run_id() -> str:
    """This process's run id (a new one in a forked child)."""
    pid = os.getpid()
    with _lock:
        if pid not in _run:
            _run[pid] = (uuid.uuid4().hex[:12], None)
        return _run[pid][0]


def owner_labels() -> dict[str, str]:
    """The labels naming this process as the owner (see the module docstring)."""
    pid = os.getpid()
    return {LABEL_HOST: socket.gethostname(), LABEL_PID: str(pid),
            LABEL_START: process_start(pid) or "", LABEL_RUN: run_id()}


def owner_state(labels: dict[str, str] | None) -> str:
    """``"foreign"`` (not made by this library on this host: never touched), ``"alive"`` or
    ``"dead"`` (its owner process is gone, or the pid now belongs to another process)."""
    labels = labels or {}
    if not all(labels.get(k) for k in OWNER_KEYS):
        return "foreign"
    if labels[LABEL_HOST] != socket.gethostname():
        return "foreign"
    try:
        pid = int(labels[LABEL_PID])
    except ValueError:
        return "foreign"
    if pid == os.getpid() and labels[LABEL_RUN] == run_id():
        return "alive"
    start = process_start(pid)
    return "alive" if start is not None and start == labels[LABEL_START] else "dead"


def run_dir() -> Path:
    """This process's folder for the local backend's files (made on first use)."""
    pid = os.getpid()
    rid = run_id()
    with _lock:
        path = _run[pid][1]
        if path is None or not path.is_dir():
            labels = owner_labels()
            path = Path(tempfile.gettempdir()) / f"{RUN_DIR_PREFIX}{pid}-{labels[LABEL_START]}-{rid}"
            path.mkdir(mode=0o700, exist_ok=True)
            (path / "owner.json").write_text(json.dumps(labels))
            _run[pid] = (rid, path)
            atexit.register(_remove_run_dir, path, pid)
        return path


def _remove_run_dir(path: Path, pid: int) -> None:
    if os.getpid() == pid:  # not from a forked child's exit
        remove_tree(path)  # any depth the agent made, never raising


def scratch_dir(prefix: str) -> Path:
    """A new folder in :func:`run_dir` (``tempfile.mkdtemp`` there)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=run_dir()))


@dataclass
class CleanReport:
    """What :func:`clean_up` removed (or, with ``dry_run``, would remove)."""

    containers: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    run_dirs: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    kept_alive: int = 0
    errors: list[str] = field(default_factory=list)

    def total(self) -> int:
        return (len(self.containers) + len(self.images) + len(self.run_dirs) + len(self.cgroups)
                + len(self.processes))

    def as_dict(self) -> dict[str, Any]:
        return {"containers": self.containers, "images": self.images, "run_dirs": self.run_dirs,
                "cgroups": self.cgroups, "processes": self.processes,
                "kept_alive": self.kept_alive, "errors": self.errors}


def _clean_docker(client: Any, report: CleanReport, dry_run: bool) -> None:
    import docker

    # the low-level listings: a container or image removed meanwhile cannot fail them
    for box in client.api.containers(all=True, filters={"label": LABEL_RUN}):
        state = owner_state(box.get("Labels"))
        if state == "alive":
            report.kept_alive += 1
        if state != "dead":
            continue
        name = (box.get("Names") or [box["Id"]])[0].lstrip("/")
        report.containers.append(name)
        if not dry_run:
            try:
                client.api.remove_container(box["Id"], force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                report.errors.append(f"container {name}: {exc}")
    for image in client.api.images(name=SNAPSHOT_REPO, filters={"label": LABEL_RUN}):
        state = owner_state(image.get("Labels"))
        if state == "alive":
            report.kept_alive += 1
        if state != "dead":
            continue
        tags = [t for t in image.get("RepoTags") or [] if t.startswith(SNAPSHOT_REPO + ":")]
        # only the snapshot tags: another tag on the same image is someone's name for it
        for tag in tags:
            report.images.append(tag)
            if not dry_run:
                try:
                    client.images.remove(tag, noprune=False)
                except docker.errors.ImageNotFound:
                    pass
                except docker.errors.APIError as exc:
                    report.errors.append(f"image {tag}: {exc}")


def _dir_owner(path: Path) -> dict[str, str] | None:
    try:
        return json.loads((path / "owner.json").read_text())
    except (OSError, ValueError):
        return None


def _name_owner(name: str, prefix: str) -> tuple[int, str] | None:
    """``(pid, start)`` from ``<prefix><pid>-<start>-<rest>``, or None."""
    parts = name[len(prefix):].split("-")
    if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), parts[1]


def _dead(pid: int, start: str) -> bool:
    if pid == os.getpid():
        return False
    return process_start(pid) != start


def _cgroup_parents() -> list[Path]:
    """Where the local sandbox makes its pids and memory cgroups (v1 roots, this process's own
    v1 memory group, its v2 group)."""
    parents = [Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/memory")]
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            number, controllers, where = line.split(":", 2)
            if number == "0":
                parents.append(Path("/sys/fs/cgroup") / where.lstrip("/"))
            elif "memory" in controllers.split(",") and where != "/":
                parents.append(Path("/sys/fs/cgroup/memory") / where.lstrip("/"))
    except (OSError, ValueError):
        pass
    return [p for p in parents if p.is_dir()]


def _kill(pids: list[int], report: CleanReport, dry_run: bool) -> None:
    for pid in pids:
        if pid in report.processes or pid == os.getpid():
            continue
        report.processes.append(pid)
        if not dry_run:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _clean_local(report: CleanReport, dry_run: bool) -> None:
    for parent in _cgroup_parents():
        for group in parent.glob(CGROUP_PREFIX + "*"):
            owner = _name_owner(group.name, CGROUP_PREFIX)
            if owner is None or not group.is_dir() or not _dead(*owner):
                continue
            report.cgroups.append(str(group))
            try:
                pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            _kill(pids, report, dry_run)
            if not dry_run:
                for _ in range(100):  # the kernel empties a cgroup shortly after its last kill
                    try:
                        group.rmdir()
                        break
                    except OSError:
                        time.sleep(0.02)
    dead_dirs = []
    for path in Path(tempfile.gettempdir()).glob(RUN_DIR_PREFIX + "*"):
        owner = _dir_owner(path)
        if owner is not None:
            if owner_state(owner) != "dead":
                continue
        else:  # owner.json unreadable: the name says who made it
            named = _name_owner(path.name, RUN_DIR_PREFIX)
            if named is None or not _dead(*named):
                continue
        dead_dirs.append(path)
    if dead_dirs:
        # processes still bound to a dead run's folder (a sandbox outside any cgroup)
        marks = [str(p).encode() for p in dead_dirs]
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if any(m in cmdline for m in marks):
                _kill([int(proc.name)], report, dry_run)
    for path in dead_dirs:
        report.run_dirs.append(str(path))
        if not dry_run:
            remove_tree(path)


def clean_up(*, docker: bool = True, local: bool = True, dry_run: bool = False,
             client: Any = None) -> CleanReport:
    """Remove the containers, snapshot images, local-sandbox folders, cgroups and processes whose
    owner process (on this host) is gone; see the module docstring for what is never touched.

    ``docker``: also the docker part (skipped, with a note in ``errors``, when no daemon
    answers); ``dry_run``: only report.
    """
    report = CleanReport()
    if local:
        _clean_local(report, dry_run)
    if docker:
        try:
            if client is None:
                import docker as docker_py

                client = docker_py.from_env(timeout=60)
                client.ping()
            _clean_docker(client, report, dry_run)
        except ImportError:
            report.errors.append("docker-py is not installed: the docker part was skipped")
        except Exception as exc:  # noqa: BLE001 - no daemon: nothing of it to clean now
            report.errors.append(f"docker part skipped: no Docker daemon answers ({exc})")
    if report.total() and not dry_run:
        log.info("removed what dead runs left: %d containers, %d snapshot images, %d folders, "
                 "%d cgroups, %d processes", len(report.containers), len(report.images),
                 len(report.run_dirs), len(report.cgroups), len(report.processes))
    return report


def clean_up_now_and_then(key: str, **kwargs: Any) -> CleanReport | None:
    """:func:`clean_up` unless this process ran it for ``key`` in the last ``CLEAN_EVERY_S``."""
    now = time.monotonic()
    with _lock:
        last = _last_clean.get(key)
        if last is not None and now - last < CLEAN_EVERY_S:
            return None
        _last_clean[key] = now
    try:
        return clean_up(**kwargs)
    except Exception:  # noqa: BLE001 - cleaning others' leftovers must never stop an env
        log.warning("the clean-up of dead runs failed", exc_info=True)
        return None
