"""Under ``--dist loadgroup`` (``make test``) the modules of one shared group of
``tests/xdist_groups.py`` run on one pytest-xdist worker, and the other modules still spread."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from xdist_groups import (
    SHARED_GROUPS,
    UNMEASURED_S,
    group_of_nodeid,
    longest_first,
    measured_seconds,
)

HERE = Path(__file__).parent


def test_group_of_a_test_id():
    assert group_of_nodeid("tests/test_ray_pool.py::test_x[a]") == "processes"
    assert group_of_nodeid("tests/test_swebench_faults.py::test_y") == "docker"
    assert group_of_nodeid("tests/test_viz.py::test_z") == "test_viz.py"
    assert group_of_nodeid("tests/test_viz.py::test_z@mine") == "mine"


def test_the_longest_groups_are_handed_out_first():
    """By measured seconds, not by number of tests (a few long z-tests must not start last);
    a parametrized test measured as a whole counts per parameter; an unmeasured one counts
    UNMEASURED_S."""
    groups = {"test_many.py": [f"tests/test_many.py::test_{i}" for i in range(20)],
              "test_z.py": ["tests/test_z.py::test_long[a]", "tests/test_z.py::test_long[b]"],
              "processes": ["tests/test_ray_pool.py::test_new"],
              "test_new.py": ["tests/test_new.py::test_x", "tests/test_new.py::test_y"]}
    measured = {f"tests/test_many.py::test_{i}": 0.1 for i in range(20)} | {"tests/test_z.py::test_long": 30.0}
    assert longest_first(groups, measured) == ["test_z.py", "test_many.py", "test_new.py", "processes"]
    assert UNMEASURED_S * 2 < 0.1 * 20


def test_the_committed_measurement_puts_the_long_groups_first():
    committed = measured_seconds()
    assert committed, "docs/results/ci-time/durations-xdist.json is gone: the scheduler would keep no order"
    groups: dict[str, list[str]] = {}
    for test in committed:
        groups.setdefault(group_of_nodeid(test), []).append(test)
    order = longest_first(groups, committed)
    assert {"processes", "test_unbiasedness.py", "docker"} <= set(order[:4]), order[:6]


def test_a_shared_group_runs_on_one_worker(tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist is not installed: pip install 'bpo-gym[test]'")
    shared = SHARED_GROUPS["processes"][1]
    alone = [f"test_alone_{i}.py" for i in range(4)]
    body = ("import os, time\n"
            "def test_a():\n    time.sleep(0.3)\n    open({out!r}, 'a').write(os.environ['PYTEST_XDIST_WORKER'] + ' {name}\\n')\n")
    out = tmp_path / "workers.txt"
    for name in (*shared, *alone):
        (tmp_path / name).write_text(body.format(out=str(out), name=name))
    (tmp_path / "conftest.py").write_text("from xdist_groups import pytest_collection_modifyitems, pytest_xdist_make_scheduler\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    worker = dict(reversed(line.split()) for line in out.read_text().splitlines())
    assert len(worker) == len(shared) + len(alone)
    assert len({worker[name] for name in shared}) == 1, worker  # one worker for the group
    assert len(set(worker.values())) == 2, worker  # and both workers used
