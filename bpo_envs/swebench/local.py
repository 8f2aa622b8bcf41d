"""The local backend: a working copy per env, commands under bubblewrap, git-object snapshots.

Sandbox (one ``bwrap`` per command, so nothing an agent starts outlives its step): tmpfs root,
read-only binds of ``/usr``, ``/etc`` and the Python in use (its venv and base prefix, with this
package's own directory hidden), a fresh tmpfs ``/tmp`` per command, ``/testbed`` bound
read-write, every namespace unshared (no network but loopback), all capabilities dropped, the
root remounted read-only. ``/opt/miniconda3/bin/activate`` is a shim so that swebench's eval
scripts (which ``conda activate testbed``) run unchanged with the Python in use.

Snapshots: the working tree and, separately, ``/testbed/.git`` are written as git trees into a
bare object store outside the sandbox (shared by the envs of one kind in this process), through
index files that act as stat caches, so a snapshot hashes only what changed. Restore is
``read-tree --reset -u`` plus ``clean``: byte-identical contents, deletions, new files, ignored
files, symlinks, the executable bit and empty directories. Not captured: other permission bits,
ownership, timestamps, nested git repositories (stored as gitlinks), and processes (none
survive a step anyway).
"""

from __future__ import annotations

import atexit
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bpo_envs.swebench._git import git, git_text, require_git
from bpo_envs.swebench.harness import CONDA_SHIM
from bpo_envs.swebench.output import CommandResult, OutputCollector

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def require_bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise RuntimeError(
            "the local SWE-bench backend runs commands under bubblewrap, which is not installed: "
            "apt-get install bubblewrap (or run scripts/setup/swebench.sh)"
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


class BwrapSandbox:
    """Runs one bash command in a fresh bubblewrap sandbox with a given dir as ``/testbed``."""

    def __init__(self, python: str | None = None) -> None:
        self.bwrap = require_bwrap()
        self.python = python or sys.executable
        self._dirs = _python_dirs(self.python)
        self._venv_bin = os.path.join(
            os.path.dirname(os.path.abspath(self.python))
        )
        pkg = str(Path(__file__).resolve().parents[1])
        # hide this package (it holds the test patches of the bundled instances)
        self._hidden = [pkg] if any(pkg.startswith(d + os.sep) for d in self._dirs) else []
        self._shim = Path(tempfile.mkdtemp(prefix="bpo-swe-shim-"))
        (self._shim / "bin").mkdir()
        (self._shim / "bin" / "activate").write_text(CONDA_SHIM)
        atexit.register(shutil.rmtree, self._shim, True)

    def args(self, testbed: Path, ro_binds: Sequence[tuple[str, str]] = ()) -> list[str]:
        a = [
            self.bwrap, "--unshare-all", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
        ]
        for name in ("bin", "lib", "lib32", "lib64", "sbin"):
            p = Path("/" + name)
            if p.is_symlink():
                a += ["--symlink", os.readlink(p), "/" + name]
            elif p.is_dir():
                a += ["--ro-bind", str(p), "/" + name]
        a += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for d in self._dirs:
            a += ["--ro-bind", d, d]
        for d in self._hidden:
            a += ["--tmpfs", d]
        a += ["--ro-bind", str(self._shim), "/opt/miniconda3"]
        for src, dst in ro_binds:
            a += ["--ro-bind", src, dst]
        a += [
            "--bind", str(testbed), "/testbed", "--chdir", "/testbed", "--clearenv",
            "--setenv", "PATH", f"{self._venv_bin}:{SANDBOX_PATH}",
            "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "TERM", "dumb", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            "--setenv", "GIT_PAGER", "cat", "--setenv", "PAGER", "cat",
            "--remount-ro", "/",
        ]
        return a

    def run(
        self,
        testbed: Path,
        command: str,
        timeout: float,
        kill_after_bytes: int,
        ro_binds: Sequence[tuple[str, str]] = (),
    ) -> CommandResult:
        argv = [*self.args(testbed, ro_binds), "bash", "-c", command]
        return run_collected(argv, timeout, kill_after_bytes)


def run_collected(argv: list[str], timeout: float, kill_after_bytes: int) -> CommandResult:
    """Run ``argv`` with merged stdout/stderr collected under a deadline and an output cap."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    collector = OutputCollector(kill_after_bytes)
    timed_out = killed = False
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if not sel.select(remaining):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            if not collector.feed(chunk):
                killed = True
                break
    if timed_out or killed:
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
        self.path = Path(tempfile.mkdtemp(prefix="bpo-swe-store-"))
        git("init", "-q", "--bare", str(self.path))
        self._alternates: list[str] = []
        self.initial: dict[str, TreeState] = {}
        self.lock = threading.Lock()
        atexit.register(shutil.rmtree, self.path, True)

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


class Workspace:
    """One working copy (``testbed/``) with its stat-cache indexes, over a shared store."""

    def __init__(self, store: ObjectStore, root: Path | None = None) -> None:
        self.store = store
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="bpo-swe-ws-"))
        self.testbed = self.root / "testbed"
        self.testbed.mkdir(parents=True, exist_ok=True)
        self._idx_wt = self.root / "index-worktree"
        self._idx_gd = self.root / "index-gitdir"
        self._current: TreeState | None = None  # what the testbed holds, when known

    # ---- the working copy ------------------------------------------------------------
    def mark_dirty(self) -> None:
        self._current = None

    def _gitdir(self) -> Path:
        return self.testbed / ".git"

    def _tree_of(self, work_tree: Path, index: Path) -> tuple[str, tuple[str, ...]]:
        env = self.store.env(index)
        git("--work-tree", str(work_tree), "add", "-A", "-f", "--", ".", env=env)
        tree = git_text("--work-tree", str(work_tree), "write-tree", env=env)
        others = git("--work-tree", str(work_tree), "ls-files", "-z", "-o", "--directory",
                     env=env, cwd=work_tree)
        empty = tuple(p.rstrip("/") for p in others.decode("utf-8", "surrogateescape").split("\0")
                      if p.endswith("/"))
        return tree, empty

    def capture(self) -> TreeState:
        """The state of the testbed, written into the store."""
        if self._current is not None:
            return self._current
        wt, wt_empty = self._tree_of(self.testbed, self._idx_wt)
        gd: str | None = None
        gd_empty: tuple[str, ...] = ()
        if self._gitdir().is_dir() and not self._gitdir().is_symlink():
            gd, gd_empty = self._tree_of(self._gitdir(), self._idx_gd)
        self._current = TreeState(wt, gd, wt_empty, gd_empty)
        return self._current

    def _checkout(self, work_tree: Path, index: Path, tree: str, empty: Sequence[str]) -> None:
        env = self.store.env(index)
        if index.exists():
            git("--work-tree", str(work_tree), "add", "-A", "-f", "--", ".", env=env)
        git("--work-tree", str(work_tree), "read-tree", "--reset", "-u", tree, env=env)
        git("--work-tree", str(work_tree), "clean", "-ffdxq", env=env, cwd=work_tree)
        for d in empty:
            (work_tree / d).mkdir(parents=True, exist_ok=True)

    def apply(self, state: TreeState) -> None:
        """Make the testbed hold exactly ``state``."""
        if self._current == state:
            return
        self._current = None
        if self.testbed.is_symlink() or not self.testbed.is_dir():
            self.testbed.unlink(missing_ok=True)
            self.testbed.mkdir()
        gitdir = self._gitdir()
        if state.gitdir is None:
            if gitdir.is_dir() and not gitdir.is_symlink():
                shutil.rmtree(gitdir)
            elif gitdir.exists() or gitdir.is_symlink():
                gitdir.unlink()
            self._idx_gd.unlink(missing_ok=True)
        self._checkout(self.testbed, self._idx_wt, state.worktree, state.empty_dirs)
        if state.gitdir is not None:
            if gitdir.is_symlink() or (gitdir.exists() and not gitdir.is_dir()):
                gitdir.unlink()
            gitdir.mkdir(exist_ok=True)
            self._checkout(gitdir, self._idx_gd, state.gitdir, state.gitdir_empty_dirs)
        self._current = state

    def init_from_repo(self, repo_path: str, base_commit: str) -> TreeState:
        """Fill the testbed with ``repo_path`` at ``base_commit`` (history up to it, nothing after)."""
        if self.testbed.exists():
            shutil.rmtree(self.testbed)
        for idx in (self._idx_wt, self._idx_gd):
            idx.unlink(missing_ok=True)
        make_testbed(self.testbed, repo_path, base_commit)
        self._current = None
        return self.capture()

    def model_patch(self, base_commit: str) -> str:
        """``git diff --binary`` of the testbed against ``base_commit``, honouring .gitignore."""
        state = self.capture()
        tmp_index = self.root / "index-patch"
        shutil.copyfile(self._idx_wt, tmp_index)
        env = self.store.env(tmp_index)
        wt = str(self.testbed)
        ignored = git("--work-tree", wt, "ls-files", "-z", "-c", "-i", "--exclude-standard",
                      env=env, cwd=self.testbed).split(b"\0")
        ignored = [p for p in ignored if p]
        if ignored:
            in_base = set(git("ls-tree", "-r", "-z", "--name-only", base_commit,
                              env=env).split(b"\0"))
            drop = [p for p in ignored if p not in in_base]
            if drop:
                git("--work-tree", wt, "rm", "-q", "--cached", "--pathspec-from-file=-",
                    "--pathspec-file-nul", env=env, input=b"\0".join(drop), cwd=self.testbed)
        tree = git_text("write-tree", env=env) if ignored else state.worktree
        tmp_index.unlink(missing_ok=True)
        return git("diff", "--binary", "--full-index", base_commit, tree,
                   env={"GIT_DIR": str(self.store.path)}).decode("utf-8", "replace")

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def portable_state(store: ObjectStore, state: TreeState, base_commit: str) -> dict[str, Any]:
    return {"tree": state, "pack": store.pack(state, base_commit)}


def state_from_portable(store: ObjectStore, obj: dict[str, Any]) -> TreeState:
    store.unpack(obj["pack"])
    return obj["tree"]


class LocalBackend:
    """The env's view of the local backend: reset, run, capture/apply, patch, eval."""

    def __init__(self, kind: Hashable, python: str | None = None) -> None:
        self.sandbox = BwrapSandbox(python)
        self.store = ObjectStore.for_kind(kind)
        self.ws = Workspace(self.store)

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

    def reset(self, row: dict[str, Any]) -> None:
        self.ws.apply(self._initial(row))

    def run(self, command: str, timeout: float, kill_after_bytes: int) -> CommandResult:
        self.ws.mark_dirty()
        return self.sandbox.run(self.ws.testbed, command, timeout, kill_after_bytes)

    def capture(self) -> TreeState:
        return self.ws.capture()

    def apply(self, state: TreeState, row: dict[str, Any] | None) -> None:
        if row is not None:
            self._initial(row)  # the store must know the row's repo
        self.ws.apply(state)

    def portable(self, state: TreeState, row: dict[str, Any]) -> dict[str, Any]:
        return portable_state(self.store, state, row["base_commit"])

    def from_portable(self, obj: dict[str, Any], row: dict[str, Any]) -> TreeState:
        self._initial(row)
        return state_from_portable(self.store, obj)

    def release(self, state: TreeState) -> None:
        return None  # objects stay in the store until the process exits (git dedups them)

    def model_patch(self, row: dict[str, Any]) -> str:
        return self.ws.model_patch(row["base_commit"])

    def run_eval(self, row: dict[str, Any], patch: str, script: str, timeout: float) -> str:
        """Apply ``patch`` to a fresh copy at base_commit and run the eval script there."""
        from bpo_envs.swebench import harness

        fork = Workspace(self.store)
        try:
            fork.apply(self._initial(row))
            eval_dir = fork.root / "eval"
            eval_dir.mkdir()
            (eval_dir / "patch.diff").write_text(patch, encoding="utf-8")
            (eval_dir / "eval.sh").write_text(script, encoding="utf-8")
            runner = harness.runner_script("/bpo_eval/patch.diff", "/bpo_eval/eval.sh")
            result = self.sandbox.run(fork.testbed, runner, timeout, 256 << 20,
                                      ro_binds=[(str(eval_dir), "/bpo_eval")])
            log = result.output
            if result.timed_out:
                log += "\n" + harness.timeout_marker() + "\n"
            return log
        finally:
            fork.close()

    def close(self) -> None:
        self.ws.close()
