"""The docker backend: SWE-bench images (or a local image for ``repo_path`` rows) via docker-py.

Containers start with ``init=True`` and no network, run ``sleep infinity`` and take one
``docker exec`` per step (``timeout -s KILL`` and ``head -c`` bound time and output). Each
command runs as ``bash -c`` in ``/testbed`` with ``BASH_ENV=/root/.bashrc`` (as mini-swe-agent
and the official images expect: their ``.bashrc`` activates the conda env ``testbed``, so the
agent's ``python`` and ``pytest`` are the instance's), plus mini-swe-agent's non-interactive
variables (``PAGER=cat`` ...). A snapshot is ``container.commit()`` (the whole filesystem; not
processes); restore and fork start a new container from that image; containers are removed
with ``remove(force=True)`` (a plain stop waits for the grace period).

Grading applies the diff of ``/testbed`` against ``base_commit`` (taken in a fork of the final
state) to a fresh container of the instance image with swebench's fallbacks and runs the
swebench eval script there as the harness does (``bash eval.sh``, no ``BASH_ENV``: the script
activates the env itself), on Docker's default network unless ``grading_network=False`` (eval
scripts may ``pip install -e .``). ``portable()`` carries ``/testbed`` only (a tar), rebuilt on
the instance image by the receiver. As in the local backend, nothing outlives its step: when a
command ends, every process but the container's init and main process is killed (with bash
builtins only, so it works under a fork bomb at ``pids_limit``); a snapshot (a filesystem
commit) therefore holds the whole state.

Images: see ``bpo_envs.swebench.images`` (official names, ``images_dir`` tarballs, never a pull).

Limits (``SandboxLimits``): every container gets ``pids_limit`` (max_processes), ``mem_limit``
with no extra swap (memory_bytes, for the whole container) and an ``RLIMIT_FSIZE`` ulimit
(max_file_bytes). The disk quota (disk_quota_bytes) bounds the container's writable layer since
its last reset or restore: with overlay2 its upper directory is measured on the host once a
second during a step, and a step that exceeds it is killed (its files are kept, the observation
says so; docker's own ``storage_opt`` needs xfs project quotas). Under another storage driver the
quota is not enforced (logged once). CPU seconds are not limited per process: the step timeout
bounds a command.
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
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bpo_envs.swebench.images import DEFAULT_IMAGE, ImageStore, docker_client, row_image_names
from bpo_envs.swebench.local import SandboxLimits, disk_usage
from bpo_envs.swebench.output import CommandResult, OutputCollector

log = logging.getLogger(__name__)
SNAPSHOT_REPO = "bpo-gym/swebench-snapshot"
BASH_ENV = "/root/.bashrc"
OWNER_LABEL = "bpo-gym.pid"
"""Label of every container (and so of every snapshot image) with the pid of the process that
made it: several processes may share one engine, and each cleans up only its own."""
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


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass(frozen=True)
class DockerState:
    """A committed image holding the container's filesystem."""

    image: str


class DockerBackend:
    """The env's view of the docker backend (same methods as ``LocalBackend``)."""

    _build_lock = threading.Lock()
    # snapshot images of every backend in this process: a fork restored into another env keeps
    # using an image after its own env closed, so each close() retries all of them
    _all_snapshots: set[str] = set()
    _warned_quota = False

    def __init__(
        self, kind: Hashable, image: str | None = None, limits: SandboxLimits | None = None,
        *, images_dir: str | Path | None = None, grading_network: bool = True,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.client = docker_client()
        self.store = ImageStore(self.client, images_dir)
        self.grading_network = bool(grading_network)
        self.base_image = image or DEFAULT_IMAGE
        self.container: Any = None
        self.max_warm = 2
        self._warm: dict[str, Future] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bpo-swe-warm")
        self._images: dict[str, str] = {}
        self._removals: list[threading.Thread] = []

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
        with tempfile.TemporaryDirectory(prefix="bpo-swe-img-") as tmp:
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
        import docker

        lim = self.limits
        fsize = docker.types.Ulimit(name="fsize", soft=lim.max_file_bytes, hard=lim.max_file_bytes)
        return self.client.containers.run(
            image, ["sleep", "infinity"], detach=True, init=True,
            network_mode=None if network else "none",
            working_dir="/testbed", labels={"bpo-gym": "swebench", OWNER_LABEL: str(os.getpid())},
            pids_limit=lim.max_processes, mem_limit=lim.memory_bytes,
            memswap_limit=lim.memory_bytes, ulimits=[fsize],
        )

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
        self.container = self._take(image)
        self._warm_up(image)
        if old is not None:
            # removing takes ~150 ms; the new container does not wait for it (close() does)
            self._reap()
            thread = threading.Thread(target=self._remove, args=(old,), daemon=True)
            thread.start()
            self._removals.append(thread)

    @staticmethod
    def _remove(box: Any) -> None:
        import docker

        try:
            box.remove(force=True)
        except docker.errors.APIError:
            pass

    def _reap(self, wait: bool = False) -> None:
        for thread in self._removals:
            if wait:
                thread.join()
        self._removals = [t for t in self._removals if t.is_alive()]

    def _upper_dir(self, box: Any) -> Path | None:
        """The host folder of ``box``'s writable layer (overlay2), or None."""
        data = (box.attrs.get("GraphDriver") or {}).get("Data") or {}
        upper = data.get("UpperDir")
        if upper and os.path.isdir(upper):
            return Path(upper)
        if not DockerBackend._warned_quota:
            DockerBackend._warned_quota = True
            log.warning("docker storage driver %r: the disk quota is not enforced",
                        (box.attrs.get("GraphDriver") or {}).get("Name"))
        return None

    def _exec(self, box: Any, script: str, timeout: float, cap: int, agent: bool = True) -> CommandResult:
        """Run ``script``; ``agent``: in the agent's environment (``BASH_ENV``, ``AGENT_ENV``),
        with the disk quota watched, and every process it leaves killed afterwards."""
        # only the inner shell reads BASH_ENV (sourcing a conda activation twice costs time)
        bash_env = f"BASH_ENV={BASH_ENV} " if agent else ""
        # head reads a pipe that processes the command leaves behind may hold open: they are
        # killed before the pipe is closed and head is waited for
        wrapped = (
            f"{REAP}exec 3> >(head -c {cap}) 2>/dev/null; out=$!\n"
            f"{bash_env}timeout -s KILL {timeout:g} bash -c {shlex.quote(script)} </dev/null >&3 2>&3\n"
            "rc=$?; __bpo_reap $out; exec 3>&-; wait $out; exit $rc"
        )
        api = self.client.api
        exec_id = api.exec_create(box.id, ["bash", "-c", wrapped], workdir="/testbed",
                                  environment=dict(AGENT_ENV) if agent else None)["Id"]
        collector = OutputCollector(cap)
        started = time.monotonic()
        upper = self._upper_dir(box) if agent else None
        over = threading.Event()
        done = threading.Event()
        quota = self.limits.disk_quota_bytes

        def watch() -> None:
            while not done.wait(1.0):
                if disk_usage(upper) > quota:
                    over.set()
                    api.exec_start(api.exec_create(box.id, ["bash", "-c", REAP + "__bpo_reap"])["Id"])
                    return

        watcher = threading.Thread(target=watch, daemon=True) if upper is not None else None
        if watcher is not None:
            watcher.start()
        try:
            for chunk in api.exec_start(exec_id, stream=True):
                collector.feed(chunk)
        finally:
            done.set()
            if watcher is not None:
                watcher.join()
        rc = api.exec_inspect(exec_id)["ExitCode"]
        text, elided = collector.result()
        # timeout(1) -s KILL exits 128 + 9 when it fired
        timed_out = rc == 137 and time.monotonic() - started >= timeout - 0.5 and not over.is_set()
        killed = collector.total_bytes >= cap
        if upper is not None and (over.is_set() or disk_usage(upper) > quota):
            sep = "" if not text or text.endswith("\n") else "\n"
            what = "the command was killed" if over.is_set() else "after this command"
            text += (f"{sep}[disk quota exceeded ({what}): the container's writes since its last "
                     f"reset or restore exceed {quota} bytes; delete files before going on]")
        elif agent and rc == 137 and not timed_out:
            sep = "" if not text or text.endswith("\n") else "\n"
            text += (f"{sep}[killed by SIGKILL: most likely the container's memory limit of "
                     f"{self.limits.memory_bytes} bytes]")
        return CommandResult(text, 124 if timed_out else rc, timed_out, killed and not timed_out, elided)

    # ---- the backend interface -------------------------------------------------------
    def reset(self, row: dict[str, Any]) -> None:
        self._replace(self.instance_image(row))

    def run(self, command: str, timeout: float, kill_after_bytes: int) -> CommandResult:
        return self._exec(self.container, command, timeout, kill_after_bytes)

    def capture(self, warm: bool = True) -> DockerState:
        tag = uuid.uuid4().hex[:16]
        # no pause: between steps no process of the agent's is left (every step is reaped)
        self.client.api.commit(self.container.id, repository=SNAPSHOT_REPO, tag=tag, pause=False)
        name = f"{SNAPSHOT_REPO}:{tag}"
        self._all_snapshots.add(name)
        if warm:
            self._warm_up(name)
        return DockerState(name)

    def apply(self, state: DockerState, row: dict[str, Any] | None) -> None:
        self._replace(state.image)

    def portable(self, state: DockerState, row: dict[str, Any]) -> bytes:
        box = self._start(state.image)
        try:
            stream, _ = box.get_archive("/testbed")
            return b"".join(stream)
        finally:
            box.remove(force=True)

    def from_portable(self, data: bytes, row: dict[str, Any]) -> DockerState:
        box = self._start(self.instance_image(row))
        try:
            box.exec_run(["rm", "-rf", "/testbed"])
            box.put_archive("/", data)
            tag = uuid.uuid4().hex[:16]
            box.commit(repository=SNAPSHOT_REPO, tag=tag)
            self._all_snapshots.add(f"{SNAPSHOT_REPO}:{tag}")
            return DockerState(f"{SNAPSHOT_REPO}:{tag}")
        finally:
            box.remove(force=True)

    def release(self, state: DockerState) -> None:
        import docker

        future = self._warm.pop(state.image, None)
        if future is not None:
            try:
                self._remove(future.result())
            except Exception:  # noqa: BLE001 - it never started: nothing to remove
                pass
        try:
            self.client.images.remove(state.image, noprune=False)
            self._all_snapshots.discard(state.image)
        except docker.errors.ImageNotFound:
            self._all_snapshots.discard(state.image)
        except docker.errors.APIError:
            pass  # still used by a container; retried at close()

    def model_patch(self, row: dict[str, Any]) -> str:
        """The diff of ``/testbed`` against base_commit (``git add -A`` into a scratch index, so
        the container's own index is left as it is)."""
        index = "/tmp/.bpo_patch_index"
        script = (
            f"rm -f {index}; cp .git/index {index} 2>/dev/null; export GIT_INDEX_FILE={index}; "
            f"git -c core.fileMode=false add -A && git diff --cached --binary {row['base_commit']}; "
            f"rc=$?; rm -f {index}; exit $rc"
        )
        result = self._exec(self.container, script, 120, 256 << 20, agent=False)
        return result.output if result.exit_code == 0 else ""

    def run_eval(self, row: dict[str, Any], patch: str, script: str, timeout: float) -> str:
        from bpo_envs.swebench import harness

        box = self._start(self.instance_image(row), network=self.grading_network)
        try:
            box.put_archive("/", _tar({"bpo_eval/patch.diff": patch.encode(),
                                       "bpo_eval/eval.sh": script.encode()}))
            runner = harness.runner_script("/bpo_eval/patch.diff", "/bpo_eval/eval.sh")
            result = self._exec(box, runner, timeout, 256 << 20, agent=False)
        finally:
            box.remove(force=True)
        log = result.output
        if result.timed_out:
            log += "\n" + harness.timeout_marker() + "\n"
        return log

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
        for name in list(self._all_snapshots):
            self.release(DockerState(name))
