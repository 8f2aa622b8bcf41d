"""BPO-SWEBench-v0's row sources (files, Hugging Face cache layouts, filters) and its two prompt
formats (``"bpo"`` and mini-swe-agent's); no sandbox needed except where marked."""

from __future__ import annotations

import json
import shutil

import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from bpo_envs.swebench import InstanceError, load_instances  # noqa: E402
from bpo_envs.swebench.output import MINI_TOO_LONG, CommandResult, OutputCollector  # noqa: E402

NAME = "princeton-nlp/SWE-bench_Verified"


def _rows(n=3):
    return [{
        "instance_id": f"org__repo-{i}", "repo": "org/repo", "base_commit": "a" * 40,
        "patch": "", "test_patch": "diff", "problem_statement": f"issue {i}", "version": "1.0",
        "FAIL_TO_PASS": json.dumps([f"t.py::test_{i}"]), "PASS_TO_PASS": "[]",
    } for i in range(n)]


def _table(rows):
    return pa.Table.from_pylist(rows)


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    return tmp_path / "hf"


def test_hub_cache_layout(hf_home):
    repo = hf_home / "hub" / "datasets--princeton-nlp--SWE-bench_Verified"
    for rev, rows in (("old", _rows(1)), ("abc123", _rows(3))):
        (repo / "snapshots" / rev / "data").mkdir(parents=True)
        pq.write_table(_table(rows), repo / "snapshots" / rev / "data" / "test-00000-of-00001.parquet")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    rows = load_instances(NAME)
    assert [r["instance_id"] for r in rows] == ["org__repo-0", "org__repo-1", "org__repo-2"]
    assert rows[1]["FAIL_TO_PASS"] == ["t.py::test_1"]
    with pytest.raises(InstanceError, match="split 'train'"):
        load_instances(NAME, split="train")


def test_datasets_cache_layout_and_filters(hf_home):
    folder = hf_home / "datasets" / "princeton-nlp___swe-bench_verified" / "default" / "0.0.0" / "f00"
    folder.mkdir(parents=True)
    table = _table(_rows(4))
    with pa.OSFile(str(folder / "swe-bench_verified-test.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    rows = load_instances(NAME, split="test", instance_ids=["org__repo-3", "org__repo-1"])
    assert [r["instance_id"] for r in rows] == ["org__repo-1", "org__repo-3"]  # the source's order
    with pytest.raises(InstanceError, match="org__repo-9"):
        load_instances(NAME, instance_ids=["org__repo-9"])


def test_saved_dataset_dict(tmp_path):
    folder = tmp_path / "saved"
    (folder / "test").mkdir(parents=True)
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": ["test"]}))
    (folder / "test" / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    table = _table(_rows(2))
    with pa.OSFile(str(folder / "test" / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    assert len(load_instances(folder)) == 2 and len(load_instances(folder, split="test")) == 2
    with pytest.raises(InstanceError, match="no split 'dev'"):
        load_instances(folder, split="dev")


def test_uncached_name_is_an_error_that_says_what_to_do(hf_home):
    with pytest.raises(InstanceError) as err:
        load_instances("SWE-bench/SWE-bench_Lite")
    text = str(err.value)
    assert "not in the local Hugging Face cache" in text and "nothing is downloaded" in text
    assert str(hf_home / "hub" / "datasets--SWE-bench--SWE-bench_Lite") in text


def test_files_and_filters(tmp_path):
    path = tmp_path / "verified.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _rows(3)))
    assert len(load_instances(path, instance_ids="org__repo-2")) == 1
    pq.write_table(_table(_rows(3)), tmp_path / "verified.parquet")
    assert len(load_instances(tmp_path / "verified.parquet")) == 3
    with pytest.raises(InstanceError, match="split"):
        load_instances(path, split="test")
    with pytest.raises(InstanceError, match="does not exist"):
        load_instances(tmp_path / "missing.jsonl")


# ---- observation formats ------------------------------------------------------------------
def _result(text, **kw):
    collector = OutputCollector(1 << 30)
    collector.feed(text.encode())
    out, elided = collector.result()
    return CommandResult(out, kw.pop("exit_code", 0), elided_chars=elided, **kw)


def test_mini_swe_agent_observation_short_and_long():
    short = _result("hello\n", exit_code=3)
    assert short.mini_observation("echo") == "<returncode>3</returncode>\n<output>\nhello\n</output>"
    assert short.observation(60) == "hello\n[exit code: 3]"
    text = "H" * 5000 + "m" * 2345 + "T" * 5000
    long = _result(text)
    obs = long.mini_observation("cat big")
    assert obs.startswith(f"<returncode>0</returncode>\n<warning>\n{MINI_TOO_LONG}\n</warning>")
    assert f"<output_head>\n{'H' * 5000}\n</output_head>" in obs
    assert "<elided_chars>\n2345 characters elided\n</elided_chars>" in obs
    assert obs.endswith(f"<output_tail>\n{'T' * 5000}\n</output_tail>")
    assert "m" * 10 not in obs  # the middle is elided
    # exactly 10,000 characters: mini-swe-agent already warns (its test is `length < 10000`)
    edge = _result("x" * 10_000).mini_observation("c")
    assert "<warning>" in edge and "0 characters elided" in edge


def test_mini_swe_agent_timeout_observation():
    res = _result("partial\n", exit_code=124, timed_out=True)
    obs = res.mini_observation("sleep 100")
    assert obs.startswith("The last command <command>sleep 100</command> timed out and has been killed.")
    assert "<output>\npartial\n\n</output>" in obs and "avoid those requiring interactive" in obs


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_env_prompt_formats():
    pytest.importorskip("swebench")
    from bpo_envs.swebench import SWEBenchEnv

    for prompt, intro_mark, obs_start in (("bpo", "<issue>", "README.md"),
                                          ("mini-swe-agent", "<pr_description>", "<returncode>0</returncode>")):
        env = SWEBenchEnv(prompt=prompt)
        try:
            obs, _ = env.reset(options={"task_id": "bpo-gym__textkit-1"})
            assert intro_mark in obs and "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in obs
            obs, *_ = env.step("ls")
            assert obs.startswith(obs_start) and "README.md" in obs
        finally:
            env.close()


@pytest.mark.parametrize("kwargs, word", [
    ({"prompt": "swe-agent"}, "prompt"), ({"grading_network": "yes"}, "grading_network"),
    ({"grade_on_truncation": 1}, "grade_on_truncation"), ({"images_dir": "/tmp"}, "images_dir"),
])
def test_bad_options_are_errors(kwargs, word):
    pytest.importorskip("swebench")
    from bpo_envs.swebench import SWEBenchEnv

    with pytest.raises(ValueError, match=word):
        SWEBenchEnv(**kwargs)
