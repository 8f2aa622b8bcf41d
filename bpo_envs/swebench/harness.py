"""Glue to the ``swebench`` harness (4.x): eval scripts from rows, grading of test logs.

``swebench`` is imported lazily (its import costs ~2 s). Why 4.x: swebench 5.x's
``make_test_spec`` needs the 5.x columns (``image``, ``eval_script``, ``log_parser``,
``eval_type``) and 5.x no longer has the repo/version table (``MAP_REPO_VERSION_TO_SPECS``)
that turns a classic Verified row into an eval script; 4.1.0 still builds eval scripts from
classic rows. Rows that carry the 5.x columns are honoured too: their ``eval_script`` is run as
is and ``log_parser`` is looked up by name among swebench's parsers.

A row for a repository swebench does not know (the bundled ones) carries ``test_cmd`` and
``log_parser``; it is registered into swebench's tables so that swebench's own
``make_eval_script_list`` and ``get_logs_eval`` handle it like any other repository.
We never call ``make_test_spec``: for many Verified repos it downloads requirements files.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bpo_envs.swebench import tampering

_PARSER_MODULES = ("python", "javascript", "c", "go", "java", "php", "ruby", "rust")
CONDA_SHIM = """# bpo-gym: stands in for conda in sandboxes without it; swebench eval scripts
# call `source /opt/miniconda3/bin/activate` and `conda activate testbed`.
conda() { :; }
"""


def swebench_modules() -> dict[str, Any]:
    """Import the harness pieces used here; raise with the install command when missing."""
    try:
        import swebench
        from swebench.harness import constants, grading, log_parsers
        from swebench.harness.test_spec import create_scripts, test_spec
    except ImportError as exc:
        raise RuntimeError(
            "BPO-SWEBench-v0 grades with the swebench harness (4.x): "
            "pip install 'bpo-gym[swe]'  (or pip install 'swebench>=4.1,<5')"
        ) from exc
    version = getattr(swebench, "__version__", "?")  # third-party: swebench may not set it
    if not hasattr(constants, "MAP_REPO_VERSION_TO_SPECS"):  # third-party: swebench 5.x removed it
        raise RuntimeError(
            f"swebench {version} has no MAP_REPO_VERSION_TO_SPECS "
            "(5.x cannot build eval scripts from classic rows): pip install 'swebench>=4.1,<5'"
        )
    return {
        "constants": constants,
        "grading": grading,
        "log_parsers": log_parsers,
        "create_scripts": create_scripts,
        "test_spec": test_spec,
        "version": version,
    }


def _parser_by_name(name: str) -> Any:
    for module in _PARSER_MODULES:
        try:
            mod = importlib.import_module(f"swebench.harness.log_parsers.{module}")
        except ImportError:
            continue
        fn = getattr(mod, name, None)  # third-party: a swebench parser module, by the row's parser name
        if callable(fn):
            return fn
    raise ValueError(f"swebench has no log parser named {name!r}")


def _register(row: dict[str, Any], sb: dict[str, Any]) -> None:
    """Make swebench's tables know ``row``'s repo/version (for repos it does not ship)."""
    c = sb["constants"]
    repo, version = row["repo"], row["version"]
    known = repo in c.MAP_REPO_VERSION_TO_SPECS and version in c.MAP_REPO_VERSION_TO_SPECS[repo]
    if known:
        return
    test_cmd = row.get("test_cmd")
    if not test_cmd and not row.get("eval_script"):
        raise ValueError(
            f"instance {row['instance_id']!r}: swebench {sb['version']} has no specs for "
            f"{repo} version {version!r}; give the row a `test_cmd` (and `log_parser`) or an "
            "`eval_script`"
        )
    c.MAP_REPO_VERSION_TO_SPECS.setdefault(repo, {})[version] = {
        "python": "3", "test_cmd": test_cmd or "true",
    }
    c.MAP_REPO_TO_EXT.setdefault(repo, "py")
    sb["log_parsers"].MAP_REPO_TO_PARSER.setdefault(
        repo, _parser_by_name(row.get("log_parser") or "parse_log_pytest")
    )


@dataclass
class EvalPlan:
    """How one instance is graded: the script to run in ``/testbed`` and swebench's TestSpec."""

    script: str
    test_spec: Any
    eval_type: Any
    swebench_version: str


@dataclass
class Grade:
    """swebench's verdict on one test log."""

    resolved: bool
    status: str
    patch_applied: bool
    fail_to_pass: float
    pass_to_pass: float
    report: dict[str, Any] = field(default_factory=dict)


def eval_plan(row: dict[str, Any]) -> EvalPlan:
    """The eval script (swebench-built for classic rows, the row's own for 5.x rows)."""
    sb = swebench_modules()
    _register(row, sb)
    c = sb["constants"]
    if row.get("eval_script"):
        script = row["eval_script"]
        script_list: list[str] = [script]
    else:
        specs = c.MAP_REPO_VERSION_TO_SPECS[row["repo"]][row["version"]]
        script_list = sb["create_scripts"].make_eval_script_list(
            row, specs, "testbed", "/testbed", row["base_commit"], row["test_patch"]
        )
        script = None
    spec = sb["test_spec"].TestSpec(
        instance_id=row["instance_id"],
        repo=row["repo"],
        version=row["version"],
        repo_script_list=[],
        eval_script_list=script_list,
        env_script_list=[],
        arch="x86_64",
        FAIL_TO_PASS=list(row["FAIL_TO_PASS"]),
        PASS_TO_PASS=list(row["PASS_TO_PASS"]),
        language=c.MAP_REPO_TO_EXT.get(row["repo"], "py"),
        docker_specs={},
        namespace=None,
    )
    eval_type_name = row.get("eval_type") or (
        c.EvalType.FAIL_ONLY.value if row["repo"] in c.FAIL_ONLY_REPOS else c.EvalType.PASS_AND_FAIL.value
    )
    return EvalPlan(
        script=script if script is not None else spec.eval_script,
        test_spec=spec,
        eval_type=c.EvalType(eval_type_name),
        swebench_version=sb["version"],
    )


def apply_commands() -> list[str]:
    """swebench's patch-application fallbacks (``run_evaluation.GIT_APPLY_CMDS``)."""
    return ["git apply --verbose", "git apply --verbose --reject", "patch --batch --fuzz=5 -p1 -i"]


TEST_LOG_BYTES = 64 << 20
"""The grading log kept in the sandbox: the first 64 MiB of the eval run's output (then
:data:`LOG_CUT_MARKER`). It is graded whole; only the agent's observations are cut to
``OUTPUT_LIMIT_CHARS`` (``bpo_envs.swebench.output``)."""
LOG_CUT_MARKER = ">>>>> bpo-gym: the test log was cut here (it is longer than the TEST_LOG_BYTES limit)"
"""The line that ends a grading log longer than :data:`TEST_LOG_BYTES`."""
MAX_LOG_COPY = TEST_LOG_BYTES + 4096
"""Bytes of a grading log copied out of the sandbox (the log, its cut marker, some slack)."""


def test_command(row: dict[str, Any]) -> str | None:
    """The row's test command: its ``test_cmd``, else swebench's for its repo and version (None
    for a row graded by its own ``eval_script``)."""
    if row.get("test_cmd"):
        return str(row["test_cmd"])
    if row.get("eval_script"):
        return None
    specs = swebench_modules()["constants"].MAP_REPO_VERSION_TO_SPECS.get(row["repo"], {})
    cmd = specs.get(row["version"], {}).get("test_cmd")
    return " && ".join(cmd) if isinstance(cmd, list) else cmd


MACHINERY_FAILED = ">>>>> bpo-gym: the test machinery could not be reset, so the tests were not run"
"""The line a grading log ends with when the reset step (``bpo_envs.swebench.tampering``) did
not run: no Python 3.7+ in the sandbox, or it failed."""


def runner_script(patch_path: str, eval_path: str, log_path: str,
                  row: dict[str, Any] | None = None) -> str:
    """Bash that applies the model patch like swebench's ``run_instance``, resets the test
    machinery the patch changed (``bpo_envs.swebench.tampering``: saved before the patch, put
    back after it; the report line goes to the runner's own output, before any code of the
    patch runs), then runs the eval, writing everything it prints (at most
    :data:`TEST_LOG_BYTES`, then :data:`LOG_CUT_MARKER`) to ``log_path``."""
    c = swebench_modules()["constants"]
    tries = " || ".join(f"{cmd} {patch_path}" for cmd in apply_commands())
    work = os.path.dirname(patch_path) or "."
    program, store = f"{work}/bpo_machinery.py", f"{work}/bpo_machinery.json"
    runner = " ".join(shlex.quote(p) for p in tampering.runner_files(test_command(row) if row else None))
    delim = "BPO_MACHINERY_PROGRAM_" + hashlib.blake2b(tampering.program_source().encode(), digest_size=6).hexdigest()
    return (
        f"cat > {program} <<'{delim}'\n{tampering.program_source()}\n{delim}\n"
        "exec 9>&1\n"
        "{\n"
        "cd /testbed\n"
        "bpo_py=\n"
        'for p in /opt/miniconda3/bin/python3 "$(command -v python3)" "$(command -v python)"; do\n'
        '  if [ -n "$p" ] && [ -x "$p" ] && (cd / && "$p" -I -S -c "import sys; sys.exit(sys.version_info < (3, 7))") 2>/dev/null; '
        "then bpo_py=$p; break; fi\n"
        "done\n"
        f'machinery() {{ (cd / && "$bpo_py" -I -S {program} "$1" /testbed {store} {runner}); }}\n'
        f"if [ -z \"$bpo_py\" ] || ! machinery snapshot; then echo '{MACHINERY_FAILED}'; exit 0; fi\n"
        f"if [ -s {patch_path} ]; then\n"
        f"  if {tries}; then echo '{c.APPLY_PATCH_PASS}'; "
        f"else echo '{c.APPLY_PATCH_FAIL}'; exit 0; fi\n"
        "fi\n"
        f"if ! machinery reset >&9; then echo '{MACHINERY_FAILED}'; exit 0; fi\n"
        f"bash {eval_path} 9>&-\n"
        f"}} 2>&1 | head -c {TEST_LOG_BYTES + 1} > {log_path}\n"
        f"if [ \"$(stat -c %s {log_path})\" -gt {TEST_LOG_BYTES} ]; then\n"
        f"  truncate -s {TEST_LOG_BYTES} {log_path}; printf '\\n%s\\n' '{LOG_CUT_MARKER}' >> {log_path}\n"
        "fi\n"
    )


def write_log(raw: bytes, dest: Path, timed_out: bool) -> None:
    """Write a grading log copied out of a sandbox to ``dest`` as UTF-8 (bytes that are not
    are replaced: swebench reads the file as text), at most :data:`TEST_LOG_BYTES` plus the
    cut marker, and swebench's timeout marker when the run was killed at its deadline."""
    text = raw[:MAX_LOG_COPY].decode("utf-8", "replace")
    if len(raw) > MAX_LOG_COPY:
        text += f"\n{LOG_CUT_MARKER}\n"
    if timed_out:
        text += f"\n{timeout_marker()}\n"
    dest.write_text(text, encoding="utf-8")


def read_log_file(path: Path) -> bytes:
    """The first :data:`MAX_LOG_COPY` bytes of the log file at ``path``, on the host, written
    by code under test: a link, a fifo or anything but a regular file reads as empty."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return fh.read(MAX_LOG_COPY + 1)


def log_tail(path: Path, chars: int) -> str:
    """The last ``chars`` characters of the log at ``path``."""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - 4 * chars))
        return fh.read().decode("utf-8", "replace")[-chars:]


def timeout_marker() -> str:
    return swebench_modules()["constants"].TESTS_TIMEOUT


def grade(plan: EvalPlan, log_path: str) -> Grade:
    """Grade a test log with swebench's ``get_logs_eval`` and report functions."""
    sb = swebench_modules()
    g, c = sb["grading"], sb["constants"]
    status_map, applied = g.get_logs_eval(plan.test_spec, log_path)
    ref = {
        "instance_id": plan.test_spec.instance_id,
        c.FAIL_TO_PASS: plan.test_spec.FAIL_TO_PASS,
        c.PASS_TO_PASS: plan.test_spec.PASS_TO_PASS,
    }
    report = g.get_eval_tests_report(status_map, ref, eval_type=plan.eval_type)
    if not applied:
        # swebench marks the run unresolved; every listed test counts as failed
        report = {
            c.FAIL_TO_PASS: {"success": [], "failure": list(plan.test_spec.FAIL_TO_PASS)},
            c.PASS_TO_PASS: {"success": [], "failure": list(plan.test_spec.PASS_TO_PASS)},
        }
    status = g.get_resolution_status(report)
    return Grade(
        resolved=applied and status == c.ResolvedStatus.FULL.value,
        status=status if applied else c.ResolvedStatus.NO.value,
        patch_applied=applied,
        fail_to_pass=float(g.compute_fail_to_pass(report)) if plan.test_spec.FAIL_TO_PASS else 1.0,
        pass_to_pass=float(g.compute_pass_to_pass(report)) if plan.test_spec.PASS_TO_PASS else 1.0,
        report={k: v for k, v in report.items() if k in (c.FAIL_TO_PASS, c.PASS_TO_PASS)},
    )
