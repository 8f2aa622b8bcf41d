"""``BPO-SWEBench-v0``: SWE-bench instances as a snapshottable shell env, graded by swebench."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import tempfile
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bpo_envs.core import SnapshotEnv, SnapshotError
from bpo_envs.swebench import harness, tampering
from bpo_envs.swebench.instances import load_instances
from bpo_envs.swebench.local import DIFF_TIMEOUT_S, SandboxLimits
from bpo_envs.swebench.output import CommandResult
from bpo_envs.swebench.owners import run_dir

SUBMIT = "submit"
MINI_SWE_SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
BACKENDS = ("local", "docker")
PROMPTS = ("bpo", "mini-swe-agent")
TEST_OUTPUT_CHARS = 4000
"""How much of the grading log's tail ``info["test_output"]`` keeps."""

INTRO = """You are working in a checkout of {repo} at /testbed (a git repository at the commit the
issue was reported against). Fix the issue below by editing the source code.

Each action is one bash command, run in a fresh shell in /testbed (timeout {timeout:g} s); you
see its output and exit code. When you are done, send `submit` (or a command whose output's
first line is {mini}). Your changes (git diff against the base commit) are then graded by the
repository's tests.

<issue>
{problem}
</issue>"""

MINI_INTRO = """<pr_description>
Consider the following PR description:
{problem}
</pr_description>

<instructions>
You are a software engineer working in a checkout of {repo} at /testbed. Make changes to
non-test files in /testbed so that the issue in the PR description is fixed, in a way that is
general and consistent with the codebase. Do not modify tests or configuration files.

Each of your actions is ONE bash command (or commands joined with && or ||), executed in a new
subshell in /testbed (timeout {timeout:g} s); directory and environment changes do not persist.
Use non-interactive flags; avoid interactive tools such as vi or nano.

When you are done, and cannot make further progress, issue exactly:
git add -A && git diff --cached && echo {mini}
You cannot continue working on this task after submitting.
</instructions>"""

# commands for check_snapshot's random walks: reads, edits, deletions, new files, modes, links
# (no timestamps or directory sizes: restores do not keep them)
_SAMPLE_ACTIONS = (
    "ls -AF",
    "find . -path ./.git -prune -o -type f -printf '%M %s %p\\n' | sort",
    "git status --short",
    "cat README.md | head -5",
    "echo 'note' >> README.md",
    "rm -f README.md",
    "mkdir -p scratch && echo data > scratch/file.txt",
    "rm -rf scratch",
    "chmod +x setup.cfg pyproject.toml 2>/dev/null; stat -c '%A %n' *",
    "ln -sf README.md link.md && readlink link.md",
    "git stash list; git log --oneline | head -3",
    "find . -path ./.git -prune -o -type f -print | sort | head -20",
    "sed -i 's/def /def  /' $(git ls-files '*.py' | head -1) && git diff --stat",
    "",
    "printf 'x%.0s' $(seq 1 20000)",
)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def grading_hint(verdict: harness.Grade, row: dict[str, Any]) -> str | None:
    """Why a grading probably says nothing about the patch, or None."""
    if not verdict.patch_applied:
        return ("grading hint: the patch did not apply to the base commit (git apply and patch "
                "both failed); see test_output")
    if row["PASS_TO_PASS"] and verdict.pass_to_pass == 0.0:
        return (f"grading hint: all {len(row['PASS_TO_PASS'])} PASS_TO_PASS tests failed, so the "
                "test command probably did not run (a missing interpreter or package, a syntax "
                "error at import, or a timeout); see the tail of test_output")
    return None


class SWEBenchEnv(SnapshotEnv):
    """SWE-bench(-Verified) instances: one bash command per step in ``/testbed``, then grading.

    Args:
        instances: a SWE-bench json / jsonl / parquet file, a swebench task-repo folder, a list of
            rows, or None for the bundled instances (small real repos, built on first use).
        backend: ``"local"`` (bubblewrap sandbox over a working copy; rows need ``repo_path``)
            or ``"docker"`` (real SWE-bench images or a local image, via docker-py).
        step_timeout: seconds one command may run before it is killed. The deadline is kept
            from the host (docker: 3 s later the host kills what the command left running,
            even when it froze or killed its own ``timeout``); the agent's own kills of its
            sandbox (``kill -9 -1``, ``kill 1``) are observations (the container is started
            again on its filesystem). See docs/reliability.md.
        eval_timeout: seconds grading may take (the harness's default, 1,800), kept from the
            host the same way: the host's diff of the testbed (at most ``DIFF_TIMEOUT_S``) and
            the test run share them, so grading answers within ``eval_timeout`` + 15 s. The whole test log is graded (up to
            ``harness.TEST_LOG_BYTES``), not the observation's head and tail.
        max_episode_steps: steps before truncation.
        grade_on_truncation: at the step limit without a submission, grade the diff as if
            submitted (False, as mini-swe-agent and the leaderboards: no submission scores 0).
        grading_network: docker backend: put the grading container on Docker's default network
            (False, the default: grading runs offline, as the agent's own container). The
            agent's patch runs during grading (the tests import its code), so True lets it
            reach the host's services (a Ray head, a vLLM server, through the bridge's gateway)
            and the internet: an opt-in for rows whose eval script installs packages. The local
            sandbox never has a network (its eval runs the host's Python; nothing to install).
        prompt: ``"bpo"`` (the intro below, ``[exit code: N]`` observations) or
            ``"mini-swe-agent"`` (its PR-description intro and ``<returncode>``/``<output>``
            observations, head/tail and warning past 10,000 characters; see
            ``bpo_envs.swebench.output``).
        images_dir: docker backend: a folder of ``docker save`` tarballs loaded when an
            instance's image is missing (``bpo_envs.swebench.images``); nothing is pulled.
        split: with a Hugging Face dataset name as ``instances``, the split (default ``test``).
        instance_ids: keep only these instances (in this order); an unknown id is an error.
        max_output_bytes: a command printing more than this is killed (its output is elided).
        python: the interpreter the local sandbox exposes (default: the one running this).
        cpu_seconds: CPU seconds one process of a command may use (None: ``step_timeout``
            rounded up; the grading run gets at least ``eval_timeout``).
        memory_bytes: address space of one process (docker: the container's memory limit).
        max_processes: processes and threads one command may have at once (docker: the
            container's ``pids_limit``).
        max_file_bytes: the largest file a command may write.
        disk_quota_bytes: local backend: how much ``/testbed`` may grow over the initial checkout
            (a command leaving it larger is undone) and the size of ``/tmp`` and ``/dev/shm``;
            docker: how much the container may write since its last reset or restore (a command
            going past it is killed).
        cpus: docker backend: the container's CPU quota, in CPUs (an agent's busy loop takes at
            most this from the envs beside it; the grading run gets the same).
            See ``bpo_envs.swebench.local`` for where each limit is enforced.
        docker_image: for ``backend="docker"``, the image rows without ``image`` are built on
            (the local image made by ``bpo-gym-setup swebench``) when they carry
            ``repo_path``; otherwise swebench's ``sweb.eval.*`` image names are used.

    ``instances`` may also be a Hugging Face dataset name (``"princeton-nlp/SWE-bench_Verified"``),
    read from the local cache only (``bpo_envs.swebench.instances``). The docker backend runs
    commands with ``/root/.bashrc`` sourced (``BASH_ENV``): in the official images the agent's
    ``python`` is the instance's conda env ``testbed``. The local backend runs the host's Python
    (faithful for the bundled repos only, not for a Verified instance's pinned environment).

    Reward: 1.0 when swebench resolves the instance (every FAIL_TO_PASS and PASS_TO_PASS test
    passes), else 0.0. ``info`` after grading: ``resolved``, ``fail_to_pass`` and
    ``pass_to_pass`` (fractions), ``tests_status``, ``patch``, ``patch_applied``,
    ``test_output`` (the grading log's last 4,000 characters), ``tampered`` (the paths of the
    test machinery the patch changed, which grading reset before the tests ran: conftest.py,
    pytest's configuration, root modules shadowing pytest or the standard library, ...; the
    first that fit in 4,000 characters, the observation gives the count; see
    ``bpo_envs.swebench.tampering`` and docs/reliability.md) and, when the test run looks
    broken (every PASS_TO_PASS test failed, or the patch did not apply), ``grading_hint``. At the
    step limit without grading: ``submitted: False`` and reward 0.
    """

    # step_may_block stays True (the default): a step runs a command in a sandbox or container
    has_expert = True  # the row's gold patch, then submit

    def __init__(
        self,
        instances: str | Path | Iterable[Mapping[str, Any]] | None = None,
        backend: str = "local",
        *,
        step_timeout: float = 60.0,
        eval_timeout: float = 1800.0,
        max_episode_steps: int = 50,
        grade_on_truncation: bool = False,
        grading_network: bool = False,
        prompt: str = "bpo",
        images_dir: str | Path | None = None,
        split: str | None = None,
        instance_ids: Iterable[str] | None = None,
        max_output_bytes: int = 64 << 20,
        python: str | None = None,
        docker_image: str | None = None,
        cpu_seconds: int | None = None,
        memory_bytes: int = 4 << 30,
        max_processes: int = 512,
        max_file_bytes: int = 1 << 30,
        disk_quota_bytes: int = 2 << 30,
        cpus: float = 1.0,
        render_mode: str | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if prompt not in PROMPTS:
            raise ValueError(f"prompt must be one of {PROMPTS}, got {prompt!r}")
        for name, flag in (("grade_on_truncation", grade_on_truncation),
                           ("grading_network", grading_network)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        if images_dir is not None and backend != "docker":
            raise ValueError("images_dir= is for backend='docker' (the local backend uses no images)")
        for name, value in (("step_timeout", step_timeout), ("eval_timeout", eval_timeout)):
            if not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(max_output_bytes, int) or max_output_bytes < 1024:
            raise ValueError(f"max_output_bytes must be an int >= 1024, got {max_output_bytes!r}")
        limits = SandboxLimits(cpu_seconds=cpu_seconds, memory_bytes=memory_bytes,
                               max_processes=max_processes, max_file_bytes=max_file_bytes,
                               disk_quota_bytes=disk_quota_bytes, cpus=cpus)
        super().__init__(max_episode_steps=max_episode_steps, render_mode=render_mode)
        rows = load_instances(instances, split=split, instance_ids=instance_ids)
        self._rows = {row["instance_id"]: row for row in rows}
        self._ids = [row["instance_id"] for row in rows]
        self.backend_name = backend
        self.step_timeout = float(step_timeout)
        self.eval_timeout = float(eval_timeout)
        self.max_output_bytes = int(max_output_bytes)
        self.grade_on_truncation = grade_on_truncation
        self.grading_network = grading_network
        self.prompt = prompt
        identity = hashlib.blake2b(
            repr([(r["instance_id"], r["base_commit"], r.get("repo_path"), r.get("image"))
                  for r in rows]).encode(),
            digest_size=8,
        ).hexdigest()
        self._kind = ("SWEBench", backend, identity, self.step_timeout, self.max_output_bytes,
                      python, docker_image, self.max_episode_steps, prompt, grade_on_truncation,
                      grading_network, self.eval_timeout)
        if backend == "local":
            from bpo_envs.swebench.local import LocalBackend

            self._backend: Any = LocalBackend(self._kind, python=python, limits=limits)
        else:
            from bpo_envs.swebench.docker_backend import DockerBackend

            self._backend = DockerBackend(self._kind, image=docker_image, limits=limits,
                                          images_dir=images_dir, grading_network=grading_network)
        self._backend.check(rows)
        self._finalizer = weakref.finalize(self, self._backend.close)
        self._row: dict[str, Any] | None = None

    # ---- tasks ---------------------------------------------------------------------------
    def task_ids(self) -> list[str]:
        return list(self._ids)

    def instance(self, task_id: str | None = None) -> dict[str, Any]:
        """The SWE-bench row of ``task_id`` (default: the current task)."""
        key = self.task_id if task_id is None else task_id
        return dict(self._rows[key])

    def _intro(self, row: dict[str, Any]) -> str:
        template = MINI_INTRO if self.prompt == "mini-swe-agent" else INTRO
        return template.format(repo=row["repo"], timeout=self.step_timeout, mini=MINI_SWE_SUBMIT,
                            problem=row["problem_statement"].strip())

    def _reset_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        row = self._rows[task_id]
        self._backend.reset(row)
        self._row = row
        return self._intro(row), {"instance_id": task_id, "repo": row["repo"]}

    # ---- steps ---------------------------------------------------------------------------
    def _invalid(self, why: str) -> tuple[str, float, bool, dict[str, Any]]:
        return f"Invalid action: {why}", 0.0, False, {"invalid_action": True}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        assert self._row is not None
        last = self.elapsed_steps + 1 >= self.max_episode_steps
        command = action.strip()
        if command == SUBMIT:
            return self._grade("Submitted.")
        if not command:
            obs, reward, done, info = self._invalid("empty command; send one bash command or `submit`")
        elif "\0" in action:
            obs, reward, done, info = self._invalid("the command contains a NUL character")
        elif not _encodable(action):
            obs, reward, done, info = self._invalid("the command is not valid UTF-8 text (lone surrogates)")
        elif len(action) > self.action_space.max_length:
            obs, reward, done, info = self._invalid(
                f"the command is {len(action)} characters long; the limit is "
                f"{self.action_space.max_length}"
            )
        else:
            result: CommandResult = self._backend.run(action, self.step_timeout,
                                                      self.max_output_bytes)
            if self.prompt == "mini-swe-agent":
                obs = result.mini_observation(action)
            else:
                obs = result.observation(self.step_timeout)
            info = {"exit_code": result.exit_code, "timed_out": result.timed_out}
            reward, done = 0.0, False
            if result.output.lstrip().split("\n", 1)[0].strip() == MINI_SWE_SUBMIT:
                return self._grade(obs + "\nSubmitted.")
        if last:
            if not self.grade_on_truncation:
                info.update({"submitted": False, "resolved": False})
                return obs + "\nStep limit reached without a submission (scored 0).", 0.0, False, info
            obs2, reward, done, info2 = self._grade(obs + "\nStep limit reached; graded as submitted.")
            info2.update({k: v for k, v in info.items() if k not in info2})
            return obs2, reward, False, info2
        return obs, reward, done, info

    def _grade(self, prefix: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Grade the testbed's diff against base_commit in a fork; the episode ends."""
        row = self._row
        assert row is not None
        started = time.monotonic()
        patch = self._backend.model_patch(row, min(DIFF_TIMEOUT_S, self.eval_timeout))
        # the test run gets what the diff left of eval_timeout (docs/reliability.md#grading)
        left = max(1.0, self.eval_timeout - (time.monotonic() - started))
        plan = harness.eval_plan(row)
        with tempfile.TemporaryDirectory(prefix="eval-", dir=run_dir()) as tmp:
            log_path = Path(tmp) / "test_output.txt"
            # the whole log (up to harness.TEST_LOG_BYTES) is graded, not an observation of it
            result = self._backend.run_eval(row, patch, plan.script, left, log_path)
            verdict = harness.grade(plan, str(log_path))
            tail = harness.log_tail(log_path, TEST_OUTPUT_CHARS)
        # the reset step's report comes first on the run's own output, before any of the patch's
        # code ran (bpo_envs.swebench.tampering); without it the tests did not run as graded
        report = tampering.read_report(result.output)
        tampered, reset_count = report if report is not None else ([], 0)
        unreset = report is None and not result.timed_out and (
            verdict.patch_applied or harness.MACHINERY_FAILED in tail)
        if unreset:
            verdict = dataclasses.replace(verdict, resolved=False)
        reward = 1.0 if verdict.resolved else 0.0
        obs = (
            f"{prefix}\nGrading: {'RESOLVED' if verdict.resolved else 'not resolved'} "
            f"(FAIL_TO_PASS {verdict.fail_to_pass:.2f}, PASS_TO_PASS {verdict.pass_to_pass:.2f})"
        )
        if reset_count:
            shown = tampered[:20]
            more = f" (and {reset_count - len(shown)} more)" if reset_count > len(shown) else ""
            obs += (f"\nThe patch changed the repository's test machinery; grading reset it and ran "
                    f"the repository's own: {', '.join(shown)}{more}")
        info = {
            "won": verdict.resolved,
            "resolved": verdict.resolved,
            "resolution_status": verdict.status,
            "patch_applied": verdict.patch_applied,
            "fail_to_pass": verdict.fail_to_pass,
            "pass_to_pass": verdict.pass_to_pass,
            "tests_status": verdict.report,
            "patch": patch,
            "submitted": True,
            "test_output": tail,
            "tampered": tampered,
        }
        hint = (harness.MACHINERY_FAILED.lstrip("> ").replace("bpo-gym: ", "grading hint: ") + "; scored 0"
                if unreset else grading_hint(verdict, row))
        if hint:
            info["grading_hint"] = hint
            obs += f"\n{hint}"
        return obs, reward, True, info

    # ---- snapshots -----------------------------------------------------------------------
    def _snapshot_kind(self) -> Any:
        return self._kind

    def _get_state(self) -> Any:
        # bounded by the step's timeout (docker: SnapshotTimeoutError past it and a grace)
        return (self._row["instance_id"] if self._row else None, self._backend.capture(self.step_timeout))

    def _set_state(self, state: Any) -> None:
        task_id, inner = state
        self._row = self._rows[task_id] if task_id is not None else None
        self._backend.apply(inner, self._row)

    def _portable_task_state(self, inner: Any) -> Any:
        task_id, state = inner
        return task_id, self._backend.portable(state, self._rows[task_id])

    def _task_state_from_portable(self, obj: Any) -> Any:
        if not (isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], str) and obj[0] in self._rows):
            raise SnapshotError("portable bytes: not a state of one of this env's instances")
        task_id, data = obj
        return task_id, self._backend.from_portable(data, self._rows[task_id])

    def _release_task_state(self, inner: Any) -> None:
        self._backend.release(inner[1])

    # ---- helpers -------------------------------------------------------------------------
    def expert_actions(self) -> list[str]:
        """Apply the gold patch (reverting local edits first) and submit."""
        if self._row is None:
            raise RuntimeError("call reset() first")
        patch = self._row["patch"]
        if not patch:
            raise ValueError(f"instance {self._row['instance_id']!r} has no gold patch")
        reset = f"git checkout -q {self._row['base_commit']} -- . && git clean -fdq"
        delim = "BPO_GOLD_PATCH_" + hashlib.blake2b(patch.encode(), digest_size=6).hexdigest()
        single = f"{reset} && git apply --whitespace=nowarn - <<'{delim}'\n{patch}\n{delim}"
        if len(single) <= self.action_space.max_length:
            return [single, SUBMIT]
        # a patch longer than one action: write it base64-encoded in chunks, then apply it
        encoded = base64.b64encode(patch.encode()).decode()
        chunk = self.action_space.max_length - 200
        staging = ".bpo_gold_patch.b64"
        actions = [f"{reset} && rm -f {staging}"]
        actions += [f"printf '%s' '{encoded[i:i + chunk]}' >> {staging}" for i in range(0, len(encoded), chunk)]
        actions.append(f"base64 -d {staging} | git apply --whitespace=nowarn - && rm -f {staging}")
        return [*actions, SUBMIT]

    def sample_action(self, rng: np.random.Generator) -> str:
        return _SAMPLE_ACTIONS[int(rng.integers(len(_SAMPLE_ACTIONS)))]

    def close(self) -> None:
        self._finalizer()
        super().close()


