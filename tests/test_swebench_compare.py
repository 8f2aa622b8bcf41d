"""SWE-bench in the main job (``bpo-compare``): the data-source flags, the gpu preset's demand
for training rows off Verified and Verified on docker, the overlap errors, and (slow) the CPU
preset ``cpu-swe`` end to end."""

from __future__ import annotations

import json
import shutil

import pytest

from bpo_experiments import compare


class _Built(Exception):
    def __init__(self, preset):
        self.preset = preset


def _preset(argv, monkeypatch):
    """The preset ``bpo-compare argv`` would run (parsing only: nothing is trained); a bad
    combination raises SystemExit as the command does."""
    original = compare.build_preset

    def stop(*args, **kwargs):
        raise _Built(original(*args, **kwargs))

    monkeypatch.setattr(compare, "build_preset", stop)
    try:
        compare.main(argv)
    except _Built as built:
        return built.preset
    raise AssertionError("build_preset was not called")


def _rows(path, ids, repo="octo/repo"):
    """SWE-bench-format rows (the columns the loader requires) for ``ids``."""
    with open(path, "w") as fh:
        for i in ids:
            fh.write(json.dumps({
                "instance_id": i, "repo": repo if isinstance(repo, str) else repo[i], "base_commit": "0" * 40, "patch": "",
                "test_patch": "", "problem_statement": "fix it", "FAIL_TO_PASS": ["t1"], "PASS_TO_PASS": [], "version": "1.0",
            }) + "\n")
    return str(path)


def test_gpu_preset_trains_swe_bench_off_verified_and_evaluates_on_docker(tmp_path, monkeypatch):
    train = _rows(tmp_path / "gym.jsonl", ["gym__a-1", "gym__a-2"], repo="gym/a")
    verified = _rows(tmp_path / "verified.jsonl", ["django__django-1", "django__django-2"], repo="django/django")
    with pytest.raises(SystemExit, match="--swe-train-instances"):
        _preset(["--preset", "gpu", "--out", str(tmp_path), "--swe-instances", verified, "--swe-backend", "docker"], monkeypatch)
    with pytest.raises(SystemExit, match="--swe-backend docker"):
        _preset(["--preset", "gpu", "--out", str(tmp_path), "--swe-train-instances", train, "--swe-instances", verified,
                 "--swe-backend", "local"], monkeypatch)
    with pytest.raises(SystemExit, match="needs --swe-instances"):
        _preset(["--preset", "gpu", "--out", str(tmp_path), "--swe-train-instances", train, "--swe-backend", "docker"], monkeypatch)
    preset = _preset(["--preset", "gpu", "--out", str(tmp_path), "--swe-train-instances", train, "--swe-instances", verified,
                      "--swe-backend", "docker", "--swe-images-dir", "/images", "--webshop-data", "/ws",
                      "--alfworld-data", "/alf", "--swe-disjoint-repos"], monkeypatch)
    swe = preset.envs["swebench"]
    assert swe.kwargs == {"max_episode_steps": 50, "instances": train, "backend": "docker", "images_dir": "/images"}
    assert swe.eval_kwargs == {"instances": verified} and swe.eval_split == "rows" and swe.eval_tasks == 500
    from bpo_experiments.run_config import env_config

    swebench = env_config(preset, "swebench")
    assert swebench.policy.eval_temperature == 0.0 and swebench.evaluation.episodes == 1
    assert preset.envs["webshop"].kwargs["data_dir"] == "/ws"
    assert preset.envs["alfworld"].kwargs["data_dir"] == "/alf"
    # without SWE-bench the gpu preset needs no SWE-bench flags
    assert set(_preset(["--preset", "gpu", "--out", str(tmp_path), "--envs", "webshop"], monkeypatch).envs) == {"webshop"}


def test_overlapping_swe_bench_train_and_evaluation_rows_are_an_error_naming_them(tmp_path, monkeypatch):
    verified = _rows(tmp_path / "verified.jsonl", ["django__django-1", "django__django-2", "astropy__astropy-3"],
                     repo={"django__django-1": "django/django", "django__django-2": "django/django", "astropy__astropy-3": "astropy/astropy"})
    leaky = _rows(tmp_path / "leaky.jsonl", ["gym__a-1", "django__django-2"], repo="django/django")
    args = ["--preset", "gpu", "--out", str(tmp_path), "--swe-instances", verified, "--swe-backend", "docker"]
    with pytest.raises(SystemExit, match=r"1 instance\(s\) are both training and evaluation rows: \['django__django-2'\]"):
        _preset([*args, "--swe-train-instances", leaky], monkeypatch)
    same_repo = _rows(tmp_path / "same-repo.jsonl", ["gym__a-1"], repo="django/django")
    assert _preset([*args, "--swe-train-instances", same_repo], monkeypatch).envs["swebench"].eval_split == "rows"
    with pytest.raises(SystemExit, match=r"--swe-disjoint-repos: 1 repo\(s\) .*\['django/django'\]"):
        _preset([*args, "--swe-train-instances", same_repo, "--swe-disjoint-repos"], monkeypatch)
    with pytest.raises(SystemExit, match="--swe-disjoint-repos needs --swe-train-instances"):
        _preset(["--smoke", "--out", str(tmp_path), "--swe-disjoint-repos"], monkeypatch)


def test_rows_split_evaluates_every_given_row_in_order_and_refuses_shared_ids():
    """``eval_split="rows"`` (how SWE-bench evaluates on --swe-instances): the evaluation env is
    made with ``eval_kwargs`` and its tasks are taken in order; a task id it shares with the
    training env is an error. Shown on WebShop's splits, whose envs need no sandbox."""
    from bpo_experiments.presets import EnvSetup
    from bpo_experiments.tasks import task_split_with_provenance

    setup = EnvSetup("BPO-WebShop-v0", {"max_episode_steps": 5, "split": "train"}, train_tasks=4, eval_tasks=6,
                     eval_split="rows", eval_kwargs={"split": "test"})
    train_tasks, eval_tasks, data = task_split_with_provenance(setup)
    import gymnasium as gym

    test_ids = list(gym.make("BPO-WebShop-v0", split="test").unwrapped.task_ids())
    assert eval_tasks == test_ids[:6] and len(train_tasks) == 4 and not set(train_tasks) & set(eval_tasks)
    assert data["eval"]["eval_split"] == "rows"
    setup.eval_kwargs = {"split": "train"}  # the training rows again: every id is shared
    with pytest.raises(ValueError, match="also training tasks"):
        task_split_with_provenance(setup)


def test_a_flag_for_an_env_not_compared_is_an_error(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="no env of this comparison is BPO-SWEBench-v0"):
        _preset(["--smoke", "--out", str(tmp_path), "--swe-instances", "x.jsonl"], monkeypatch)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (bpo-gym-setup swebench)")
def test_cpu_swe_preset_end_to_end(tmp_path):
    pytest.importorskip("swebench", reason="needs the swe extra: pip install 'bpo-gym[swe]'")
    pytest.importorskip("transformers")
    out = tmp_path / "swe"
    compare.main(["--preset", "cpu-swe", "--out", str(out), "--no-progress"])
    results = json.loads((out / "results.json").read_text())
    text = json.dumps(results)
    assert "swebench" in text and (out / "results.md").exists()
    runs = list(out.glob("runs/swebench/*/seed0/run.json"))
    assert len(runs) == 2  # bpo, grpo
    for run in runs:
        data = json.loads(run.read_text())
        assert data, run
