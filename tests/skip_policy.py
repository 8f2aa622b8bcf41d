"""Which skips the suite allows (a pytest plugin, loaded by ``tests/conftest.py``).

A test may skip only when an optional part is declared absent (its Python package is not
installed, or a system part the set-up did not install), saying which. Under
``BPO_REQUIRE_ALL=1`` (``.ci/run``, after the full set-up: ``make setup`` installs every extra
and the alfworld, swebench and llm system parts) a skip is turned into a failure unless its
reason matches :data:`ALLOWED_UNDER_FULL_SETUP`: parts that set-up does not install. The
terminal summary lists every skip reason with its count, allowed or refused.

Under pytest-xdist the skips are judged where the report is made (a worker) and counted where
it is logged (the controller, which prints the summary), so the summary covers every worker.
"""

from __future__ import annotations

import os
import re
from collections import Counter

import pytest

ALLOWED_UNDER_FULL_SETUP: tuple[tuple[str, str], ...] = (
    (r"\bvllm\b", "vLLM is not installed by the set-up (bpo-gym-setup vllm, in its own venv: "
                  ".ci/run's vLLM stage runs these tests there)"),
    (r"\bverifiers venv\b", "verifiers is not installed by the set-up (bpo-gym-setup verifiers, in its own "
                             "venv: its pins clash with openenv-core's; installing it takes far over 3 minutes, "
                             "so CI has no stage for it)"),
    (r"no writable pids cgroup", "the host has no writable pids cgroup (a kernel setting)"),
    (r"no writable memory cgroup", "the host has no writable memory cgroup (a kernel setting)"),
    (r"without CAP_SYS_RESOURCE", "the host withholds CAP_SYS_RESOURCE (a container setting), so "
                                  "oom_score_adj cannot be made to stick"),
    (r"no VmRSS", "the kernel reports no VmRSS (not Linux)"),
)
"""``(pattern, why)``: skip reasons allowed under ``BPO_REQUIRE_ALL=1``."""

REFUSED = "skipped for a part the full set-up installs (BPO_REQUIRE_ALL=1)"


def require_all() -> bool:
    return os.environ.get("BPO_REQUIRE_ALL", "") not in ("", "0")


def allowed(reason: str) -> str | None:
    """Why ``reason`` may skip under the full set-up, or None."""
    return next((why for pattern, why in ALLOWED_UNDER_FULL_SETUP if re.search(pattern, reason)), None)


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


_seen: Counter[tuple[str, bool]] = Counter()
"""``(reason, allowed)`` counts of the reports this process logged (under pytest-xdist: the
controller, which logs every worker's reports)."""

JUDGED = "bpo_skip_judged"
"""The report attribute ``[reason, allowed]`` a judged skip carries (it travels with the report
from a pytest-xdist worker to the controller)."""


def _judge(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Where the report is made (a worker under pytest-xdist): a refused skip becomes a failure."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _reason(report)
    ok = not require_all() or allowed(reason) is not None
    setattr(report, JUDGED, [reason, ok])
    if not ok:
        report.outcome = "failed"
        report.longrepr = f"{REFUSED}: {reason}"


def _count(report: pytest.TestReport | pytest.CollectReport) -> None:
    judged = getattr(report, JUDGED, None)
    if judged is not None:
        _seen[(judged[0], bool(judged[1]))] += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    _judge(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    outcome = yield
    _judge(outcome.get_result())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _count(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _count(report)


def pytest_terminal_summary(terminalreporter: object, exitstatus: int, config: pytest.Config) -> None:
    if not _seen:
        return
    tr = terminalreporter
    mode = "BPO_REQUIRE_ALL=1" if require_all() else "BPO_REQUIRE_ALL unset: every declared skip allowed"
    tr.section(f"skip reasons ({mode})")
    for (reason, ok), n in sorted(_seen.items(), key=lambda kv: (kv[0][1], -kv[1])):
        why = allowed(reason)
        tag = ("allowed" + (f" ({why})" if why and require_all() else "")) if ok else "REFUSED"
        tr.write_line(f"{n:4d} x {tag}: {reason}")
