"""The docker backend: SWE-bench images (or a local image for ``repo_path`` rows) via docker-py.

Containers start with ``init=True`` and no network, run ``sleep infinity`` and take one
``docker exec`` per step (``timeout -s KILL`` and ``head -c`` bound time and output). Each
command runs as ``bash -c`` in ``/testbed`` with ``BASH_ENV=/root/.bashrc`` (as mini-swe-agent
and the official images expect: their ``.bashrc`` activates the conda env ``testbed``, so the
agent's ``python`` and ``pytest`` are the instance's), plus mini-swe-agent's non-interactive
variables (``PAGER=cat`` ...). A snapshot is ``container.commit()`` (the whole filesystem; not
processes), waited for the step's timeout + :data:`SNAPSHOT_GRACE_S` (past that a
:class:`SnapshotTimeoutError`, and the late image is removed when it arrives); restore and fork start a new container from that image; containers are removed
with ``remove(force=True)`` (a plain stop waits for the grace period).

Grading applies the diff of ``/testbed`` against ``base_commit`` (taken in a fork of the final
state) to a fresh container of the instance image with swebench's fallbacks and runs the
swebench eval script there as the harness does (``bash eval.sh``, no ``BASH_ENV``: the script
activates the env itself), with no network unless ``grading_network=True`` (an opt-in for eval
scripts that ``pip install``: the agent's patch runs during grading and could then reach the
host's services and the internet). ``portable()`` carries ``/testbed`` only (a tar), rebuilt on
the instance image by the receiver. As in the local backend, nothing outlives its step: when a
command ends, every process but the container's init and main process is killed (with bash
builtins only, so it works under a fork bomb at ``pids_limit``); a snapshot (a filesystem
commit) therefore holds the whole state.

Images: see ``bpo_envs.swebench.images`` (official names, ``images_dir`` tarballs, never a pull).

Limits (``SandboxLimits``): every container gets ``pids_limit`` (max_processes), ``mem_limit``
with no extra swap (memory_bytes, for the whole container), an ``RLIMIT_FSIZE`` ulimit
(max_file_bytes) and a CPU quota of ``cpus`` CPUs (``nano_cpus``: a busy loop in one container
takes at most that share from the envs beside it). Privileges: ``no-new-privileges`` (no setuid
binary gains anything) and only the capabilities a test suite run as root uses
(:data:`CAPABILITIES`: owning, reading and writing any file, signals, switching users); the rest
of Docker's default set (raw sockets, ``mknod``, ``chroot``, audit, file capabilities, binding
ports below 1024) is dropped. The disk quota (disk_quota_bytes) bounds the container's writable layer since
its last reset or restore: with overlay2 its upper directory is measured on the host once a
second during a step (``bpo_envs.swebench.tree.disk_usage``: apparent sizes count, so sparse
files do; a tree deeper than the host measures counts as over), and a step that exceeds it is
killed (its files are kept, the observation says so; docker's own ``storage_opt`` needs xfs
project quotas). Under another storage driver the
quota is not enforced (logged once). CPU seconds are not limited per process: the step timeout
bounds a command.

Ownership: every container (and so every snapshot image committed from one) carries its maker's
host, pid, start time and run id (``bpo_envs.swebench.owners``); an env's start removes what dead
processes left, and released snapshots (``release()``, garbage collection, ``close()``) remove
their images.

Under load and faults: docker calls of all the envs of a process go through one bound
(:func:`set_max_docker_calls`, default ``$BPO_GYM_DOCKER_CALLS`` or 8 calls in flight; a
command's output is streamed outside it), so an overloaded daemon queues calls instead of
timing them out. A call that cannot reach the daemon (it is restarting) is retried for up to
``daemon_wait_s`` seconds (once a daemon answered this process: a host with no daemon fails at
once) (:func:`set_daemon_wait`, default ``$BPO_GYM_DOCKER_WAIT`` or 120)
before it raises. When the daemon restarted (or a container died), the env's container is
gone: the next step raises :class:`SandboxLostError`, which the rollout engine's recovery
handles (the env is replaced and the path rebuilt from its nearest snapshot: snapshot images
survive a daemon restart); a warm container that died before it was used is replaced silently
(nothing ran in it).
"""

from __future__ import annotations

import io
import logging
import os
import shlex
import tarfile
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bpo_envs.core import SnapshotError
from bpo_envs.swebench.daemon import (  # noqa: F401 - the daemon's knobs, re-exported
    MIN_FREE_DISK_BYTES,
    DaemonUnavailableError,
    check_capacity,
    docker_call,
    docker_client,
    exec_output,
    max_docker_calls,
    set_daemon_wait,
    set_max_docker_calls,
)
from bpo_envs.swebench.images import DEFAULT_IMAGE, ImageStore, row_image_names
from bpo_envs.swebench.local import (
    DIFF_TIMEOUT_S,
    SandboxLimits,
    disk_usage,
    largest_files,
    scan_tree,
)
from bpo_envs.swebench.output import CommandResult, OutputCollector
from bpo_envs.swebench.owners import (
    LABEL_KIND,
    LABEL_PID,
    SNAPSHOT_REPO,
    clean_up_now_and_then,
    owner_labels,
    run_dir,
)

log = logging.getLogger(__name__)
BASH_ENV = "/root/.bashrc"
OWNER_LABEL = LABEL_PID
"""Label of every container (and so of every snapshot image) with the pid of the process that
made it (beside its host, start time and run id: ``bpo_envs.swebench.owners``)."""
CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
"""The capabilities a container keeps (all others are dropped)."""
KILLED_RC = 199
"""The wrapper's exit code for a command killed by SIGKILL (reported as 137)."""
RUNTIME_REFUSED = "cannot exec in a "
"""What the container runtime answers (exit code 126) to an exec it could not start in a
container that is stopping ("... stopped state", "... deleted state")."""
HOST_GRACE_S = 3.0
"""Seconds past a command's timeout after which the host kills it (its own ``timeout`` inside
the container may be frozen or killed by the agent)."""
HOST_KILL_WAIT_S = 5.0
"""Seconds a kill from a fresh exec (then a restart) is given to end a command."""
SNAPSHOT_GRACE_S = 10.0
"""Seconds past the step's timeout the host waits for a snapshot's ``docker commit`` (it reads
the container's writable layer, at most the disk quota: 10-12 s for 1 GiB on a loaded host)."""
TRIM_TIMEOUT_S = 10.0
"""Seconds the host's removal of what a command wrote past the disk quota may take (so that the
step answers within its timeout + 15 s; what is left is removed after the next command)."""
AGENT_ENV = {"PAGER": "cat", "MANPAGER": "cat", "LESS": "-R", "PIP_PROGRESS_BAR": "off",
             "TQDM_DISABLE": "1"}
"""Variables of every agent command (mini-swe-agent's SWE-bench set: nothing waits for a tty)."""

# Kill every process but init (1), the container's main ``sleep`` (the lowest-pid child of 1 named
# sleep), this shell and the pids given: first ``kill -STOP -1`` (the kernel signals every
# process at once, so a fork bomb cannot outrun it), then SIGKILL to each, then SIGCONT to the
# survivors. Bash builtins only: it must work with every pid of ``pids_limit`` taken.
REAP = r"""__bpo_reap() {
  local main=999999999 p st f n keep=" 1 $$ $* "
  kill -STOP -1 2>/dev/null
  for p in /proc/[0-9]*; do
    read -r st < "$p/stat" 2>/dev/null || continue
    f=(${st##*) })
    n=${p#/proc/}
    if [ "${f[1]}" = 1 ] && [ "${st#*(sleep) }" != "$st" ] && [ "$n" -lt "$main" ]; then main=$n; fi
  done
  keep="$keep$main "
  for p in /proc/[0-9]*; do
    n=${p#/proc/}
    [ "${keep#* $n }" != "$keep" ] || kill -KILL "$n" 2>/dev/null
  done
  kill -CONT $main $* 2>/dev/null
}
"""


class SnapshotTimeoutError(SnapshotError):
    """The Docker daemon did not commit a snapshot within the step's timeout + its grace; the
    env's container is unchanged (the env goes on) and no image is kept."""


class SandboxLostError(RuntimeError):
    """The env's container is gone (the daemon restarted, or the container died): the state since
    the last snapshot is lost. The rollout engine rebuilds the path from its nearest snapshot."""


class _NotStartedError(SandboxLostError):
    """The container was no longer running when a command was to start: the daemon refused to
    create or start its exec, so nothing of the command ran."""


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _note(text: str, note: str) -> str:
    """``text`` with ``note`` on a line of its own."""
    return f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}{note}"


class _StreamReader(io.RawIOBase):
    """A file over an iterator of byte chunks (``get_archive``'s stream), read in order."""

    def __init__(self, chunks: Any) -> None:
        self._chunks = iter(chunks)
        self._buf = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, out: Any) -> int:
        while not len(self._buf):
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buf = memoryview(chunk)
        n = min(len(out), len(self._buf))
        out[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


@dataclass(frozen=True)
class DockerState:
    """A committed image holding the container's filesystem (removed when the state is released
    or garbage collected: a snapshot's image lives exactly as long as the snapshot)."""

    image: str


_image_finalizers: dict[str, weakref.finalize] = {}
_pending_images: set[tuple[Any, str]] = set()  # removals that failed (a container still used it)
_pending_lock = threading.Lock()


def _layers(box: Any) -> tuple[str | None, list[str]]:
    """The host folders of ``box``'s overlay filesystem: its writable layer (None when the host
    cannot see one) and its image layers. From the storage driver's record (overlay2's
    ``GraphDriver.Data``), else from the overlay mount of the container's root, as its init sees
    it (``/proc/<pid>/mountinfo``: the containerd image store's overlayfs snapshotter records
    no folders). Under vfs there is no writable layer apart from the image's copy: None."""
    data = (box.attrs.get("GraphDriver") or {}).get("Data") or {}
    upper, lower = data.get("UpperDir"), data.get("LowerDir") or ""
    if not upper:
        if not (box.attrs.get("State") or {}).get("Pid"):
            docker_call(box.reload)  # recorded when it was created, before it ran
        pid = (box.attrs.get("State") or {}).get("Pid")
        try:
            with open(f"/proc/{int(pid)}/mountinfo") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) > 4 and fields[4] == "/" and " - overlay " in line:
                        options = dict(o.split("=", 1) for o in line.rsplit(" ", 1)[1].split(",") if "=" in o)
                        upper, lower = options.get("upperdir"), options.get("lowerdir", "")
                        break
        except (OSError, TypeError, ValueError):
            pass
    if upper and not os.path.isdir(upper):
        upper = None
    return upper, [d for d in lower.split(":") if d]


def _remove_image(client: Any, name: str) -> None:
    import docker

    _image_finalizers.pop(name, None)
    try:
        docker_call(client.images.remove, name, noprune=False)
    except docker.errors.ImageNotFound:
        pass
    except Exception:  # noqa: BLE001 - in use by a container, or no daemon: retried at close()
        with _pending_lock:
            _pending_images.add((client, name))


def _retry_pending_images() -> None:
    with _pending_lock:
        todo = list(_pending_images)
        _pending_images.clear()
    for client, name in todo:
        _remove_image(client, name)


def check_testbed_archive(data: Any) -> None:
    """Raise ``SnapshotError`` unless ``data`` is a tar of ``testbed/`` only: regular files,
    folders and links whose names stay inside it, no devices (portable bytes may come from
    elsewhere, and ``put_archive`` writes at the container's root)."""
    if not isinstance(data, bytes):
        raise SnapshotError("portable bytes: a docker SWE-bench state holds a tar of /testbed")
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = tar.getmembers()
    except (tarfile.TarError, EOFError) as exc:
        raise SnapshotError(f"portable bytes: the /testbed archive is not a tar ({exc})") from None
    for m in members:
        inside = [m.name] + ([m.linkname] if m.islnk() else [])
        for name in inside:
            parts = Path(name).parts
            if name.startswith("/") or ".." in parts or not parts or parts[0] != "testbed":
                raise SnapshotError(f"portable bytes: {name!r} in the archive is outside testbed/")
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            raise SnapshotError(f"portable bytes: {m.name!r} in the archive is a device or fifo")


def _tracked(client: Any, name: str) -> DockerState:
    """A state for image ``name`` whose garbage collection (or exit) removes the image."""
    state = DockerState(name)
    _image_finalizers[name] = weakref.finalize(state, _remove_image, client, name)
    return state


class DockerBackend:
    """The env's view of the docker backend (same methods as ``LocalBackend``)."""

    _build_lock = threading.Lock()
    _warned_quota = False
    _host_deadline = True  # False only to measure what the host's deadline costs (bench_swebench)

    def __init__(
        self, kind: Hashable, image: str | None = None, limits: SandboxLimits | None = None,
        *, images_dir: str | Path | None = None, grading_network: bool = False,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.client = docker_client()
        clean_up_now_and_then("docker", client=self.client)
        check_capacity(self.client, 1, self.limits)
        self.store = ImageStore(self.client, images_dir)
        self.grading_network = bool(grading_network)
        self.base_image = image or DEFAULT_IMAGE
        self.container: Any = None
        self.max_warm = 2
        self._warm: dict[str, Future] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bpo-swe-warm")
        self._images: dict[str, str] = {}
        self._removals: list[threading.Thread] = []
        self._late_commits: list[threading.Thread] = []  # snapshots answered past their deadline
        self._image: str | None = None  # the image self.container was started from
        self._fresh = False  # nothing ran in self.container yet
        self._layer_dirs: dict[str, tuple[str | None, list[str]]] = {}  # container id: _layers
        self._last_command: tuple[str, float] | None = None  # (container id, time.time()) of the agent's last command

    # ---- images ----------------------------------------------------------------------
    def _has_image(self, name: str) -> bool:
        return self.store.has(name)

    def instance_image(self, row: dict[str, Any]) -> str:
        """The image of ``row``: its ``image`` column or swebench's names, or one built locally."""
        iid = row["instance_id"]
        if iid in self._images:
            return self._images[iid]
        names = row_image_names(row)
        if row.get("repo_path") and not row.get("image") and not self.store.present(names):
            name = f"bpo-gym/sweb.eval.{iid.lower()}:{row['base_commit'][:12]}"
            with self._build_lock:
                if not self._has_image(name):
                    self._build(row, name)
            self._images[iid] = name
            return name
        self._images[iid] = self.store.find(iid, names)
        return self._images[iid]

    def _build(self, row: dict[str, Any], name: str) -> None:
        """Commit ``base_image`` + the repo at base_commit in /testbed as ``name``."""
        from bpo_envs.swebench.local import make_testbed

        if not self._has_image(self.base_image):
            raise RuntimeError(
                f"the base image {self.base_image} is missing: run bpo-gym-setup swebench"
            )
        with tempfile.TemporaryDirectory(prefix="img-", dir=run_dir()) as tmp:
            make_testbed(Path(tmp) / "testbed", row["repo_path"], row["base_commit"])
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(Path(tmp) / "testbed", arcname="testbed")
        box = self._start(self.base_image)
        try:
            box.exec_run(["rm", "-rf", "/testbed"])
            box.put_archive("/", buf.getvalue())
            repo, tag = name.rsplit(":", 1)
            box.commit(repository=repo, tag=tag, changes=["WORKDIR /testbed"])
        finally:
            box.remove(force=True)

    def check(self, rows: Sequence[dict[str, Any]]) -> None:
        """Every row without ``repo_path`` has its image here or a tarball in ``images_dir``."""
        missing = [row for row in rows if not row.get("repo_path")
                   and not self.store.available(row["instance_id"], row_image_names(row))]
        if missing:
            self.store.find(missing[0]["instance_id"], row_image_names(missing[0]))  # raises

    # ---- containers ------------------------------------------------------------------
    def _start(self, image: str, network: bool = False) -> Any:
        """A running container of ``image``. Created and started in two calls, each retried
        while the daemon restarts: a create whose answer was lost may still have made the
        container, so every container has a name of its own and a retried create takes the one
        it finds under that name (one ``containers.run`` retried as a whole left such
        containers behind, created and never started); a container that does not start is
        removed."""
        import docker

        lim = self.limits
        fsize = docker.types.Ulimit(name="fsize", soft=lim.max_file_bytes, hard=lim.max_file_bytes)
        name = f"bpo-gym-swe-{uuid.uuid4().hex[:16]}"
        try:
            box = docker_call(
                self._create_or_find, name,
                image, ["sleep", "infinity"], detach=True, init=True,
                network_mode=None if network else "none",
                working_dir="/testbed", labels={LABEL_KIND: "swebench", **owner_labels()},
                pids_limit=lim.max_processes, mem_limit=lim.memory_bytes,
                memswap_limit=lim.memory_bytes, ulimits=[fsize],
                nano_cpus=int(lim.cpus * 1e9), security_opt=["no-new-privileges"],
                cap_drop=["ALL"], cap_add=list(CAPABILITIES),
            )
            try:
                docker_call(box.start)  # starting a running container again is a no-op (304)
            except BaseException:
                self._remove(box)
                raise
            return box
        except docker.errors.APIError as exc:
            text = str(exc).lower()
            if "no space left" in text:
                raise RuntimeError(f"the Docker daemon is out of disk: no container starts ({exc}); "
                                   "bpo-gym-setup clean removes what crashed runs left") from exc
            if "range of cpus" in text or "nanocpus" in text:
                raise RuntimeError(f"cpus={lim.cpus} is more than this host's daemon allows ({exc})") from exc
            raise

    def _create_or_find(self, name: str, image: str, command: list[str], **kwargs: Any) -> Any:
        import docker

        try:
            return self.client.containers.create(image, command, name=name, **kwargs)
        except docker.errors.APIError as exc:
            if exc.response is not None and exc.response.status_code == 409:  # the name is taken:
                return self.client.containers.get(name)  # by the create whose answer was lost
            raise

    # A warm container: started from an image ahead of need, untouched until taken, so taking
    # it is exactly a fresh start. After a snapshot or a restore, one is started in the background
    # for that image (branching restores the same snapshot K times), and after a reset, one for
    # the instance image; at most ``max_warm`` wait, the oldest is dropped.
    def _warm_up(self, image: str) -> None:
        if image in self._warm:
            return
        self._warm[image] = self._pool.submit(self._start, image)
        while len(self._warm) > self.max_warm:
            self._drop_warm(next(iter(self._warm)))

    def _drop_warm(self, image: str) -> None:
        future = self._warm.pop(image, None)
        if future is not None:
            future.add_done_callback(
                lambda f: f.exception() is None and self._remove(f.result()))

    def _take(self, image: str) -> Any:
        future = self._warm.pop(image, None)
        if future is not None:
            try:
                return future.result()
            except Exception:  # noqa: BLE001 - e.g. the image was removed meanwhile
                log.warning("a warm container for %s failed to start; starting one now", image)
        return self._start(image)

    def _replace(self, image: str) -> None:
        old, self.container = self.container, None
        if old is not None:
            self._layer_dirs.pop(old.id, None)
        self.container = self._take(image)
        self._image, self._fresh = image, True
        self._warm_up(image)
        if old is not None:
            # removing takes ~150 ms; the new container does not wait for it (close() does)
            self._reap()
            thread = threading.Thread(target=self._remove_then_retry, args=(old,), daemon=True)
            thread.start()
            self._removals.append(thread)

    @classmethod
    def _remove_then_retry(cls, box: Any) -> None:
        """Remove ``box``, then the released snapshot images it was still using."""
        cls._remove(box)
        _retry_pending_images()

    @staticmethod
    def _remove(box: Any) -> None:
        import docker

        try:
            docker_call(box.remove, force=True)
        except (docker.errors.APIError, DaemonUnavailableError):
            pass

    def _reap(self, wait: bool = False) -> None:
        for thread in self._removals:
            if wait:
                thread.join()
        self._removals = [t for t in self._removals if t.is_alive()]

    def _upper_dir(self, box: Any) -> Path | None:
        """The host folder of ``box``'s writable layer, or None (the quota is then not enforced:
        logged once). Read from :meth:`_layers` once per container (a restart keeps it)."""
        if box.id not in self._layer_dirs:
            self._layer_dirs[box.id] = _layers(box)
        upper = self._layer_dirs[box.id][0]
        if upper is not None:
            return Path(upper)
        if not DockerBackend._warned_quota:
            DockerBackend._warned_quota = True
            log.warning("docker storage driver %r: the host cannot see the containers' writable "
                        "layer; the disk quota is not enforced",
                        (box.attrs.get("GraphDriver") or {}).get("Name"))
        return None

    def _exec(self, box: Any, script: str, timeout: float, cap: int, agent: bool = True) -> CommandResult:
        """:meth:`_exec_once`; when ``box`` had stopped before the command could start, and by
        itself since the agent's previous command began (that command ended the container's
        init, which stops the container a moment after the command returns: ``kill 1`` sends
        init a SIGTERM), it is started again on its filesystem and the command run there, with a
        note saying so. A container stopped by anything else raises :class:`SandboxLostError`."""
        previous = self._last_command
        try:
            return self._exec_once(box, script, timeout, cap, agent)
        except _NotStartedError as exc:
            cause = self._ended_by_itself_since(box, previous)
            if cause is None:
                # the engine's recovery sees the public error, as from every other loss
                raise SandboxLostError(str(exc)) from exc
        self._start_again(box, cause)
        # once only: a command that prints the runtime's refusal and stops the container again is
        # answered with what it printed
        try:
            result = self._exec_once(box, script, timeout, cap, agent, refused_is_lost=False)
        except _NotStartedError as exc:
            raise SandboxLostError(str(exc)) from exc
        if not agent:  # the host's own command (a diff, a removal): its output is data
            return result
        note = (f"[the previous command killed every process of the sandbox ({cause}); it was started "
                "again on its filesystem before this one: files are kept, processes are not]")
        return replace(result, output=_note(note, result.output) if result.output else note)

    def _ended_by_itself_since(self, box: Any, last: tuple[str, float] | None) -> str | None:
        """The cause, when ``box``'s init ended by itself (no kill from outside) since the agent's
        command ``last`` (container id, start time) began in it; else None."""
        if last is None or last[0] != box.id:
            return None
        stopped = self._stop_cause(box, last[1], wait=2.0)
        return stopped[1] if stopped is not None and stopped[0] else None

    def _exec_once(self, box: Any, script: str, timeout: float, cap: int, agent: bool = True,
                   refused_is_lost: bool = True) -> CommandResult:
        """Run ``script``; ``agent``: in the agent's environment (``BASH_ENV``, ``AGENT_ENV``),
        with the disk quota watched, and every process it leaves killed afterwards. Raises
        :class:`_NotStartedError` when the container had stopped before the command could start
        (its exec refused by the daemon or, ``refused_is_lost``, by the runtime).

        The host keeps the deadline: a command not ended ``timeout`` + :data:`HOST_GRACE_S`
        seconds after it started (its own ``timeout`` was frozen or killed) has its processes
        killed from a fresh exec, else the container restarted on its filesystem
        (:meth:`_kill_from_host`); the result says so and counts as timed out. A command that
        stopped the container itself (``kill -9 -1``, ``kill 1``: the container's init ended)
        is an observation too: the container is started again on its filesystem. A container
        stopped by anything else raises :class:`SandboxLostError` naming the cause seen."""
        import docker

        # only the inner shell reads BASH_ENV (sourcing a conda activation twice costs time)
        bash_env = f"BASH_ENV={BASH_ENV} " if agent else ""
        # head reads a pipe that processes the command leaves behind may hold open: they are
        # killed before the pipe is closed and head is waited for
        wrapped = (
            f"{REAP}exec 3> >(head -c {cap}) 2>/dev/null; out=$!\n"
            f"{bash_env}timeout -s KILL {timeout:g} bash -c {shlex.quote(script)} </dev/null >&3 2>&3\n"
            # a command killed by SIGKILL exits 137; the wrapper says so with 199, so that a 137
            # from the exec means the wrapper itself was killed (the container is dying)
            f"rc=$?; __bpo_reap $out; exec 3>&-; wait $out; [ $rc = 137 ] && rc={KILLED_RC}; exit $rc"
        )
        api = self.client.api
        started, since = time.monotonic(), time.time()
        if agent:
            self._last_command = (box.id, since)
        try:
            exec_id = self._exec_create(box, ["bash", "-c", wrapped], workdir="/testbed",
                                        environment=dict(AGENT_ENV) if agent else None)
        except SandboxLostError as exc:
            raise _NotStartedError(str(exc)) from exc
        collector = OutputCollector(cap)
        upper = self._upper_dir(box) if agent else None
        over = threading.Event()
        done = threading.Event()
        ended = threading.Event()
        feeding = threading.Lock()  # a stream left behind by a host kill stops feeding
        failure: list[BaseException] = []
        quota = self.limits.disk_quota_bytes

        def watch() -> None:
            while not done.wait(1.0):
                if disk_usage(upper) > quota:
                    over.set()
                    try:
                        api.exec_start(api.exec_create(box.id, ["bash", "-c", REAP + "__bpo_reap"])["Id"])
                    except Exception:  # noqa: BLE001 - the container died meanwhile
                        log.debug("killing an over-quota command failed", exc_info=True)
                    return

        def read() -> None:
            try:
                for chunk in exec_output(api, exec_id):
                    with feeding:
                        if ended.is_set():
                            return
                        collector.feed(chunk)
            except Exception as exc:  # noqa: BLE001 - sorted by _lost below
                failure.append(exc)
            finally:
                ended.set()

        watcher = threading.Thread(target=watch, daemon=True) if upper is not None else None
        if watcher is not None:
            watcher.start()
        host_kill: str | None = None
        try:
            if self._host_deadline:
                threading.Thread(target=read, daemon=True, name="bpo-swe-exec").start()
                if not ended.wait(timeout + HOST_GRACE_S):
                    host_kill = self._kill_from_host(box, ended)
            else:
                read()
        finally:
            done.set()
            if watcher is not None:
                watcher.join()
        with feeding:
            ended.set()
            text, elided = collector.result()
            total_bytes = collector.total_bytes
        if host_kill is not None:
            return CommandResult(
                _note(text, f"[it was still running {HOST_GRACE_S:g} s past its timeout: {host_kill}]"),
                124, True, False, elided)
        try:
            if failure:
                raise failure[0]
            rc = docker_call(api.exec_inspect, exec_id)["ExitCode"]
        except Exception as exc:  # noqa: BLE001 - sorted by _lost
            lost = self._lost(box, exc, since=since)
            # reading a started exec's stream raises no APIError: the daemon refused to start it
            if failure and isinstance(exc, docker.errors.APIError) and isinstance(lost, SandboxLostError):
                raise _NotStartedError(str(lost)) from exc
            raise lost from exc
        if rc == 126 and refused_is_lost and RUNTIME_REFUSED in text:
            # the runtime refused the exec in a stopping container: the command did not run (the
            # same text from a command in a running container is that command's output)
            ended = self._stop_cause(box, since, wait=2.0)
            if ended is not None:
                raise _NotStartedError(self._lost_text(box, ended[1]))
        stopped: tuple[bool, str] | None = None
        if rc is None or (rc == 137 and not over.is_set()):
            # no exit code, or the wrapper itself was killed: the container may have stopped
            # (unless it still runs after a while: the OOM killer chose the wrapper)
            stopped = self._stop_cause(box, since, wait=2.0)
            if stopped is None and rc is None:
                raise self._lost(box, RuntimeError("the command's shell ended with no exit code"))
            if stopped is not None:
                by_itself, cause = stopped
                if not by_itself:
                    raise SandboxLostError(self._lost_text(box, cause))
                if agent:
                    self._start_again(box, cause)
                rc = 137
        elif rc == KILLED_RC:
            rc = 137
        # timeout(1) -s KILL exits 128 + 9 when it fired
        timed_out = (rc == 137 and time.monotonic() - started >= timeout - 0.5 and not over.is_set()
                     and stopped is None)
        killed = total_bytes >= cap
        if stopped is not None:
            again = "; it was started again on its filesystem: files are kept, processes are not" if agent else ""
            text = _note(text, f"[the command killed every process of the sandbox ({stopped[1]}){again}]")
        elif upper is not None and (over.is_set() or disk_usage(upper) > quota):
            what = "the command was killed" if over.is_set() else "after this command"
            removed, whole = self._trim_to_quota(box, upper, quota)
            rest = "" if whole else (f"; not all of it within {TRIM_TIMEOUT_S:g} s: what is left "
                                     "is removed after the next command")
            text = _note(text, f"[disk quota exceeded ({what}): the container's writes since its last "
                               f"reset or restore exceed {quota} bytes; the host removed, largest first, "
                               f"{', '.join('/' + p for p in removed[:5]) or 'nothing'}"
                               f"{f' and {len(removed) - 5} more' if len(removed) > 5 else ''}{rest}]")
        elif agent and rc == 137 and not timed_out:
            text = _note(text, f"[killed by SIGKILL: by a kill, or by the container's memory limit of "
                               f"{self.limits.memory_bytes} bytes]")
        return CommandResult(text, 124 if timed_out else rc, timed_out, killed and not timed_out, elided)

    def _trim_to_quota(self, box: Any, upper: Path, quota: int) -> tuple[list[str], bool]:
        """Remove, in ``box``, what its writable layer holds past ``quota`` (largest files first;
        a tree too deep to measure from its first folder the image does not have), so that a
        snapshot (``docker commit`` reads the whole layer, sparse files at their apparent size)
        never reads more than the quota allows. Returns the paths removed (relative to ``/``)
        and whether the removal ended within :data:`TRIM_TIMEOUT_S` (else the next command's
        check finds the layer still over the quota and removes the rest)."""
        scan = scan_tree(upper)
        doomed: list[str] = []
        if scan.too_long is not None or scan.unreadable is not None:
            doomed.append(self._new_ancestor(box, scan.too_long or scan.unreadable or ""))
        else:
            excess = scan.bytes - quota
            for size, path in largest_files(upper):
                if excess <= 0:
                    break
                doomed.append(path)
                excess -= size
        doomed = [p for p in doomed if p and p != "."]
        if not doomed:
            return doomed, True
        removal = self._exec(box, "rm -rf -- " + " ".join(shlex.quote("/" + p) for p in doomed),
                             TRIM_TIMEOUT_S, 1 << 16, agent=False)
        return doomed, not removal.timed_out

    def _new_ancestor(self, box: Any, path: str) -> str:
        """The shallowest folder on ``path`` that none of ``box``'s image layers has."""
        if box.id not in self._layer_dirs:
            self._layer_dirs[box.id] = _layers(box)
        lowers = self._layer_dirs[box.id][1]
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if not any(os.path.lexists(os.path.join(low, prefix)) for low in lowers):
                return prefix
        return path

    def _kill_from_host(self, box: Any, ended: threading.Event) -> str:
        """Kill a command that outlived its deadline; say how. First every process but the
        container's init and main one, from a fresh exec (this works when the command froze
        its own ``timeout`` with SIGSTOP or ignores SIGTERM); when that exec cannot start (a fork
        bomb holds every pid) or the command still runs, the container is restarted on its
        filesystem (files kept, processes gone)."""
        api = self.client.api
        try:
            reaper = api.exec_create(box.id, ["bash", "-c", REAP + "__bpo_reap"])["Id"]
            thread = threading.Thread(target=api.exec_start, args=(reaper,), daemon=True)
            thread.start()
            if ended.wait(HOST_KILL_WAIT_S):
                return "the host killed its processes from a fresh exec"
        except Exception:  # noqa: BLE001 - no exec starts: restart below
            log.debug("killing a command from a fresh exec failed", exc_info=True)
        try:
            docker_call(box.restart, timeout=0)
        except Exception as exc:  # noqa: BLE001 - the container is gone
            raise self._lost(box, exc) from exc
        ended.wait(HOST_KILL_WAIT_S)
        return "the host restarted the container on its filesystem (files kept, processes gone)"

    def _start_again(self, box: Any, cause: str) -> None:
        """Start the stopped ``box`` again (its filesystem as the command left it)."""
        try:
            docker_call(box.start)
            deadline = time.monotonic() + 10.0
            while True:
                docker_call(box.reload)
                if box.status == "running" or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001 - it cannot run again
            raise SandboxLostError(self._lost_text(box, f"{cause}; starting it again failed: {exc}")) from exc
        if box.status != "running":
            raise SandboxLostError(self._lost_text(box, f"{cause}; it did not start again"))

    def _exec_create(self, box: Any, cmd: list[str], **kwargs: Any) -> str:
        import docker

        try:
            return docker_call(self.client.api.exec_create, box.id, cmd, **kwargs)["Id"]
        except docker.errors.APIError as exc:
            raise self._lost(box, exc) from exc

    def _lost(self, box: Any, exc: BaseException, wait: float = 0.0,
              since: float | None = None) -> BaseException:
        """``exc`` as a :class:`SandboxLostError` naming the cause seen when ``box`` is no
        longer running (polled for up to ``wait`` seconds: a killed container is marked exited
        a little later)."""
        if isinstance(exc, SandboxLostError | DaemonUnavailableError):
            return exc
        stopped = self._stop_cause(box, since, wait)
        if stopped is None:
            return exc
        return SandboxLostError(f"{self._lost_text(box, stopped[1])} ({type(exc).__name__}: {exc})")

    @staticmethod
    def _lost_text(box: Any, cause: str) -> str:
        return f"the container {box.short_id} is gone: {cause}; its state since the last snapshot is lost"

    def _stop_cause(self, box: Any, since: float | None, wait: float = 0.0) -> tuple[bool, str] | None:
        """None while ``box`` runs (polled for up to ``wait`` s), else ``(by_itself, cause)``:
        ``by_itself`` when the container's init ended during the command begun at ``since``
        (its processes were killed from inside: the daemon recorded a ``die`` and no ``kill``),
        False when it was killed from outside, removed, or the daemon restarted or is gone."""
        import docker

        deadline = time.monotonic() + wait
        while True:
            try:
                docker_call(box.reload)
            except docker.errors.NotFound:
                return False, "the container was removed"
            except Exception as exc:  # noqa: BLE001 - the daemon is unreachable
                return False, f"the Docker daemon does not answer ({type(exc).__name__})"
            if box.status != "running":
                break
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        state = box.attrs.get("State") or {}
        what = f"status {box.status}, exit code {state.get('ExitCode')}"
        if state.get("OOMKilled"):
            what += ", out of memory"
        if since is None:
            return False, f"it stopped before the command ran ({what}): the Docker daemon restarted or it was killed"
        try:
            events = list(self.client.events(since=since - 1, until=time.time(), decode=True,
                                             filters={"container": box.id}))
        except Exception as exc:  # noqa: BLE001 - the daemon went away
            return False, f"{what}; the Docker daemon does not answer ({type(exc).__name__})"
        actions = [e.get("Action") or e.get("status") for e in events]
        if "kill" in actions:
            signal_ = next(e for e in events if (e.get("Action") or e.get("status")) == "kill")
            sig = ((signal_.get("Actor") or {}).get("Attributes") or {}).get("signal", "?")
            return False, f"it was killed from outside the sandbox (signal {sig}; {what})"
        if "die" not in actions:
            return False, f"{what}, with no record of its exit: the Docker daemon restarted"
        return True, f"the container's init ended: {what}"

    def _retry_if_fresh(self, fn: Any) -> Any:
        """``fn()``; if it finds the container gone while nothing had run in it yet (a warm
        container that a daemon restart stopped), start the same image again (exactly the same
        state) and call ``fn()`` once more."""
        fresh, self._fresh = self._fresh, False
        try:
            return fn()
        except SandboxLostError:
            if not fresh or self._image is None:
                raise
        log.warning("the container for %s died before use; starting a new one", self._image)
        self._remove(self.container)
        self.container = self._start(self._image)
        return fn()

    # ---- the backend interface -------------------------------------------------------
    def reset(self, row: dict[str, Any]) -> None:
        self._replace(self.instance_image(row))

    def run(self, command: str, timeout: float, kill_after_bytes: int) -> CommandResult:
        return self._retry_if_fresh(
            lambda: self._exec(self.container, command, timeout, kill_after_bytes))

    def capture(self, timeout: float | None = None, warm: bool = True) -> DockerState:
        """Commit the container as a snapshot image. ``timeout``: the step's timeout; the host
        waits ``timeout`` + :data:`SNAPSHOT_GRACE_S` seconds for the daemon's commit (the disk
        quota bounds what it reads, but a daemon call has no deadline of its own), then raises
        :class:`SnapshotTimeoutError`: the container is untouched and the env goes on, and the
        image the commit makes later is removed as soon as the daemon answers."""
        tag = uuid.uuid4().hex[:16]
        name = f"{SNAPSHOT_REPO}:{tag}"
        limit = None if timeout is None else timeout + SNAPSHOT_GRACE_S
        fresh = self._fresh
        self._retry_if_fresh(lambda: self._commit(self.container, tag, limit))
        self._fresh = fresh  # a snapshot runs nothing in the container
        state = _tracked(self.client, name)
        if warm:
            self._warm_up(name)
        return state

    def _commit(self, box: Any, tag: str, limit: float | None) -> None:
        """``docker commit`` of ``box`` as ``SNAPSHOT_REPO:tag`` on a thread of its own, waited
        for ``limit`` seconds (None: until it ends); a commit that answers later has its image
        removed by that thread (:meth:`settle` waits for such threads)."""
        name = f"{SNAPSHOT_REPO}:{tag}"
        lock = threading.Lock()
        done = threading.Event()
        late = threading.Event()  # the caller stopped waiting
        failure: list[BaseException] = []

        def commit() -> None:
            # no pause: between steps no process of the agent's is left (every step is reaped)
            try:
                docker_call(self.client.api.commit, box.id, repository=SNAPSHOT_REPO, tag=tag, pause=False)
            except Exception as exc:  # noqa: BLE001 - raised by the caller, or dropped when late
                failure.append(exc)
            with lock:
                done.set()
            if late.is_set() and not failure:
                _remove_image(self.client, name)

        thread = threading.Thread(target=commit, daemon=True, name="bpo-swe-commit")
        thread.start()
        if not done.wait(limit):
            with lock:
                if not done.is_set():
                    late.set()
            if late.is_set():
                self._late_commits = [t for t in self._late_commits if t.is_alive()] + [thread]
                raise SnapshotTimeoutError(
                    f"the host could not take a snapshot within {limit:g} s (the step's timeout + "
                    f"{SNAPSHOT_GRACE_S:g} s): the Docker daemon's commit of the container did not "
                    f"answer in time; the env is unchanged, and the image is removed when the commit ends")
        if failure:
            raise self._lost(box, failure[0]) from failure[0]

    def settle(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for snapshot commits the host stopped waiting for (their
        images are removed as they end); whether none is left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._late_commits:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self._late_commits = [t for t in self._late_commits if t.is_alive()]
        return not self._late_commits

    def apply(self, state: DockerState, row: dict[str, Any] | None) -> None:
        self._replace(state.image)

    def portable(self, state: DockerState, row: dict[str, Any]) -> bytes:
        box = self._start(state.image)
        try:
            stream, _ = docker_call(box.get_archive, "/testbed")
            return b"".join(stream)
        finally:
            self._remove(box)

    def from_portable(self, data: bytes, row: dict[str, Any]) -> DockerState:
        check_testbed_archive(data)  # the row names the image; the bytes only the files of /testbed
        box = self._start(self.instance_image(row))
        try:
            docker_call(box.exec_run, ["rm", "-rf", "/testbed"])
            docker_call(box.put_archive, "/", data)
            tag = uuid.uuid4().hex[:16]
            docker_call(box.commit, repository=SNAPSHOT_REPO, tag=tag)
            return _tracked(self.client, f"{SNAPSHOT_REPO}:{tag}")
        finally:
            self._remove(box)

    def release(self, state: DockerState) -> None:
        future = self._warm.pop(state.image, None)
        if future is not None:
            try:
                self._remove(future.result())
            except Exception:  # noqa: BLE001 - it never started: nothing to remove
                pass
        finalizer = _image_finalizers.get(state.image)
        if finalizer is not None:
            finalizer()  # removes the image once (a later garbage collection does nothing)
        else:
            _remove_image(self.client, state.image)

    def model_patch(self, row: dict[str, Any], timeout: float = DIFF_TIMEOUT_S) -> str:
        """The diff of ``/testbed`` against base_commit (``git add -A`` into a scratch index, so
        the container's own index is left as it is); its git is killed past ``timeout`` seconds
        (then the patch is empty)."""
        index = "/tmp/.bpo_patch_index"
        script = (
            f"rm -f {index}; cp .git/index {index} 2>/dev/null; export GIT_INDEX_FILE={index}; "
            f"git -c core.fileMode=false add -A && git diff --cached --binary {row['base_commit']}; "
            f"rc=$?; rm -f {index}; exit $rc"
        )
        result = self._exec(self.container, script, timeout, 256 << 20, agent=False)
        return result.output if result.exit_code == 0 else ""

    def run_eval(self, row: dict[str, Any], patch: str, script: str, timeout: float,
                 log_path: Path) -> CommandResult:
        """Grade in a fresh container of the instance image (the patch applied, the test
        machinery it changed reset); its whole log (``harness.runner_script``) is copied out to
        ``log_path``."""
        from bpo_envs.swebench import harness

        box = self._start(self.instance_image(row), network=self.grading_network)
        try:
            docker_call(box.put_archive, "/", _tar({"bpo_eval/patch.diff": patch.encode(),
                                                    "bpo_eval/eval.sh": script.encode()}))
            runner = harness.runner_script("/bpo_eval/patch.diff", "/bpo_eval/eval.sh",
                                           "/bpo_eval/test_output.txt", row)
            result = self._exec(box, runner, timeout, 256 << 20, agent=False)
            harness.write_log(self._copy_out(box, "/bpo_eval/test_output.txt", harness.MAX_LOG_COPY),
                              log_path, result.timed_out)
            return result
        finally:
            self._remove(box)

    @staticmethod
    def _copy_out(box: Any, path: str, limit: int) -> bytes:
        """The first ``limit`` + 1 bytes of the regular file ``path`` in ``box`` (empty when it
        is missing or not a regular file: code under test wrote it)."""
        import docker

        try:
            stream, _ = docker_call(box.get_archive, path)
        except docker.errors.NotFound:
            return b""
        reader = _StreamReader(stream)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for member in tar:
                if member.isreg():
                    fh = tar.extractfile(member)
                    return fh.read(limit + 1) if fh is not None else b""
                return b""
        return b""

    def close(self) -> None:
        for image in list(self._warm):
            future = self._warm.pop(image)
            try:
                self._remove(future.result())
            except Exception:  # noqa: BLE001 - it never started: nothing to remove
                pass
        self._pool.shutdown(wait=True)
        if self.container is not None:
            self._remove(self.container)
            self.container = None
        self._reap(wait=True)
        _retry_pending_images()
