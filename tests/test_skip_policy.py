"""A test skips only for an optional part declared absent; a broken env fails; under
BPO_REQUIRE_ALL=1 a skip for a part the full set-up installs fails too."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import env_zoo
import gymnasium as gym
import pytest
from skip_policy import allowed

from bpo_envs.system import MissingPartError

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def fresh_cache():
    saved = dict(env_zoo._cache)
    env_zoo._cache.clear()
    yield
    env_zoo._cache.clear()
    env_zoo._cache.update(saved)


@pytest.mark.parametrize("name", ["alfworld", "treemdp"])
def test_an_env_that_raises_when_made_fails_the_test(monkeypatch, name):
    # a half-installed engine: importing works, making the env raises
    def broken(*args, **kwargs):
        raise RuntimeError("planted: the engine is half-installed")

    if name == "alfworld" and importlib.util.find_spec("textworld") is None:
        name = "treemdp"  # the alfworld package is absent here: plant the same in TreeMDP
    monkeypatch.setattr(gym, "make", broken)
    with pytest.raises(RuntimeError, match="planted"):
        env_zoo.make_or_skip(name)


def test_a_module_that_fails_to_import_fails_the_test(monkeypatch):
    real = importlib.import_module

    def broken(module, *args, **kwargs):
        if module == "bpo_envs.webshop":
            raise ImportError("planted: a syntax error in the env's module")
        return real(module, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ImportError, match="planted"):
        env_zoo.make_or_skip("webshop")


def test_a_package_not_installed_skips_saying_which(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda m, *a: None if m == "textworld" else real(m, *a))
    with pytest.raises(pytest.skip.Exception, match="module 'textworld' is not installed"):
        env_zoo.make_or_skip("alfworld")


def test_a_missing_system_part_skips_saying_which(monkeypatch):
    def missing(*args, **kwargs):
        raise MissingPartError("bubblewrap is not installed: apt-get install bubblewrap", "swebench")

    monkeypatch.setattr(gym, "make", missing)
    with pytest.raises(pytest.skip.Exception, match=r"system part is not installed \(swebench\)"):
        env_zoo.make_or_skip("treemdp")


def test_allowed_reasons_are_only_parts_the_setup_does_not_install():
    assert allowed("could not import 'vllm': No module named 'vllm'")
    assert allowed("no writable pids cgroup on this host")
    for reason in ("no Docker daemon answers (ConnectionError); bpo-gym-setup swebench starts one",
                   "alfworld: module 'textworld' is not installed",
                   "could not import 'skyrl_gym': No module named 'skyrl_gym'",
                   "bubblewrap is not installed (bpo-gym-setup swebench)"):
        assert allowed(reason) is None, reason


def _run(tmp_path: Path, require_all: bool, xdist: bool = False) -> subprocess.CompletedProcess:
    (tmp_path / "test_planted.py").write_text(
        "import pytest\n"
        "def test_needs_bwrap():\n    pytest.skip('bubblewrap is not installed (bpo-gym-setup swebench)')\n"
        "def test_needs_vllm():\n    pytest.importorskip('vllm_not_here_either', reason='vllm is not installed')\n"
        "def test_passes():\n    assert True\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    env.pop("BPO_REQUIRE_ALL", None)
    if require_all:
        env["BPO_REQUIRE_ALL"] = "1"
    workers = ["-n", "2", "--dist", "load"] if xdist else ["-p", "no:xdist"]
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "skip_policy", "-p", "no:cacheprovider",
                           *workers, str(tmp_path / "test_planted.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_require_all_fails_a_skip_for_an_installed_part_and_lists_the_allowed(tmp_path):
    done = _run(tmp_path, require_all=True)
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed, 1 skipped" in done.stdout, done.stdout
    assert "REFUSED: bubblewrap is not installed" in done.stdout
    assert "allowed (vLLM is not installed by the set-up" in done.stdout
    relaxed = _run(tmp_path, require_all=False)
    assert relaxed.returncode == 0 and "1 passed, 2 skipped" in relaxed.stdout, relaxed.stdout


def test_require_all_holds_under_pytest_xdist(tmp_path):
    # the skips are judged on the workers and summed on the controller: the summary lists both
    # workers' skips and the refused one fails the run
    pytest.importorskip("xdist", reason="pytest-xdist is not installed: pip install 'bpo-gym[test]'")
    done = _run(tmp_path, require_all=True, xdist=True)
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed, 1 skipped" in done.stdout, done.stdout
    assert "1 x REFUSED: bubblewrap is not installed" in done.stdout, done.stdout
    assert "1 x allowed (vLLM is not installed by the set-up" in done.stdout, done.stdout
    relaxed = _run(tmp_path, require_all=False, xdist=True)
    assert relaxed.returncode == 0 and "1 passed, 2 skipped" in relaxed.stdout, relaxed.stdout
    assert "skip reasons (BPO_REQUIRE_ALL unset" in relaxed.stdout, relaxed.stdout
