"""The local backend: a working copy per env, commands under bubblewrap, git-object snapshots.

Sandbox (one ``bwrap`` per command, so nothing an agent starts outlives its step): tmpfs root,
read-only binds of ``/usr``, ``/etc`` and the Python in use (its venv and base prefix, with this
package's own directory hidden), the host's secrets in ``/etc`` bound over with an empty file or
folder (:func:`host_secrets`: what other users may not read, the shadows, sudoers, keys and
credential stores; ``passwd``, ``group``, the resolver and ``/etc/alternatives`` stay), a fresh tmpfs ``/tmp`` per command, ``/testbed`` bound
read-write, every namespace unshared (no network but loopback), all capabilities dropped, the
root remounted read-only. ``/opt/miniconda3/bin/activate`` is a shim so that swebench's eval
scripts (which ``conda activate testbed``) run unchanged with the Python in use.

Snapshots: the working tree and, separately, ``/testbed/.git`` are written as git trees into a
bare object store outside the sandbox (shared by the envs of one kind in this process), through
index files that act as stat caches, so a snapshot hashes only what changed. Restore is
``read-tree --reset -u`` plus ``clean``: byte-identical contents, deletions, new files, ignored
files, symlinks, the executable bit and empty directories. Not captured: other permission bits,
ownership, timestamps, nested git repositories (stored as gitlinks), FIFOs, sockets and device
files (git records none; the host never opens one), and processes (none survive a step anyway).

The host's side of a step (docs/reliability.md#the-host-side-of-a-step): after each command the
testbed is measured (``bpo_envs.swebench.tree``: no recursion, no link followed) and recorded in
the store within the step's timeout (git is killed past it); a testbed over the disk quota, with
a path longer than ``MAX_PATH_BYTES``, or that git cannot record in time is restored to its state
before the command and the observation says so. So a snapshot never reads more than the quota
allows, and a restore first removes what the agent changed (by ``ctime``) instead of reading it.
Portable bytes whose empty folders lie below one of the state's own links are refused, naming the
path, and empty folders are made one level at a time without following a link.

Limits (``SandboxLimits``, one set per env; each a ``SWEBenchEnv`` kwarg):

* enforced per process, by ``prlimit`` on the ``bwrap`` command: CPU time (``RLIMIT_CPU``: the
  process gets SIGXCPU, then SIGKILL), address space (``RLIMIT_AS``: allocations fail with
  ENOMEM / MemoryError), largest file (``RLIMIT_FSIZE``: writes past it fail with SIGXFSZ/EFBIG)
  and ``RLIMIT_NPROC`` (which the kernel ignores for root, so it only counts for a non-root host
  user);
* processes, for the whole command: a pids cgroup (v1 ``/sys/fs/cgroup/pids`` or a delegated v2
  one) with ``pids.max``; forks past it fail with EAGAIN. Without a writable pids cgroup
  (``BwrapSandbox.cgroup`` is None) only the step timeout and the kill below bound a fork bomb;
* disk: ``/tmp`` and ``/dev/shm`` are tmpfs mounts of ``disk_quota_bytes`` each, and
  ``/testbed`` may grow by ``disk_quota_bytes`` over the task's initial checkout (allocated
  blocks, hard links once): checked every second during a command (which is killed when over)
  and after it; a command that leaves the testbed over quota is undone (the working copy is
  restored to its state before the command) and the observation says so. Growth inside one
  second is bounded by ``RLIMIT_FSIZE`` per file and the disk speed;
* nothing outlives its step: ``--unshare-pid`` (the command's processes die with the namespace's
  init), ``--die-with-parent``, the process group killed on timeout, and every process left in
  the command's pids cgroup killed when the step ends (``setsid``/``nohup``/double forks stay in
  both the namespace and the cgroup).

* memory, for the whole command: a memory cgroup (``MemoryCgroup``: v2 ``memory.max`` where a
  delegated v2 hierarchy has the memory controller, else v1 ``memory.limit_in_bytes`` and
  ``memory.memsw.limit_in_bytes``) of ``memory_bytes``; past it the kernel's OOM killer kills
  inside the group and the observation says so. Without a writable memory cgroup
  (``BwrapSandbox.memory`` is None) only ``RLIMIT_AS`` bounds memory, per process;
* the host's OOM killer takes the sandbox first: ``oom_score_adj`` 1000 for every process in it;
* no new user namespaces (``--unshare-user --disable-userns``): ``unshare -U`` fails inside;
* the disk quota counts every entry as at least ``INODE_BYTES`` (inodes cost space), a file at
  its apparent size when that is more than its allocated blocks (a sparse 1 GiB file costs
  1 GiB: reading it costs that much), and a folder the host cannot read as over quota
  (``UNREADABLE``).

Not limited: disk bandwidth, CPU shares.

Snapshot storage: a snapshot's state is kept in the store until ``release()``; every
``ObjectStore.PRUNE_EVERY`` releases, loose objects no kept state, initial checkout or live
working copy reaches (and older than ``PRUNE_GRACE``) are deleted.

Ownership: every file of this backend lives in the process's run folder and every cgroup is
named after its process (``bpo_envs.swebench.owners``); making a sandbox removes what dead
processes left (folders, cgroups and any process still in them).
"""

from __future__ import annotations

import atexit
import math
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from bpo_envs.core import SnapshotError
from bpo_envs.swebench._git import GitError, GitTimeoutError, git, git_text, require_git
from bpo_envs.swebench.harness import CONDA_SHIM
from bpo_envs.swebench.output import CommandResult, OutputCollector
from bpo_envs.swebench.owners import (
    CGROUP_PREFIX,
    clean_up_now_and_then,
    process_start,
    scratch_dir,
)
from bpo_envs.swebench.tree import (  # noqa: F401 - the quota's units, re-exported
    INODE_BYTES,
    MAX_PATH_BYTES,
    UNREADABLE,
    Trash,
    TreeScan,
    disk_usage,
    largest_files,
    remove_tree,
    scan_tree,
    scrub_changed,
)

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class SandboxLimits:
    """Per-command resource limits of the sandbox (see the module docstring for where each is
    enforced).

    Args:
        cpu_seconds: CPU seconds one process may use (``RLIMIT_CPU``); None: the step timeout
            rounded up (the grading run gets at least its own timeout).
        memory_bytes: address space of one process (``RLIMIT_AS``; docker: the container's
            memory limit).
        max_processes: processes and threads of one command together (pids cgroup; docker:
            ``pids_limit``).
        max_file_bytes: the largest file a process may write (``RLIMIT_FSIZE``).
        disk_quota_bytes: how much ``/testbed`` may grow over the task's initial checkout, and the
            size of the ``/tmp`` and ``/dev/shm`` tmpfs mounts (local backend only).
        cpus: docker: the container's CPU quota in CPUs (``nano_cpus``); the local backend does
            not limit CPU shares (``cpu_seconds`` bounds each process).
    """

    cpu_seconds: int | None = None
    memory_bytes: int = 4 << 30
    max_processes: int = 512
    max_file_bytes: int = 1 << 30
    disk_quota_bytes: int = 2 << 30
    cpus: float = 1.0

    def __post_init__(self) -> None:
        if (not isinstance(self.cpus, int | float) or isinstance(self.cpus, bool)
                or not 0.01 <= self.cpus <= 1024):
            raise ValueError(f"cpus must be a number of CPUs in [0.01, 1024], got {self.cpus!r}")
        if self.cpu_seconds is not None and (
            not isinstance(self.cpu_seconds, int) or isinstance(self.cpu_seconds, bool)
            or self.cpu_seconds < 1
        ):
            raise ValueError(f"cpu_seconds must be None or an int >= 1, got {self.cpu_seconds!r}")
        for name, low in (("memory_bytes", 64 << 20), ("max_processes", 8),
                          ("max_file_bytes", 1 << 20), ("disk_quota_bytes", 1 << 20)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")

    def cpu_for(self, timeout: float) -> int:
        return self.cpu_seconds if self.cpu_seconds is not None else max(1, math.ceil(timeout))


class PidsCgroup:
    """A pids cgroup that caps a command's processes and lets the host kill all of them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.procs = path / "cgroup.procs"

    @classmethod
    def create(cls, max_pids: int) -> PidsCgroup | None:
        """A new cgroup with ``pids.max``; None when no writable pids hierarchy exists."""
        name = f"{CGROUP_PREFIX}{os.getpid()}-{process_start(os.getpid())}-{uuid.uuid4().hex[:8]}"
        parents = [Path("/sys/fs/cgroup/pids")]
        try:
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                if line.startswith("0::"):
                    v2 = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
                    if "pids" in (v2 / "cgroup.subtree_control").read_text().split():
                        parents.append(v2)
        except OSError:
            pass
        for parent in parents:
            if not (parent / "cgroup.procs").exists():
                continue
            path = parent / name
            try:
                path.mkdir()
                (path / "pids.max").write_text(str(max_pids))
            except OSError:
                cls._rmdir(path)
                continue
            group = cls(path)
            atexit.register(group.remove)
            return group
        return None

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except OSError:
            return []

    def kill_all(self, wait: float = 5.0) -> None:
        deadline = time.monotonic() + wait
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    @staticmethod
    def _rmdir(path: Path) -> None:
        try:
            path.rmdir()
        except OSError:
            pass

    def remove(self) -> None:
        self.kill_all(1.0)
        self._rmdir(self.path)


class MemoryCgroup:
    """A memory cgroup capping all of a command's processes together: RAM, and swap where the
    kernel accounts it. Past the limit the kernel's OOM killer kills inside the group only.

    cgroup v2 (``memory.max``, ``memory.swap.max``) where a delegated v2 hierarchy has the
    memory controller, else cgroup v1 (``memory.limit_in_bytes``,
    ``memory.memsw.limit_in_bytes``), in this process's own memory cgroup or the hierarchy's
    root; None when neither can be written (the per-process ``RLIMIT_AS`` is then all that
    bounds memory: see the module docstring)."""

    def __init__(self, path: Path, version: int) -> None:
        self.path = path
        self.version = version
        self.procs = path / "cgroup.procs"

    @classmethod
    def create(cls, limit: int) -> MemoryCgroup | None:
        name = f"{CGROUP_PREFIX}{os.getpid()}-{process_start(os.getpid())}-{uuid.uuid4().hex[:8]}-mem"
        candidates: list[tuple[Path, int]] = []
        try:
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                number, controllers, where = line.split(":", 2)
                if number == "0":
                    v2 = Path("/sys/fs/cgroup") / where.lstrip("/")
                    if "memory" in (v2 / "cgroup.subtree_control").read_text().split():
                        candidates.append((v2, 2))
                elif "memory" in controllers.split(","):
                    candidates.append((Path("/sys/fs/cgroup/memory") / where.lstrip("/"), 1))
        except (OSError, ValueError):
            pass
        candidates.append((Path("/sys/fs/cgroup/memory"), 1))
        files = {2: ("memory.max", "memory.swap.max"), 1: ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")}
        for parent, version in candidates:
            if not (parent / "cgroup.procs").exists():
                continue
            path = parent / name
            try:
                path.mkdir()
                (path / files[version][0]).write_text(str(limit))
            except OSError:
                PidsCgroup._rmdir(path)
                continue
            try:  # no swap beyond the limit (v2: none at all; v1: memory + swap <= limit)
                (path / files[version][1]).write_text("0" if version == 2 else str(limit))
            except OSError:
                pass  # the kernel does not account swap (or there is none)
            group = cls(path, version)
            atexit.register(group.remove)
            return group
        return None

    def oom_kills(self) -> int:
        """Processes the OOM killer has killed in this group so far."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        for _ in range(100):  # the kernel empties a group shortly after its processes die
            if not self.procs.exists() or not self.procs.read_text().split():
                break
            time.sleep(0.01)
        PidsCgroup._rmdir(self.path)


def require_bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        from bpo_envs.system import MissingPartError

        raise MissingPartError(
            "the local SWE-bench backend runs commands under bubblewrap, which is not installed: "
            "apt-get install bubblewrap (or run bpo-gym-setup swebench)", "swebench"
        )
    return path


def _python_dirs(python: str) -> list[str]:
    """Directories that make ``python`` (and its venv) work inside the sandbox."""
    out = subprocess.run(
        [python, "-c", "import sys, os; print(sys.prefix); print(sys.base_prefix); "
         "print(os.path.dirname(os.path.realpath(sys.executable)))"],
        capture_output=True, text=True, check=True,
    ).stdout.split("\n")
    dirs: list[str] = []
    for d in out[:3]:
        d = os.path.realpath(d.strip()) if d.strip() else ""
        if d and not d.startswith(("/usr/", "/etc/")) and d not in ("/usr", "/") and d not in dirs:
            dirs.append(d)
    return dirs


SECRET_NAMES = ("shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d", "opasswd", "private",
                "krb5.keytab", "key.json", "credentials", "credstore", "credstore.encrypted", "secrets")
"""Names under ``/etc`` the sandbox never sees, whatever their mode (the password and group
shadows, sudo's rules, TLS and Kerberos keys, credential stores)."""
SECRET_SUFFIXES = ("_key", ".key", ".keytab", ".pem-key", ".secret", ".token")
"""Name endings under ``/etc`` the sandbox never sees (SSH host keys ``ssh_host_*_key``, ...)."""


def host_secrets(root: str = "/etc", max_entries: int = 100_000) -> list[tuple[str, bool]]:
    """The paths under ``root`` the sandbox hides, each with whether it is a folder: every entry
    other users may not read (``o+r``; folders: ``o+rx``), and every one named in
    :data:`SECRET_NAMES` or ending in :data:`SECRET_SUFFIXES`. Links are left as they are
    (they point into what the sandbox binds, or nowhere it can reach)."""
    hidden: list[tuple[str, bool]] = []
    stack = [root]
    seen = 0
    while stack and seen < max_entries:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                seen += 1
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    continue
                folder = stat.S_ISDIR(st.st_mode)
                readable = (st.st_mode & 0o005) == 0o005 if folder else bool(st.st_mode & 0o004)
                if (not readable or entry.name in SECRET_NAMES or entry.name.endswith(SECRET_SUFFIXES)):
                    hidden.append((entry.path, folder))
                elif folder:
                    stack.append(entry.path)
    return sorted(hidden)


class BwrapSandbox:
    """Runs one bash command in a fresh bubblewrap sandbox with a given dir as ``/testbed``."""

    def __init__(self, python: str | None = None, limits: SandboxLimits | None = None) -> None:
        self.bwrap = require_bwrap()
        self.prlimit = shutil.which("prlimit")
        if self.prlimit is None:
            raise RuntimeError("the local SWE-bench backend needs prlimit (util-linux)")
        self.limits = limits or SandboxLimits()
        self.cgroup = PidsCgroup.create(self.limits.max_processes)
        self.memory = MemoryCgroup.create(self.limits.memory_bytes)
        self._lock = threading.Lock()  # one command at a time per cgroup
        self.python = python or sys.executable
        self._dirs = _python_dirs(self.python)
        self._venv_bin = os.path.join(
            os.path.dirname(os.path.abspath(self.python))
        )
        pkg = str(Path(__file__).resolve().parents[1])
        # hide this package (it holds the test patches of the bundled instances)
        # also when installed system-wide (under /usr, bound read-only below; e.g. the OpenEnv image)
        bound = [*self._dirs, "/usr", "/etc", *(os.path.realpath("/" + n) for n in ("bin", "lib", "lib32", "lib64", "sbin"))]
        self._hidden = [pkg] if any(pkg.startswith(d.rstrip(os.sep) + os.sep) for d in bound) else []
        clean_up_now_and_then("local", docker=False)
        self._shim = scratch_dir("shim-")
        (self._shim / "bin").mkdir()
        (self._shim / "bin" / "activate").write_text(CONDA_SHIM)
        # what hides the host's secrets in /etc: an empty file and an empty folder, bound over them
        (self._shim / "hidden-folder").mkdir()
        (self._shim / "hidden-file").write_bytes(b"")
        self._secrets = host_secrets("/etc")
        atexit.register(remove_tree, self._shim)

    def args(self, testbed: Path, ro_binds: Sequence[tuple[str, str]] = (),
             rw_binds: Sequence[tuple[str, str]] = ()) -> list[str]:
        a = [
            self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
        ]
        for name in ("bin", "lib", "lib32", "lib64", "sbin"):
            p = Path("/" + name)
            if p.is_symlink():
                a += ["--symlink", os.readlink(p), "/" + name]
            elif p.is_dir():
                a += ["--ro-bind", str(p), "/" + name]
        for path, folder in self._secrets:
            a += ["--ro-bind", str(self._shim / ("hidden-folder" if folder else "hidden-file")), path]
        tmp_size = str(self.limits.disk_quota_bytes)
        a += ["--proc", "/proc", "--dev", "/dev", "--size", tmp_size, "--tmpfs", "/tmp",
              "--size", tmp_size, "--tmpfs", "/dev/shm"]
        for d in self._dirs:
            a += ["--ro-bind", d, d]
        for d in self._hidden:
            a += ["--tmpfs", d]
        a += ["--ro-bind", str(self._shim), "/opt/miniconda3"]
        for src, dst in ro_binds:
            a += ["--ro-bind", src, dst]
        for src, dst in rw_binds:
            a += ["--bind", src, dst]
        a += [
            "--bind", str(testbed), "/testbed", "--chdir", "/testbed", "--clearenv",
            "--setenv", "PATH", f"{self._venv_bin}:{SANDBOX_PATH}",
            "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "TERM", "dumb", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            "--setenv", "GIT_PAGER", "cat", "--setenv", "PAGER", "cat",
            "--remount-ro", "/",
        ]
        return a

    def enter_cgroups(self, argv: list[str]) -> list[str]:
        """``argv`` behind a shell that makes itself the first victim of the host's OOM killer
        (``oom_score_adj`` 1000: the sandbox dies before the trainer) and joins the pids and
        memory cgroups before it execs, so every descendant is counted and inherits both."""
        groups = [str(g.procs) for g in (self.cgroup, self.memory) if g is not None]
        script = ('echo 1000 > /proc/self/oom_score_adj || exit 125; n=$0; '
                  'while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n - 1)); done; exec "$@"')
        return ["/bin/sh", "-c", script, str(len(groups)), *groups, *argv]

    def run(
        self,
        testbed: Path,
        command: str,
        timeout: float,
        kill_after_bytes: int,
        ro_binds: Sequence[tuple[str, str]] = (),
        watch: Callable[[], bool] | None = None,
        rw_binds: Sequence[tuple[str, str]] = (),
        grading: bool = False,
    ) -> CommandResult:
        """Run ``command``; ``watch`` (polled every second) returning True kills it.

        ``grading``: the CPU limit is at least ``timeout`` (a test run may use all of it).
        """
        lim = self.limits
        cpu = max(lim.cpu_for(timeout), math.ceil(timeout)) if grading else lim.cpu_for(timeout)
        argv = [
            self.prlimit, f"--cpu={cpu}:{cpu + 1}", f"--as={lim.memory_bytes}",
            f"--fsize={lim.max_file_bytes}", f"--nproc={lim.max_processes}", "--",
            *self.args(testbed, ro_binds, rw_binds), "bash", "-c", command,
        ]
        with self._lock:
            argv = self.enter_cgroups(argv)
            ooms = self.memory.oom_kills() if self.memory is not None else 0
            try:
                result = run_collected(argv, timeout, kill_after_bytes, watch)
            finally:
                if self.cgroup is not None:
                    self.cgroup.kill_all()
        notes = {152: f"[killed: CPU time limit of {cpu} s per process]",
                 153: f"[killed: file size limit of {lim.max_file_bytes} bytes]"}
        if self.memory is not None and self.memory.oom_kills() > ooms:
            notes[result.exit_code] = (f"[a process was killed: the command's processes together passed the memory "
                                       f"limit of {lim.memory_bytes} bytes]")
        if not result.timed_out and result.exit_code in notes:
            sep = "" if not result.output or result.output.endswith("\n") else "\n"
            result = replace(result, output=result.output + sep + notes[result.exit_code])
        return result


def run_collected(
    argv: list[str], timeout: float, kill_after_bytes: int,
    watch: Callable[[], bool] | None = None, watch_every: float = 1.0,
) -> CommandResult:
    """Run ``argv`` with merged stdout/stderr collected under a deadline and an output cap.

    ``watch`` is polled every ``watch_every`` seconds; when it returns True the command is killed.
    """
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    collector = OutputCollector(kill_after_bytes)
    timed_out = killed = watched = False
    deadline = time.monotonic() + timeout
    next_watch = time.monotonic() + watch_every
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                timed_out = True
                break
            if watch is not None and now >= next_watch:
                if watch():
                    watched = True
                    break
                next_watch = now + watch_every
            wait = remaining if watch is None else min(remaining, max(0.0, next_watch - now))
            if not sel.select(wait):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            if not collector.feed(chunk):
                killed = True
                break
    if timed_out or killed or watched:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.stdout.close()
    rc = proc.wait()
    text, elided = collector.result()
    if timed_out:
        rc = 124
    elif rc < 0:
        rc = 128 - rc
    return CommandResult(text, rc, timed_out, killed, elided)


def make_testbed(dest: Path, repo_path: str, base_commit: str) -> None:
    """A git checkout of ``base_commit`` at ``dest`` holding its history and nothing later."""
    dest.mkdir(parents=True, exist_ok=True)
    git("init", "-q", str(dest))
    git("fetch", "-q", "--no-tags", repo_path, base_commit, cwd=dest)
    git("checkout", "-q", "-B", "main", base_commit, cwd=dest)
    (dest / ".git" / "FETCH_HEAD").unlink(missing_ok=True)


@dataclass(frozen=True)
class TreeState:
    """A working copy in the store: the tree, the ``.git`` tree (None: no .git), empty dirs."""

    worktree: str
    gitdir: str | None
    empty_dirs: tuple[str, ...]
    gitdir_empty_dirs: tuple[str, ...]


class ObjectStore:
    """A bare git object store outside every sandbox, shared by the envs of one kind."""

    _registry: dict[Hashable, ObjectStore] = {}
    _lock = threading.Lock()

    def __init__(self) -> None:
        require_git()
        self.path = scratch_dir("store-")
        git("init", "-q", "--bare", str(self.path))
        self._alternates: list[str] = []
        self.initial: dict[str, TreeState] = {}
        self.lock = threading.Lock()
        self._kept: dict[TreeState, int] = {}  # live snapshots' states, counted
        self._workspaces: weakref.WeakSet[Workspace] = weakref.WeakSet()
        self._releases = 0
        atexit.register(remove_tree, self.path)

    PRUNE_EVERY = 16
    """Releases between two prunes of the store's unreachable objects."""
    PRUNE_GRACE = "2.minutes.ago"
    """Objects written more recently are never pruned (another thread may be writing a tree
    that uses them); ``git prune --expire``'s syntax."""

    def keep(self, state: TreeState) -> None:
        """Keep ``state``'s objects until as many :meth:`release` calls."""
        with self.lock:
            self._kept[state] = self._kept.get(state, 0) + 1

    def release(self, state: TreeState) -> None:
        """Drop one :meth:`keep` of ``state``; every :data:`PRUNE_EVERY` releases, delete the
        loose objects that no kept state, initial checkout or live working copy reaches."""
        with self.lock:
            count = self._kept.get(state, 0)
            if count <= 1:
                self._kept.pop(state, None)
            else:
                self._kept[state] = count - 1
            self._releases += 1
            if self._releases % self.PRUNE_EVERY == 0:
                self.prune()

    def prune(self) -> None:
        """Delete unreachable loose objects older than :data:`PRUNE_GRACE` (call with ``lock``)."""
        states = [*self._kept, *self.initial.values(), *(ws.last for ws in list(self._workspaces) if ws.last is not None)]
        heads = sorted({t for s in states for t in (s.worktree, s.gitdir) if t is not None})
        git("prune", f"--expire={self.PRUNE_GRACE}", "--", *heads, env={"GIT_DIR": str(self.path)})

    @classmethod
    def for_kind(cls, kind: Hashable) -> ObjectStore:
        with cls._lock:
            store = cls._registry.get(kind)
            if store is None:
                store = cls._registry[kind] = cls()
            return store

    def add_alternate(self, repo: str) -> None:
        """Let the store read the objects of a source repo (its base commits and history)."""
        objects = os.path.join(git_text("rev-parse", "--absolute-git-dir", cwd=repo), "objects")
        if objects not in self._alternates:
            self._alternates.append(objects)
            (self.path / "objects" / "info" / "alternates").write_text(
                "".join(a + "\n" for a in self._alternates)
            )

    def env(self, index: Path | str) -> dict[str, str]:
        return {"GIT_DIR": str(self.path), "GIT_INDEX_FILE": str(index)}

    def commit_of(self, state: TreeState) -> str:
        entries = f"040000 tree {state.worktree}\tw\n"
        if state.gitdir is not None:
            entries += f"040000 tree {state.gitdir}\tg\n"
        tree = git_text("mktree", env={"GIT_DIR": str(self.path)}, input=entries.encode())
        return git_text("commit-tree", tree, "-m", "bpo snapshot", env={"GIT_DIR": str(self.path)})

    def pack(self, state: TreeState, exclude_commit: str) -> bytes:
        """The objects of ``state`` that are not reachable from ``exclude_commit``, as a pack."""
        commit = self.commit_of(state)
        return git("pack-objects", "--revs", "--stdout", "-q", env={"GIT_DIR": str(self.path)},
                   input=f"{commit}\n^{exclude_commit}\n".encode())

    def unpack(self, data: bytes) -> None:
        git("index-pack", "--stdin", env={"GIT_DIR": str(self.path)}, input=data)


DIFF_TIMEOUT_S = 120.0
"""Seconds the host's git may take to diff the testbed for grading (as the docker backend's
diff; the testbed was recorded within each step's deadline, so this is rarely near)."""
CTIME_SLACK_S = 2.0
"""Seconds before a recorded moment from which files count as changed (file timestamps come
from a coarse clock)."""


class Workspace:
    """One working copy (``testbed/``) with its stat-cache indexes, over a shared store.

    Host-side work on the agent's tree never recurses and never reads more than it must:
    before the stat caches are refreshed on a tree the agent changed, every file changed since
    the tree last matched a recorded state is removed (:func:`scrub_changed`: git then checks
    it out again from the store if the target state has it), so a restore reads nothing the
    agent wrote; a capture reads what the agent wrote, within a deadline."""

    def __init__(self, store: ObjectStore, root: Path | None = None) -> None:
        self.store = store
        self.root = Path(root) if root else scratch_dir("ws-")
        self.testbed = self.root / "testbed"
        self.testbed.mkdir(parents=True, exist_ok=True)
        self._idx_wt = self.root / "index-worktree"
        self._idx_gd = self.root / "index-gitdir"
        self._current: TreeState | None = None  # what the testbed holds, when known
        # the state last written or checked out: its objects back the stat-cache indexes
        self.last: TreeState | None = None
        self._since = 0.0  # files with a later ctime changed after the testbed last matched a state
        self.trash = Trash(self.root / "trash")
        store._workspaces.add(self)

    # ---- the working copy ------------------------------------------------------------
    def mark_dirty(self) -> None:
        self._current = None

    def _gitdir(self) -> Path:
        return self.testbed / ".git"

    def _tree_of(self, work_tree: Path, index: Path, deadline: float | None) -> tuple[str, tuple[str, ...]]:
        env = self.store.env(index)

        def left() -> float | None:
            return None if deadline is None else max(0.01, deadline - time.monotonic())

        git("--work-tree", str(work_tree), "add", "-A", "-f", "--", ".", env=env, timeout=left())
        tree = git_text("--work-tree", str(work_tree), "write-tree", env=env, timeout=left())
        others = git("--work-tree", str(work_tree), "ls-files", "-z", "-o", "--directory",
                     env=env, cwd=work_tree, timeout=left())
        empty = tuple(p.rstrip("/") for p in others.decode("utf-8", "surrogateescape").split("\0")
                      if p.endswith("/"))
        return tree, empty

    def capture(self, timeout: float | None = None) -> TreeState:
        """The state of the testbed, written into the store; ``timeout``: seconds git may take
        (:class:`GitTimeoutError` past them: the testbed is then as it was, its state unknown)."""
        if self._current is not None:
            return self._current
        deadline = None if timeout is None else time.monotonic() + timeout
        since = time.time() - CTIME_SLACK_S
        try:
            wt, wt_empty = self._tree_of(self.testbed, self._idx_wt, deadline)
            gd: str | None = None
            gd_empty: tuple[str, ...] = ()
            if self._gitdir().is_dir() and not self._gitdir().is_symlink():
                gd, gd_empty = self._tree_of(self._gitdir(), self._idx_gd, deadline)
        except GitError:
            self._drop_locks()  # a git killed at its deadline leaves its index locked
            raise
        self._current = self.last = TreeState(wt, gd, wt_empty, gd_empty)
        self._since = since
        return self._current

    def _checkout(self, work_tree: Path, index: Path, tree: str, empty: Sequence[str]) -> None:
        env = self.store.env(index)
        if index.exists():
            git("--work-tree", str(work_tree), "add", "-A", "-f", "--", ".", env=env)
        git("--work-tree", str(work_tree), "read-tree", "--reset", "-u", tree, env=env)
        git("--work-tree", str(work_tree), "clean", "-ffdxq", env=env, cwd=work_tree)
        for d in empty:
            make_dirs_inside(work_tree, d)

    def apply(self, state: TreeState) -> None:
        """Make the testbed hold exactly ``state``."""
        if self._current == state:
            return
        dirty = self._current is None
        self._current = None
        since = time.time() - CTIME_SLACK_S
        if self.testbed.is_symlink() or not self.testbed.is_dir():
            self.testbed.unlink(missing_ok=True)
            self.testbed.mkdir()
        elif dirty:
            # what the agent changed is removed, not read: git writes back what the state has
            scrub_changed(self.testbed, self._since, discard=self.trash.discard)
        try:
            self._apply(state)
        except SnapshotError:
            raise
        except (GitError, OSError):
            # a tree git could not walk (a folder it cannot read, say): start from an empty testbed
            self._rebuild(state)
        self._current = self.last = state
        self._since = since

    def _apply(self, state: TreeState) -> None:
        gitdir = self._gitdir()
        if state.gitdir is None:
            if gitdir.is_dir() and not gitdir.is_symlink():
                self.trash.discard(gitdir)
            elif gitdir.exists() or gitdir.is_symlink():
                gitdir.unlink()
            self._idx_gd.unlink(missing_ok=True)
        self._checkout(self.testbed, self._idx_wt, state.worktree, state.empty_dirs)
        if state.gitdir is not None:
            if gitdir.is_symlink() or (gitdir.exists() and not gitdir.is_dir()):
                gitdir.unlink()
            gitdir.mkdir(exist_ok=True)
            self._checkout(gitdir, self._idx_gd, state.gitdir, state.gitdir_empty_dirs)

    def _drop_locks(self) -> None:
        for idx in (self._idx_wt, self._idx_gd, self.root / "index-patch"):
            Path(f"{idx}.lock").unlink(missing_ok=True)

    def _rebuild(self, state: TreeState) -> None:
        """Check ``state`` out into an empty testbed (every file written anew)."""
        self._drop_locks()
        self.trash.discard(self.testbed)
        self.testbed.mkdir()
        for idx in (self._idx_wt, self._idx_gd):
            idx.unlink(missing_ok=True)
        self._apply(state)

    def init_from_repo(self, repo_path: str, base_commit: str) -> TreeState:
        """Fill the testbed with ``repo_path`` at ``base_commit`` (history up to it, nothing after)."""
        if self.testbed.exists():
            remove_tree(self.testbed)
        for idx in (self._idx_wt, self._idx_gd):
            idx.unlink(missing_ok=True)
        make_testbed(self.testbed, repo_path, base_commit)
        self._current = None
        return self.capture()

    def model_patch(self, base_commit: str, timeout: float | None = None) -> str:
        """``git diff --binary`` of the testbed against ``base_commit``, honouring .gitignore;
        ``timeout``: seconds the host's git may take in all (:class:`GitTimeoutError` past them)."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.01, deadline - time.monotonic())

        state = self.capture(timeout)
        tmp_index = self.root / "index-patch"
        shutil.copyfile(self._idx_wt, tmp_index)
        try:
            return self._diff(state, base_commit, tmp_index, left)
        finally:
            tmp_index.unlink(missing_ok=True)
            self._drop_locks()

    def _diff(self, state: TreeState, base_commit: str, tmp_index: Path,
              left: Callable[[], float | None]) -> str:
        env = self.store.env(tmp_index)
        wt = str(self.testbed)
        ignored = git("--work-tree", wt, "ls-files", "-z", "-c", "-i", "--exclude-standard",
                      env=env, cwd=self.testbed, timeout=left()).split(b"\0")
        ignored = [p for p in ignored if p]
        if ignored:
            in_base = set(git("ls-tree", "-r", "-z", "--name-only", base_commit,
                              env=env, timeout=left()).split(b"\0"))
            drop = [p for p in ignored if p not in in_base]
            if drop:
                git("--work-tree", wt, "rm", "-q", "--cached", "--pathspec-from-file=-",
                    "--pathspec-file-nul", env=env, input=b"\0".join(drop), cwd=self.testbed,
                    timeout=left())
        tree = git_text("write-tree", env=env, timeout=left()) if ignored else state.worktree
        return git("diff", "--binary", "--full-index", base_commit, tree,
                   env={"GIT_DIR": str(self.store.path)}, timeout=left()).decode("utf-8", "replace")

    def close(self) -> None:
        """Remove the working copy (any depth, any shape; never raises)."""
        try:
            self.trash.empty()
        except OSError:
            pass
        remove_tree(self.root)


def make_dirs_inside(root: Path, relative: str) -> None:
    """``mkdir -p root/relative`` one folder at a time, each opened without following a link:
    :class:`SnapshotError` naming the path when a part of it is not a folder (a link to
    elsewhere, a file), so nothing outside ``root`` is created or followed."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)  # third-party: os, platform flag
    fd = os.open(root, flags)
    try:
        done: list[str] = []
        for part in PurePosixPath(relative).parts:
            if part in ("", ".", "..") or "/" in part:
                raise SnapshotError(f"portable bytes: {relative!r} is not a path inside the testbed")
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            done.append(part)
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                raise SnapshotError(
                    f"the empty folder {relative!r} would be made below {'/'.join(done)!r}, which is not a "
                    f"folder of the testbed (a link or a file: {exc.strerror}); refused"
                ) from None
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def portable_state(store: ObjectStore, state: TreeState, base_commit: str) -> dict[str, Any]:
    tree = {"worktree": state.worktree, "gitdir": state.gitdir, "empty_dirs": state.empty_dirs,
            "gitdir_empty_dirs": state.gitdir_empty_dirs}
    return {"tree": tree, "pack": store.pack(state, base_commit)}


_OBJECT_ID = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


def _relative_dirs(value: Any) -> tuple[str, ...]:
    if not isinstance(value, tuple) or not all(isinstance(d, str) for d in value):
        raise SnapshotError("portable bytes: empty_dirs is not a tuple of paths")
    for d in value:
        parts = PurePosixPath(d).parts
        if not d or d.startswith("/") or ".." in parts:
            raise SnapshotError(f"portable bytes: {d!r} is not a path inside the testbed")
    return value


def state_from_portable(store: ObjectStore, obj: Any) -> TreeState:
    """The tree a portable state names, after checking its fields (object ids, relative paths)
    and adding its objects to the store (git checks a pack as it does a fetched one)."""
    if not (isinstance(obj, dict) and isinstance(obj.get("tree"), dict) and isinstance(obj.get("pack"), bytes)):
        raise SnapshotError("portable bytes: not a local SWE-bench state")
    tree = obj["tree"]
    worktree, gitdir = tree.get("worktree"), tree.get("gitdir")
    if not (isinstance(worktree, str) and _OBJECT_ID.fullmatch(worktree)) or not (
        gitdir is None or (isinstance(gitdir, str) and _OBJECT_ID.fullmatch(gitdir))
    ):
        raise SnapshotError("portable bytes: the tree ids are not git object ids")
    state = TreeState(worktree, gitdir, _relative_dirs(tree.get("empty_dirs")), _relative_dirs(tree.get("gitdir_empty_dirs")))
    store.unpack(obj["pack"])
    _check_empty_dirs(store, state.worktree, state.empty_dirs)
    if state.gitdir is not None:
        _check_empty_dirs(store, state.gitdir, state.gitdir_empty_dirs)
    return state


def _check_empty_dirs(store: ObjectStore, tree: str, dirs: Sequence[str]) -> None:
    """Refuse (:class:`SnapshotError` naming the path) an empty folder that the tree's own
    entries would put below a link, a file or a submodule: made after the checkout, it would be
    made through the link (outside the testbed)."""
    if not dirs:
        return
    try:
        listing = git("ls-tree", "-r", "-z", "--full-tree", tree, env={"GIT_DIR": str(store.path)})
    except GitError as exc:
        raise SnapshotError(f"portable bytes: the tree {tree} is not in the bytes' pack ({exc})") from None
    not_folders: dict[str, str] = {}
    for line in listing.split(b"\0"):
        if not line:
            continue
        meta, _, name = line.partition(b"\t")
        mode = meta.split(b" ", 1)[0]
        kind = {b"120000": "a link", b"160000": "a submodule"}.get(mode, "a file")
        not_folders[name.decode("utf-8", "surrogateescape")] = kind
    for d in dirs:
        parts = PurePosixPath(d).parts
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if prefix in not_folders:
                raise SnapshotError(
                    f"portable bytes: the empty folder {d!r} lies below {prefix!r}, which the same state "
                    f"makes {not_folders[prefix]}: refused (a crafted tree; it would be made outside the testbed)")


class QuotaWatch:
    """The disk-quota check polled during a command (True: over, kill it). A scan costs time in
    proportion to the tree (and holds each folder's lock while it lists it), so after a scan
    that took ``t`` seconds the next one waits ``3 t``: the watch takes at most a quarter of
    the time, and a command making 150,000 files is not slowed down by it."""

    def __init__(self, root: Path, limit: int) -> None:
        self.root, self.limit = root, limit
        self._next = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        over = scan_tree(self.root, stop_above=self.limit).usage > self.limit
        self._next = time.monotonic() + 3 * (time.monotonic() - now)
        return over


class LocalBackend:
    """The env's view of the local backend: reset, run, capture/apply, patch, eval."""

    def __init__(
        self, kind: Hashable, python: str | None = None, limits: SandboxLimits | None = None
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.sandbox = BwrapSandbox(python, self.limits)
        self.store = ObjectStore.for_kind(kind)
        self.ws = Workspace(self.store)
        self._base_sizes: dict[str, int] = {}  # instance -> bytes of its initial testbed
        self._base_size = 0

    def check(self, rows: Sequence[dict[str, Any]]) -> None:
        missing = [r["instance_id"] for r in rows if not r.get("repo_path")]
        if missing:
            raise ValueError(
                f"the local backend needs a `repo_path` (a local git repo) in every row; "
                f"missing for {missing[:5]} (use backend='docker' for image-based rows)"
            )
        for row in rows:
            if not Path(row["repo_path"]).is_dir():
                raise ValueError(f"{row['instance_id']}: repo_path {row['repo_path']} is not a folder")

    def _initial(self, row: dict[str, Any]) -> TreeState:
        with self.store.lock:
            state = self.store.initial.get(row["instance_id"])
            if state is None:
                self.store.add_alternate(row["repo_path"])
                state = self.ws.init_from_repo(row["repo_path"], row["base_commit"])
                self.store.initial[row["instance_id"]] = state
            return state

    def _set_base(self, row: dict[str, Any]) -> None:
        iid = row["instance_id"]
        if iid not in self._base_sizes:
            fork = Workspace(self.store)
            try:
                fork.apply(self._initial(row))
                self._base_sizes[iid] = disk_usage(fork.testbed)
            finally:
                fork.close()
        self._base_size = self._base_sizes[iid]

    def reset(self, row: dict[str, Any]) -> None:
        self.ws.apply(self._initial(row))
        self._set_base(row)

    def run(self, command: str, timeout: float, kill_after_bytes: int) -> CommandResult:
        """Run ``command``; then measure the testbed and record it in the store, both bounded:
        a testbed over the quota (apparent sizes count), with a path longer than
        :data:`MAX_PATH_BYTES`, with a folder the host cannot read, or that git cannot record
        within ``timeout`` seconds is restored to its state before the command, and the
        observation says so (docs/reliability.md#the-host-side-of-a-step)."""
        quota = self.limits.disk_quota_bytes
        limit = self._base_size + quota
        before = self.ws.capture()  # recorded at the end of the previous step (or a restore)
        self.ws.mark_dirty()
        testbed = self.ws.testbed
        result = self.sandbox.run(testbed, command, timeout, kill_after_bytes,
                                  watch=QuotaWatch(testbed, limit))
        scan = scan_tree(testbed, stop_above=limit)
        why = self._over(scan, limit)
        if why is None:
            try:
                self.ws.capture(timeout)  # what the next step, a snapshot or grading starts from
            except GitError as exc:
                why = (f"[the host could not record /testbed within the step's timeout of {timeout:g} s"
                       if isinstance(exc, GitTimeoutError) else
                       f"[the host could not record /testbed ({str(exc)[:300]})") + "; the command's changes were undone]"
        if why is not None:
            self.ws.apply(before)
            sep = "" if not result.output or result.output.endswith("\n") else "\n"
            result = replace(result, output=f"{result.output}{sep}{why}")
        return result

    def _over(self, scan: TreeScan, limit: int) -> str | None:
        """Why the testbed cannot be kept (the observation's note), or None."""
        quota = self.limits.disk_quota_bytes
        if scan.too_long is not None:
            return (f"[/testbed holds a path longer than {MAX_PATH_BYTES} bytes "
                    f"({scan.too_long[:60]!r}...), which the host does not record; the command was killed and "
                    "its changes undone]")
        if scan.unreadable is not None:
            return (f"[disk quota exceeded: /testbed has a folder the quota check cannot read "
                    f"({scan.unreadable[:80]!r}), the limit is {quota}; the command was killed and its changes undone]")
        if scan.bytes > limit:
            return (f"[disk quota exceeded: /testbed grew by at least {scan.bytes - self._base_size} bytes"
                    f" (files count their apparent size, sparse ones too, and files and folders at least"
                    f" {INODE_BYTES} bytes each), the limit is {quota}; the command was killed and its changes undone]")
        return None

    def capture(self, timeout: float | None = None) -> TreeState:
        """The testbed's state (recorded at the end of the last step: free; ``timeout``, the
        step's, bounds the host's git should it not be)."""
        state = self.ws.capture(timeout)
        self.store.keep(state)  # a snapshot's: freed by release()
        return state

    def apply(self, state: TreeState, row: dict[str, Any] | None) -> None:
        if row is not None:
            self._initial(row)  # the store must know the row's repo
            self._set_base(row)
        self.ws.apply(state)

    def portable(self, state: TreeState, row: dict[str, Any]) -> dict[str, Any]:
        return portable_state(self.store, state, row["base_commit"])

    def from_portable(self, obj: dict[str, Any], row: dict[str, Any]) -> TreeState:
        self._initial(row)
        return state_from_portable(self.store, obj)

    def release(self, state: TreeState) -> None:
        self.store.release(state)

    def model_patch(self, row: dict[str, Any], timeout: float = DIFF_TIMEOUT_S) -> str:
        """The testbed's diff against the row's base commit; the host's git is killed past
        ``timeout`` seconds (:class:`GitTimeoutError`)."""
        return self.ws.model_patch(row["base_commit"], timeout)

    def run_eval(self, row: dict[str, Any], patch: str, script: str, timeout: float,
                 log_path: Path) -> CommandResult:
        """Apply ``patch`` to a fresh copy at base_commit, reset the test machinery it changed
        and run the eval script there; its whole log (``harness.runner_script``) is written to
        ``log_path``."""
        from bpo_envs.swebench import harness

        fork = Workspace(self.store)
        try:
            fork.apply(self._initial(row))
            eval_dir = fork.root / "eval"
            eval_dir.mkdir()
            (eval_dir / "patch.diff").write_text(patch, encoding="utf-8")
            (eval_dir / "eval.sh").write_text(script, encoding="utf-8")
            runner = harness.runner_script("/bpo_eval/patch.diff", "/bpo_eval/eval.sh",
                                           "/bpo_eval/test_output.txt", row)
            result = self.sandbox.run(fork.testbed, runner, timeout, 256 << 20,
                                      rw_binds=[(str(eval_dir), "/bpo_eval")], grading=True)
            harness.write_log(harness.read_log_file(eval_dir / "test_output.txt"), log_path,
                              result.timed_out)
            return result
        finally:
            fork.close()

    def close(self) -> None:
        self.ws.close()
        if self.sandbox.cgroup is not None:
            self.sandbox.cgroup.remove()
        if self.sandbox.memory is not None:
            self.sandbox.memory.remove()
