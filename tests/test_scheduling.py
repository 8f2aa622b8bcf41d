"""The main job's schedule (docs/main-job.md, "Scheduling"): a job starts as soon as what it
needs exists, so a seed's runs start when its own initial job ends, not after every initial job."""

from __future__ import annotations

import operator

import pytest

from bpo_experiments import compare
from bpo_experiments.parallel import Ready, execute_as_ready


def _chain(jobs: int) -> tuple[list[str], dict[str, int]]:
    """Two "initial" jobs whose results make two "runs" ready each; returns the order in which
    results came back and the results."""
    order: list[str] = []
    results: dict[str, int] = {}

    def done(key: str, value: int) -> list[Ready]:
        order.append(key)
        results[key] = value
        if key.startswith("initial"):
            seed = key[-1]
            # runs of a seed before any later initial job (priority 0 < 1)
            return [Ready((0, seed, i), f"run{seed}.{i}", (operator.add, (value, i))) for i in range(2)]
        return []

    first = [Ready((1, seed), f"initial{seed}", (operator.mul, (int(seed), 10))) for seed in "01"]
    execute_as_ready(first, jobs, on_result=done)
    return order, results


def test_a_job_made_ready_runs_before_a_lower_priority_waiting_one():
    order, results = _chain(jobs=1)
    assert order == ["initial0", "run0.0", "run0.1", "initial1", "run1.0", "run1.1"]
    assert results == {"initial0": 0, "run0.0": 0, "run0.1": 1, "initial1": 10, "run1.0": 10, "run1.1": 11}


def test_processes_give_the_results_of_one_process():
    order, results = _chain(jobs=2)
    assert sorted(order) == sorted(_chain(jobs=1)[0])
    assert results == _chain(jobs=1)[1]
    assert order.index("initial0") < order.index("run0.0") and order.index("initial1") < order.index("run1.1")


def test_jobs_must_be_positive():
    with pytest.raises(ValueError, match="jobs"):
        execute_as_ready([], 0)


def test_a_seeds_runs_start_when_its_own_initial_job_ends(tmp_path):
    """With one worker, seed 0's runs are done before seed 1's initial job is (before, every
    initial job came first). (That ``--jobs 2`` gives the results of ``--jobs 1`` is
    tests/test_main_job.py's.)"""
    out = tmp_path / "s"
    argv = ["--smoke", "--envs", "treemdp", "--seeds", "0", "1", "--updates", "1", "--budget", "100", "--grad-batches", "2",
            "--algorithms", "bpo", "rloo", "--treatment", "bpo", "--comparator", "rloo", "--positive-control", "none",
            "--calibration-control", "none", "--no-tune", "--no-progress"]
    compare.main([*argv, "--out", str(out), "--jobs", "1"])
    runs = out / "runs" / "treemdp"
    second_initial = (runs / "_initial" / "seed1" / "initial.json").stat().st_mtime_ns
    for algorithm in ("bpo", "rloo"):
        assert (runs / algorithm / "seed0" / "run.json").stat().st_mtime_ns < second_initial
        assert (runs / algorithm / "seed1" / "run.json").stat().st_mtime_ns > second_initial
