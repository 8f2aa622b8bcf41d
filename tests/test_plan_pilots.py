"""``bpo-compare --plan`` without a pilot where one is recorded (docs/main-job.md, "Planning"):
``--plan --pilot`` measures and saves each env's pilot, ``--plan`` reads it back while the
settings are the ones it was measured with, and the default preset records every env's costs."""

from __future__ import annotations

import json

import pytest

from bpo_experiments import compare, plan
from bpo_experiments.presets import PRESETS


def _no_pilot(*args, **kwargs):
    raise AssertionError("a pilot ran")


def test_a_recorded_pilot_sizes_the_plan_until_the_settings_change(tmp_path, monkeypatch):
    saved = tmp_path / "pilots.json"
    base = ["--smoke", "--envs", "treemdp", "--plan", "--jobs", "1", "--no-progress", "--recorded-pilots", str(saved)]
    measured = compare.main([*base, "--pilot"])
    entry = json.loads(saved.read_text())["per_env"]["treemdp"]
    assert entry["pilot"] == measured["per_env"]["treemdp"]["pilot"] and "load average" in entry["uptime"]
    monkeypatch.setattr(plan, "_pilot", _no_pilot)
    again = compare.main(base)["per_env"]["treemdp"]
    assert again["source"].startswith("recorded pilot") and again["seconds_total"] == measured["per_env"]["treemdp"]["seconds_total"]
    with pytest.raises(AssertionError, match="a pilot ran"):  # another budget: the recorded pilot is not this setting's
        compare.main([*base, "--budget", "64"])


def test_the_default_preset_records_every_envs_costs(monkeypatch, capsys):
    monkeypatch.setattr(plan, "_pilot", _no_pilot)
    result = compare.main(["--plan", "--jobs", "2", "--no-progress"])
    assert set(result["per_env"]) == set(PRESETS["cpu"].envs)
    for env, entry in result["per_env"].items():
        assert entry["source"].startswith("recorded"), env
        assert entry["seconds_total"] > 0


def test_a_record_with_cpu_seconds_is_planned_at_an_idle_cores_cost(tmp_path, monkeypatch):
    """A run records its own process's CPU (``seconds_cpu``); ``--plan`` prices a recorded run by
    it, not by the wall time the load of that day stretched; a record without it falls back to
    the wall seconds and says so (the broken case: the wall figure used where CPU is recorded)."""
    from bpo_experiments.plan import REPOSITORY

    monkeypatch.setattr(plan, "_pilot", _no_pilot)
    record = json.loads((REPOSITORY / PRESETS["cpu"].envs["webshop"].recorded_results).read_text())
    for summary in record["per_env"]["webshop"]["algorithms"].values():
        summary.pop("seconds_cpu_per_run", None)  # a record made before runs recorded their CPU
    (tmp_path / "wall.json").write_text(json.dumps(record))
    wall = compare.main(["--envs", "webshop", "--plan", "--jobs", "2", "--no-progress", "--plan-from", str(tmp_path / "wall.json")])
    for summary in record["per_env"]["webshop"]["algorithms"].values():
        summary["seconds_cpu_per_run"] = summary["seconds_per_run"] / 4
    (tmp_path / "results.json").write_text(json.dumps(record))
    idle = compare.main(["--envs", "webshop", "--plan", "--jobs", "2", "--no-progress", "--plan-from", str(tmp_path / "results.json")])
    before, after = wall["per_env"]["webshop"], idle["per_env"]["webshop"]
    assert after["seconds_basis"].startswith("CPU") and before["seconds_basis"].startswith("wall")
    for a, seconds in after["seconds_per_run"].items():
        assert seconds == pytest.approx(before["seconds_per_run"][a] / 4)
