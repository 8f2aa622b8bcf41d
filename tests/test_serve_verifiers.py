"""verifiers (0.4, ``verifiers.v1``) plays every served env through its own rollout entry.

For each env a ``bpo-serve`` server runs on 127.0.0.1 (SWE-bench on its local backend) and an
OpenAI-compatible endpoint answers with the project's tiny model (tests/chat_endpoint.py), so no
network is used but the one-time ``uv`` preparation of verifiers' chat harness. In the verifiers
venv (``BPO_INSTALL_VERIFIERS=1 bpo-gym-setup verifiers``; its pins clash with openenv-core's, so
never this venv), ``bpo_envs.integrations.verifiers.load_environment`` must give verifiers' ``Env``
with one task per reset, and ``vf-eval`` (verifiers' CLI, its eval runner) must finish every
rollout without an error while the server answers its resets and steps. Slow: one ``vf-eval``
per env, about a minute each on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="needs the serve extra: pip install 'bpo-gym[serve]'")

from env_zoo import ENVS, NAMES, make_or_skip  # noqa: E402
from serve_support import ROOT, served  # noqa: E402

from bpo_envs.integrations.verifiers import eval_config, eval_toml  # noqa: E402

VENV = Path(os.environ.get("VENV_VERIFIERS") or ROOT / ".venv-verifiers")
PYTHON = VENV / "bin" / "python"
RESETS = [{"seed": 0}, {"seed": 1}]
pytestmark = pytest.mark.slow


def _venv_ready() -> bool:
    if not PYTHON.exists():
        return False
    probe = subprocess.run([str(PYTHON), "-c", "import verifiers.v1, openenv, uv, gymnasium"], capture_output=True)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def model_url():
    if not _venv_ready():
        pytest.skip(f"no verifiers venv at {VENV} (BPO_INSTALL_VERIFIERS=1 bpo-gym-setup verifiers)")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "chat_endpoint.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), line
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(20)


def _health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=30) as reply:
        return json.loads(reply.read())


@pytest.mark.parametrize("name", NAMES)
def test_vf_eval_plays_the_served_env(name, model_url, tmp_path):
    make_or_skip(name)
    env_id, kwargs, _, _ = ENVS[name]
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "BPO_TINY_KEY": "none",
               "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    with served(env_id, kwargs) as (url, _):
        urllib.request.urlopen(url + "/schema", timeout=120).read()  # the first /schema imports openenv-core
        loaded = subprocess.run(
            [str(PYTHON), "-c", "import sys, json, verifiers.v1 as vf\n"
             "from bpo_envs.integrations.verifiers import load_environment\n"
             "env = load_environment(sys.argv[1], json.loads(sys.argv[2]), max_turns=3)\n"
             "print(json.dumps([isinstance(env, vf.Env), len(list(env.taskset))]))", url, json.dumps(RESETS)],
            capture_output=True, text=True, env=environ, timeout=300,
        )
        assert loaded.returncode == 0, loaded.stderr[-3000:]
        assert json.loads(loaded.stdout.strip().splitlines()[-1]) == [True, len(RESETS)]

        config = eval_config(url, "bpo-tiny", model_url, RESETS, max_turns=3, api_key_var="BPO_TINY_KEY",
                             max_tokens=16, output_dir=str(tmp_path / "out"))
        (tmp_path / "eval.toml").write_text(eval_toml(config))
        run = subprocess.run([str(VENV / "bin" / "vf-eval"), "@", str(tmp_path / "eval.toml")], cwd=tmp_path,
                             capture_output=True, text=True, env=environ, timeout=900)
        assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
        health = _health(url)
    [traces] = list((tmp_path / "out").rglob("traces.jsonl"))
    episodes = [json.loads(line) for line in traces.read_text().splitlines()]
    assert len(episodes) == len(RESETS)
    for episode in episodes:
        assert episode["ok"] and not episode["errors"], episode["errors"]
        [trace] = episode["traces"]
        assert "openenv_reward" in trace["rewards"]
    # verifiers' OpenEnv engine reset the served env once per task and sent the model's replies
    assert health["answered"].get("reset") == len(RESETS)
    assert health["answered"].get("step", 0) >= len(RESETS)
