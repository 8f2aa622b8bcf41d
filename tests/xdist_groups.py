"""Which tests share a pytest-xdist worker (a pytest plugin, loaded by ``tests/conftest.py``).

The suite runs on every core (``make test``: ``pytest -n auto --dist loadgroup``;
docs/setup.md). Under ``--dist loadgroup`` the tests of one ``xdist_group`` run one after
another on one worker, and a test with no group may run on any worker beside any other. Each
test module here is one group (so a module's module-scoped fixtures are built once, as in a
serial run), except the modules of :data:`SHARED_GROUPS`: the tests that must not run beside each
other share one group across modules. A test that already has an ``xdist_group`` marker keeps it.
Without pytest-xdist the markers change nothing.
"""

from __future__ import annotations

import pytest

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


def group_of(item: pytest.Item) -> str:
    """The xdist group of ``item``: its shared group, else its module's file name."""
    module = item.path.name
    return _GROUP_OF_MODULE.get(module, module)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group_of(item)))
