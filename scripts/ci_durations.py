"""Before/after test durations as JSON, from pytest logs (docs/setup.md, "CI time").

Each log is the output of ``uptime; pytest -p cpu_durations ...; uptime``. The plugin
(:data:`PLUGIN`, written to a folder on ``PYTHONPATH``) prints ``CPUTIME <cpu s> WALL <wall s>
<test id>`` per test, setup and teardown included: CPU seconds of the pytest process, the
children it reaped and what its live descendants used meanwhile (psutil), which a shared
machine's load changes far less than wall time. Logs of
``pytest --durations=0`` (``12.34s call tests/x.py::test``) give wall time only. The load comes
from the ``uptime`` lines. A test measured in several logs of one side keeps the last.

    python scripts/ci_durations.py --write-plugin /tmp/plugin
    (uptime; PYTHONPATH=/tmp/plugin pytest -p cpu_durations tests/x.py; uptime) > after.log
    python scripts/ci_durations.py --before base.log --after after.log --out docs/results/ci-time/durations.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

PLUGIN = '''"""pytest plugin (scripts/ci_durations.py): CPU and wall seconds per test, setup and teardown
included. CPU: this process, the children it reaped, and the CPU its live descendants (a
long-lived worker such as the ALFWorld planner) used during the test. Under pytest-xdist each
worker measures its own tests and hands the rows to the controller, which prints them."""
import resource
import time

import pytest

_rows = []


def _live():
    try:
        import psutil
    except ImportError:
        return {}
    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            out[(child.pid, child.create_time())] = t.user + t.system
        except psutil.Error:
            pass
    return out


def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    c0, live0, w0 = _cpu(), _live(), time.perf_counter()
    yield
    live1 = _live()
    descendants = sum(cpu - live0.get(key, 0.0) for key, cpu in live1.items())
    _rows.append((item.nodeid, _cpu() - c0 + descendants, time.perf_counter() - w0))


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the rows go to the controller
        workeroutput["cpu_durations"] = list(_rows)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown without it
def pytest_testnodedown(node, error):  # pytest-xdist's controller: a worker's rows
    _rows.extend(tuple(row) for row in getattr(node, "workeroutput", {}).get("cpu_durations", ()))


def pytest_terminal_summary(terminalreporter):
    for nodeid, cpu, wall in _rows:
        terminalreporter.write_line(f"CPUTIME {cpu:.2f} WALL {wall:.2f} {nodeid}")
'''
"""The plugin's source (``--write-plugin DIR`` writes it as ``DIR/cpu_durations.py``)."""

XDIST_GROUP = re.compile(r"@[A-Za-z0-9_.-]+$")
"""The ``@group`` suffix pytest-xdist's ``--dist loadgroup`` adds to a grouped test's id."""
CPU_LINE = re.compile(r"^CPUTIME ([0-9.]+) WALL ([0-9.]+) (\S.*?)\s*$")
WALL_LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S.*?)\s*$")
LOAD = re.compile(r"load average: ([0-9.]+), ([0-9.]+), ([0-9.]+)")


def read_log(path: Path) -> tuple[dict[str, dict[str, float]], list[list[float]]]:
    """``({test id: {"wall_s", "cpu_s"}}, [[1, 5, 15-min load] of each uptime line])`` of one log."""
    tests: dict[str, dict[str, float]] = {}
    loads: list[list[float]] = []
    for line in path.read_text(errors="replace").splitlines():
        if m := CPU_LINE.match(line):
            tests[XDIST_GROUP.sub("", m.group(3))] = {"cpu_s": float(m.group(1)), "wall_s": float(m.group(2))}
        elif m := WALL_LINE.match(line):
            row = tests.setdefault(XDIST_GROUP.sub("", m.group(3)), {"wall_s": 0.0})
            if "cpu_s" not in row:
                row["wall_s"] += float(m.group(1))
        elif m := LOAD.search(line):
            loads.append([float(x) for x in m.groups()])
    return tests, loads


def collect(paths: list[Path]) -> tuple[dict[str, dict[str, Any]], dict[str, list[list[float]]]]:
    tests: dict[str, dict[str, Any]] = {}
    loads: dict[str, list[list[float]]] = {}
    for path in paths:
        found, load = read_log(path)
        loads[path.name] = load
        for test, row in found.items():
            tests[test] = {**{k: round(v, 2) for k, v in row.items()}, "log": path.name}
    return tests, loads


def _totals(rows: list[dict[str, Any]], unit: str) -> dict[str, Any]:
    """Sums of ``unit`` (``wall`` or ``cpu``) over the tests measured in it on both sides."""
    both = [r for r in rows if r[f"before_{unit}_s"] is not None and r[f"after_{unit}_s"] is not None]
    before, after = sum(r[f"before_{unit}_s"] for r in both), sum(r[f"after_{unit}_s"] for r in both)
    return {"tests": len(both), "before_s": round(before, 1), "after_s": round(after, 1), "saved_s": round(before - after, 1)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-plugin", type=Path, metavar="DIR", help="write the pytest plugin into DIR and exit")
    parser.add_argument("--before", nargs="+", type=Path, help="logs of the code before the change")
    parser.add_argument("--after", nargs="+", type=Path, help="logs of the code after it")
    parser.add_argument("--notes", nargs="*", default=[], help="notes kept in the JSON")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.write_plugin:
        args.write_plugin.mkdir(parents=True, exist_ok=True)
        (args.write_plugin / "cpu_durations.py").write_text(PLUGIN)
        return {"plugin": str(args.write_plugin / "cpu_durations.py")}
    if not (args.before and args.after and args.out):
        parser.error("--before, --after and --out are needed (or --write-plugin)")
    before, before_loads = collect(args.before)
    after, after_loads = collect(args.after)
    rows = []
    for test in sorted(set(before) | set(after)):
        b, a = before.get(test) or {}, after.get(test) or {}
        rows.append({
            "test": test,
            "before_wall_s": b.get("wall_s"), "after_wall_s": a.get("wall_s"),
            "before_cpu_s": b.get("cpu_s"), "after_cpu_s": a.get("cpu_s"),
            "before_log": b.get("log"), "after_log": a.get("log"),
        })
    paired = [r for r in rows if r["before_log"] and r["after_log"]]
    out = {
        "tests": rows,
        "paired_tests": len(paired),
        "paired_total": {unit: _totals(paired, unit) for unit in ("wall", "cpu")},
        "load_average_1_5_15": {"before": before_loads, "after": after_loads},
        "cpus": os.cpu_count(),
        "notes": args.notes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(paired)} tests measured on both sides: {json.dumps(out['paired_total'])}")
    return out


if __name__ == "__main__":
    main()
