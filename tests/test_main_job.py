"""The main job as a user runs it: --jobs equivalence, --plan, the controls, bad input."""

from __future__ import annotations

import json
import shutil

import gymnasium as gym
import pytest
import torch

import bpo_envs  # noqa: F401
from bpo_algos import Budget, EnvPool, Trainer, make_algorithm
from bpo_experiments import compare

SMALL = ["--smoke", "--updates", "2", "--no-progress"]
TREEMDP = ["--smoke", "--envs", "treemdp", "--updates", "2", "--no-progress", "--jobs", "1"]


@pytest.fixture(scope="module")
def treemdp_comparison(tmp_path_factory):
    """One ``TREEMDP`` comparison, made once for the module; the tests that change and resume it
    work on copies (:func:`_copy`)."""
    out = tmp_path_factory.mktemp("treemdp") / "out"
    compare.main([*TREEMDP, "--out", str(out)])
    return out


def _copy(folder, to):
    shutil.copytree(folder, to)
    return to


def _strip(value):
    """results.json without its wall-clock fields (time is the one thing parallel runs change)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if "seconds" not in k and k != "timing"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def test_jobs_give_the_results_of_one_job_and_resume(tmp_path):
    one = compare.main([*SMALL, "--out", str(tmp_path / "one"), "--jobs", "1"])
    # the second comparison first runs one env, then the other joins it on --resume
    compare.main([*SMALL, "--out", str(tmp_path / "two"), "--jobs", "2", "--envs", "treemdp"])
    kept = (tmp_path / "two" / "runs" / "treemdp" / "bpo" / "seed0" / "run.json").stat().st_mtime_ns
    two = compare.main([*SMALL, "--out", str(tmp_path / "two"), "--jobs", "2", "--resume"])
    assert (tmp_path / "two" / "runs" / "treemdp" / "bpo" / "seed0" / "run.json").stat().st_mtime_ns == kept
    saved = [json.loads((tmp_path / name / "results.json").read_text()) for name in ("one", "two")]
    assert saved[1]["timing"]["jobs"] == 2 and saved[0]["timing"]["jobs"] == 1
    from bpo_algos.run_log import code_version

    assert saved[0]["code_versions"] == saved[1]["code_versions"] == [code_version()]
    assert _strip(saved[0]) == _strip(saved[1])
    assert json.dumps(_strip(one), sort_keys=True) == json.dumps(_strip(two), sort_keys=True)  # (nan != nan in dicts)
    # --resume with workers: a lost run is redone in a worker, the rest are kept
    shutil.rmtree(tmp_path / "two" / "runs" / "webshop" / "bpo" / "seed1")
    (tmp_path / "two" / "results.json").unlink()
    compare.main([*SMALL, "--out", str(tmp_path / "two"), "--jobs", "2", "--resume"])
    assert _strip(json.loads((tmp_path / "two" / "results.json").read_text())) == _strip(saved[0])


def test_results_of_several_code_versions_are_named_in_the_report(treemdp_comparison, tmp_path, capsys):
    # a folder resumed after the code changed: its warm start and its runs come from two versions
    out = _copy(treemdp_comparison, tmp_path / "mixed")
    for path in (out / "runs" / "treemdp").glob("bpo/seed*/run.json"):
        run = json.loads(path.read_text())
        path.write_text(json.dumps({**run, "code": "bpo-gym 0.0.9 (git 0123456789ab)"}))
    (out / "results.json").unlink()
    capsys.readouterr()
    results = compare.main([*TREEMDP, "--out", str(out), "--resume"])
    assert len(results["code_versions"]) == 2 and "bpo-gym 0.0.9 (git 0123456789ab)" in results["code_versions"]
    captured = capsys.readouterr()
    assert "holds results of 2 code versions" in captured.err
    assert "**Made by 2 code versions**" in (out / "results.md").read_text()


def test_a_folder_from_before_an_env_setup_field_existed_resumes_and_a_changed_one_is_refused(treemdp_comparison, tmp_path):
    out = _copy(treemdp_comparison, tmp_path / "old")
    args = [*TREEMDP, "--out", str(out)]
    for path in (out / "preset.json", out / "runs" / "treemdp" / "setting.json"):
        saved = json.loads(path.read_text())
        setup = saved["envs"]["treemdp"] if "treemdp" in saved["envs"] else saved["envs"]
        del setup["options"]  # written by a version whose EnvSetup had no options field
        path.write_text(json.dumps(saved))
    (out / "results.json").unlink()
    compare.main([*args, "--resume"])  # the missing field counts at its default
    with pytest.raises(SystemExit, match="another setting for treemdp"):
        compare.main([*args, "--resume", "--learning-rate", "0.5"])


def test_more_seeds_join_a_folder_on_resume_and_keep_its_runs(treemdp_comparison, tmp_path):
    out = _copy(treemdp_comparison, tmp_path / "grow")
    args = [*TREEMDP, "--out", str(out), "--resume"]
    kept = (out / "runs" / "treemdp" / "bpo" / "seed0" / "run.json").stat().st_mtime_ns
    seeds = json.loads((out / "results.json").read_text())["per_env"]["treemdp"]["seeds"]
    grown = compare.main([*args, "--seeds", *map(str, seeds), str(max(seeds) + 1)])
    assert (out / "runs" / "treemdp" / "bpo" / "seed0" / "run.json").stat().st_mtime_ns == kept
    assert (out / "runs" / "treemdp" / "bpo" / f"seed{max(seeds) + 1}" / "run.json").is_file()
    assert grown["per_env"]["treemdp"]["seeds"] == [*seeds, max(seeds) + 1]
    with pytest.raises(SystemExit, match="another setting for treemdp"):  # any other change is still refused
        compare.main([*args, "--learning-rate", "0.5"])


def test_plan_prints_runs_cost_and_detectable_effect_without_training(tmp_path, capsys):
    out = tmp_path / "never"
    plan = compare.main(["--smoke", "--plan", "--jobs", "2", "--no-progress", "--out", str(out)])
    assert not out.exists()  # nothing trained, nothing written
    # 2 envs x 2 seeds x 6 algorithms, and on TreeMDP (tuned) 3 algorithms x 2 candidates x 1 tuning seed
    # plus the treatment and the comparator at their defaults on its 2 seeds
    assert plan["runs"] == 2 * 2 * 6 + 3 * 2 * 1 + 2 * 2 and plan["per_env"]["treemdp"]["tuning_runs"] == 6
    assert plan["wall_seconds"] > 0 and plan["jobs"] == 2
    webshop = plan["per_env"]["webshop"]
    assert webshop["source"].startswith("pilot") and webshop["compute_per_run"] == 4 * 128
    assert set(webshop["mde"]) == {"bpo", "grpo", "frozen", "reinforce", "rloo-2x"} and webshop["mde"]["bpo"]["final"] > 0
    text = capsys.readouterr().out
    assert "Expected wall time with --jobs 2" in text and "detectable effect" in text


def test_plan_from_a_saved_run_uses_its_spread(treemdp_comparison, capsys):
    out = treemdp_comparison  # read, not changed
    plan = compare.main(["--smoke", "--envs", "treemdp", "--plan", "--jobs", "1", "--seeds", "0", "1", "2", "3",
                         "--plan-from", str(out / "results.json")])
    entry = plan["per_env"]["treemdp"]
    assert entry["source"] == f"recorded: {out / 'results.json'}"
    saved = json.loads((out / "results.json").read_text())["per_env"]["treemdp"]["vs_comparator"]["bpo"]["final"]
    from bpo_experiments.stats import minimal_detectable_effect

    assert entry["mde"]["bpo"]["final"] == pytest.approx(minimal_detectable_effect(saved["sd"], 4))


def test_plan_from_a_run_of_another_setting_says_so(treemdp_comparison, capsys):
    """A recorded run sizes the plan of its own setting silently (more seeds are the plan's to
    size), and the plan of another setting with a warning naming what differs: its spreads are
    not that setting's."""
    out = treemdp_comparison  # read, not changed
    base = [*TREEMDP, "--plan", "--seeds", "0", "1", "2", "3", "--plan-from", str(out / "results.json")]
    assert "record_differs" not in compare.main(base)["per_env"]["treemdp"]
    assert "warning: the recorded run had another setting" not in capsys.readouterr().out
    entry = compare.main([*base, "--learning-rate", "0.5"])["per_env"]["treemdp"]
    assert entry["source"] == f"recorded: {out / 'results.json'}"
    old, new = entry["record_differs"].pop("trainer.learning_rate")
    assert new == 0.5 != old and not entry["record_differs"]
    assert "warning: the recorded run had another setting (trainer.learning_rate" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--comparator", "nope"], "unknown comparator 'nope'"),
        (["--algorithms", "bpo", "grpo"], "--comparator 'rloo' is not among the algorithms"),
        (["--comparator", "bpo"], "the treatment and the comparator are both 'bpo'"),
        (["--ray", "127.0.0.1:1"], "no Ray cluster reachable"),
        (["--ray", "nowhere"], "give HOST:PORT"),
    ],
)
def test_bad_input_is_a_clear_error_before_any_run(tmp_path, argv, message):
    out = tmp_path / "x"
    with pytest.raises(SystemExit, match=message):
        compare.main(["--smoke", "--out", str(out), "--no-progress", *argv])
    assert not out.exists()


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_jobs_must_be_a_positive_count(tmp_path, value, capsys):
    with pytest.raises(SystemExit):
        compare.main(["--smoke", "--out", str(tmp_path / "x"), "--jobs", value])
    assert "--jobs" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def _children(pid: int) -> list[int]:
    from pathlib import Path

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_jobs_workers_end_when_the_main_process_is_killed(tmp_path):
    # a run left going would keep writing into the folder that a resumed run then uses too
    import os
    import signal
    import subprocess
    import sys
    import time

    script = ("import time\nfrom bpo_experiments import parallel\n"
              "parallel.execute([(time.sleep, (120,))] * 2, jobs=2)\n")
    main = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        deadline = time.monotonic() + 60
        while len(_children(main.pid)) < 3 and time.monotonic() < deadline:  # 2 workers + the resource tracker
            time.sleep(0.2)
        workers = _children(main.pid)
        assert len(workers) >= 2, "the workers never started"
        time.sleep(2.0)  # the workers are inside time.sleep(120)
    finally:
        main.send_signal(signal.SIGKILL)
        main.wait()
    deadline = time.monotonic() + 15
    while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in workers if os.path.exists(f"/proc/{pid}")]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "workers outlived the main process"


def _pool():
    return EnvPool([lambda: gym.make("BPO-TreeMDP-v0", depth=4, n_actions=3, seed=1, n_tasks=4)] * 2)


def test_frozen_control_collects_like_its_algorithm_and_never_moves():
    from bpo_algos.policy.scorer import TextScorerPolicy

    policy = TextScorerPolicy(seed=0)
    before = [p.detach().clone() for p in policy.parameters()]
    frozen = make_algorithm("frozen", group_size=4, seed=0)
    assert frozen.options.group_size == 4 and frozen.root_branches == 4 and frozen.name == "frozen"
    Trainer(frozen, policy, _pool(), [0, 1, 2, 3], updates=3, budget=Budget("env_steps", 64), learning_rate=0.1, seed=0).train()
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    # the same collection as the algorithm it wraps
    a = make_algorithm("frozen", of="grpo", group_size=3, seed=5).collect(TextScorerPolicy(seed=1), _pool(), [0, 1])
    b = make_algorithm("grpo", group_size=3, seed=5).collect(TextScorerPolicy(seed=1), _pool(), [0, 1])
    assert [t.root.branch_factor for t in a.trees] == [t.root.branch_factor for t in b.trees] == [3, 3]
    assert a.compute.env_steps == b.compute.env_steps
    assert all(e.advantage == 0.0 for t in a.trees for e in t.edges())
    with pytest.raises(ValueError, match="wrap itself"):
        make_algorithm("frozen", of="frozen")


def test_reinforce_control_has_no_baseline():
    from bpo_algos import TabularPolicy

    batch = make_algorithm("reinforce", group_size=4, seed=0).collect(TabularPolicy(), _pool(), [0])
    tree = batch.trees[0]
    for first in tree.root.children:
        assert first.advantage == pytest.approx(first.q)


@pytest.mark.slow
def test_ray_runs_give_the_results_of_one_job(tmp_path):
    pytest.importorskip("ray")
    args = ["--smoke", "--envs", "treemdp", "--updates", "2", "--no-progress"]
    compare.main([*args, "--out", str(tmp_path / "one"), "--jobs", "1"])
    compare.main([*args, "--out", str(tmp_path / "ray"), "--ray", "local"])
    saved = [json.loads((tmp_path / name / "results.json").read_text()) for name in ("one", "ray")]
    assert saved[1]["timing"]["ray"] == "local"
    assert _strip(saved[0]) == _strip(saved[1])


def test_a_job_freezes_what_exists_and_gives_it_back():
    """Inside a job the objects that existed at its start are frozen out of the collector's
    view and the first threshold is raised; after it (also after an error) both are as before,
    so nothing stays frozen for good and garbage made inside the job is still collected."""
    import gc

    from bpo_experiments.runner import JOB_GC_THRESHOLD, collector_for_jobs, long_lived_frozen

    before = gc.get_threshold()
    seen = {}

    @long_lived_frozen
    def job(fail: bool) -> None:
        seen["frozen"], seen["threshold"] = gc.get_freeze_count(), gc.get_threshold()[0]
        if fail:
            raise RuntimeError("boom")

    job(False)
    assert seen["frozen"] > 0 and seen["threshold"] >= JOB_GC_THRESHOLD
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    with pytest.raises(RuntimeError):
        job(True)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    with collector_for_jobs(freeze=False):
        assert gc.get_freeze_count() == 0 and gc.get_threshold()[0] >= JOB_GC_THRESHOLD
    assert gc.get_threshold() == before
