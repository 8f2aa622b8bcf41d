"""Which tests share a pytest-xdist worker (a pytest plugin, loaded by ``tests/conftest.py``).

The suite runs on every core (``make test``: ``pytest -n auto --dist loadgroup``;
docs/setup.md). Under ``--dist loadgroup`` the tests of one ``xdist_group`` run one after
another on one worker, and a test with no group may run on any worker beside any other. Each
test module here is one group (so a module's module-scoped fixtures are built once, as in a
serial run), except the modules of :data:`SHARED_GROUPS`: the tests that must not run beside each
other share one group across modules. A test that already has an ``xdist_group`` marker keeps it.
Without pytest-xdist the markers change nothing. The scheduler is this module's
(:func:`pytest_xdist_make_scheduler`): pytest-xdist's own ``loadgroup`` reads the group from a
suffix it writes into ``item._nodeid``, which pytest 9 no longer uses as the test's id, so alone
it would hand out every test on its own (``tests/test_xdist_groups.py`` catches that). It hands
out the groups that took longest first (:func:`group_seconds`, from the last measured run), so
that a long group does not start last and leave the other workers idle at the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parent.parent / "docs" / "results" / "ci-time" / "durations-xdist.json"
"""The last measured default suite (``scripts/ci_durations.py``): per-test wall seconds."""
UNMEASURED_S = 0.5
"""Seconds assumed for a test the measurement does not have (added since)."""

SHARED_GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "docker": (
        "every module that starts containers: the slow stage restarts the Docker daemon (every "
        "container stops), and the capacity, CPU-quota, memory-limit and kill checks measure what "
        "the one daemon on this host grants",
        ("test_swebench_faults.py", "test_swebench_docker.py", "test_swebench_docker_escape.py",
         "test_swebench_capacity.py", "test_swebench_official.py", "test_swebench_grading.py",
         "test_swebench_host_side.py", "test_swebench_hostile.py", "test_swebench_tampering.py",
         "test_swebench_owners.py"),
    ),
    "processes": (
        "each starts its own processes (torchrun / accelerate / gloo ranks, a local Ray cluster "
        "with its object store in /dev/shm, `bpo-compare --jobs` workers counted by pid, a run "
        "killed by SIGKILL): two at once oversubscribe the cores their rendezvous and restart "
        "deadlines assume, and two Ray clusters share one /dev/shm",
        ("test_data_parallel.py", "test_data_parallel_ray.py", "test_ray_pool.py", "test_resume_kill.py",
         "test_main_job.py", "test_trust.py"),
    ),
}
"""``group: (why, test modules)``: modules whose tests must not run beside each other."""

_GROUP_OF_MODULE = {module: group for group, (_, modules) in SHARED_GROUPS.items() for module in modules}


def group_of_module(name: str) -> str:
    """The xdist group of the tests in module file ``name``: its shared group, else ``name``."""
    return _GROUP_OF_MODULE.get(name, name)


def group_of(item: pytest.Item) -> str:
    return group_of_module(item.path.name)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group_of(item)))


def group_of_nodeid(nodeid: str) -> str:
    """The group of a collected test id: the ``@group`` suffix pytest-xdist's worker adds where it
    can, else the group of its module (pytest 9 keeps a test's id apart from ``item._nodeid``, so
    the worker's suffix is lost and ``--dist loadgroup`` alone would group nothing)."""
    if "@" in nodeid:
        return nodeid.rsplit("@", 1)[1]
    return group_of_module(nodeid.split("::", 1)[0].rsplit("/", 1)[-1])


def measured_seconds(path: Path = DURATIONS) -> dict[str, float]:
    """Wall seconds per test id in the measurement at ``path`` (under pytest-xdist where it has
    them, else in one process); empty when there is none."""
    try:
        rows = json.loads(path.read_text())["tests"]
    except (OSError, ValueError, KeyError):
        return {}
    seconds = {}
    for row in rows:
        wall = row.get("after_wall_s") if row.get("after_wall_s") is not None else row.get("before_wall_s")
        if wall is not None:
            seconds[row["test"]] = float(wall)
    return seconds


def group_seconds(nodeids: Iterable[str], measured: dict[str, float]) -> dict[str, float]:
    """Seconds per group of ``nodeids``: the sum of their measured seconds (a test measured as
    a whole, not per parameter, counts once per parameter; an unmeasured one
    :data:`UNMEASURED_S`)."""
    total: dict[str, float] = {}
    for nodeid in nodeids:
        test = nodeid.rsplit("@", 1)[0]
        seconds = measured.get(test, measured.get(test.split("[", 1)[0], UNMEASURED_S))
        group = group_of_nodeid(nodeid)
        total[group] = total.get(group, 0.0) + seconds
    return total


def longest_first(groups: dict[str, Iterable[str]], measured: dict[str, float]) -> list[str]:
    """The names of ``groups`` (group: its test ids), those with the most measured seconds
    first (ties: in the given order)."""
    seconds = group_seconds((n for ids in groups.values() for n in ids), measured)
    return sorted(groups, key=lambda g: -seconds.get(g, 0.0))


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # a pytest-xdist hook (absent without it)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under ``--dist loadgroup``: pytest-xdist's scope scheduling, one scope per group, the
    groups that took longest handed out first (:func:`group_seconds`; pytest-xdist's own order
    is by number of tests, which started an 11-test module of 2,000-batch z-tests last)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return group_of_nodeid(nodeid)

        def _assign_work_unit(self, node: object) -> None:
            if not self.ordered:  # the first hand-out: the work queue holds every group
                self.ordered = True
                for group in longest_first(self.workqueue, measured_seconds()):
                    self.workqueue.move_to_end(group)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)
