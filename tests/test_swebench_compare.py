"""SWE-bench in the main job (``bpo-compare``): the data-source flags, the gpu preset's demand
for SWE-bench Verified on docker, and (slow) the CPU preset ``cpu-swe`` end to end."""

from __future__ import annotations

import json
import shutil

import pytest

from bpo_algos.experiments import compare


class _Built(Exception):
    def __init__(self, preset):
        self.preset = preset


def _preset(argv, monkeypatch):
    """The preset ``bpo-compare argv`` would run (parsing only: nothing is trained); a bad
    combination raises SystemExit as the command does."""
    original = compare.build_preset

    def stop(args, *rest):
        raise _Built(original(args, *rest))

    monkeypatch.setattr(compare, "build_preset", stop)
    try:
        compare.main(argv)
    except _Built as built:
        return built.preset
    raise AssertionError("build_preset was not called")


def test_gpu_preset_requires_swe_bench_verified_on_docker(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="--swe-instances .*--swe-backend docker"):
        _preset(["--preset", "gpu", "--out", str(tmp_path)], monkeypatch)
    with pytest.raises(SystemExit, match="--swe-backend docker"):
        _preset(["--preset", "gpu", "--out", str(tmp_path), "--swe-instances", "v.parquet", "--swe-backend", "local"], monkeypatch)
    preset = _preset(["--preset", "gpu", "--out", str(tmp_path), "--swe-instances", "princeton-nlp/SWE-bench_Verified",
                      "--swe-backend", "docker", "--swe-images-dir", "/images", "--webshop-data", "/ws",
                      "--alfworld-data", "/alf"], monkeypatch)
    assert preset.envs["swebench"].kwargs == {"max_episode_steps": 50, "instances": "princeton-nlp/SWE-bench_Verified",
                                              "backend": "docker", "images_dir": "/images"}
    assert preset.envs["webshop"].kwargs["data_dir"] == "/ws"
    assert preset.envs["alfworld"].kwargs["data_dir"] == "/alf"
    # without SWE-bench the gpu preset needs no SWE-bench flags
    assert set(_preset(["--preset", "gpu", "--out", str(tmp_path), "--envs", "webshop"], monkeypatch).envs) == {"webshop"}


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
