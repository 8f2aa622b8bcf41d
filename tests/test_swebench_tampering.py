"""Grading runs the repository's own test machinery, not the agent's (docs/reliability.md,
"Reward tampering"): every way a patch could change how the tests run is reset before the eval
script, on both backends, and listed in ``info["tampered"]``.

Each attack is the one a reward-hacking agent finds first on the bundled ``textkit`` row: a
root ``conftest.py`` hook wrapper forcing every outcome to "passed", the same in
``tests/conftest.py``, a root ``pytest.py`` shadowing pytest (it runs the real one with that
hook, so ``PASSED`` lines are printed), ``addopts = -p PLUGIN`` in ``setup.cfg``'s
``[tool:pytest]`` or ``pyproject.toml``'s ``[tool.pytest.ini_options]``, and ``PYTEST_ADDOPTS``
set by the agent (``bpo_envs/swebench/tampering_attacks.py``, which
``studies/swebench_attacks.py --tampering`` plays too). Each scores 0 with its paths listed;
the broken case (the reset switched off) scores 1, so the attacks are real; the row's gold
patch still resolves, also next to an attack.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("swebench", reason="needs the swe extra: pip install 'bpo-gym[swe]'")

from docker_support import docker_problem  # noqa: E402

from bpo_envs.swebench import SWEBenchEnv, bundled_instances, tampering  # noqa: E402
from bpo_envs.swebench.tampering_attacks import ATTACKS, PYTEST_ADDOPTS_ATTACK  # noqa: E402

TASK = "bpo-gym__textkit-1"
_DOCKER = docker_problem()
LOCAL = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap")
BACKENDS = [
    pytest.param("local", marks=LOCAL),
    pytest.param("docker", marks=pytest.mark.skipif(_DOCKER is not None, reason=_DOCKER or "")),
]


def _make(backend: str) -> SWEBenchEnv:
    rows = [r for r in bundled_instances() if r["instance_id"] == TASK]
    return SWEBenchEnv(rows, backend=backend, step_timeout=30)


def _play(env: SWEBenchEnv, actions: list[str]) -> tuple[str, float, dict]:
    env.reset(options={"task_id": TASK})
    obs, reward, info = "", 0.0, {}
    for action in [*actions, "submit"]:
        obs, reward, terminated, truncated, info = env.step(action)
    assert terminated, obs
    return obs, reward, info


def _gold(env: SWEBenchEnv) -> list[str]:
    env.reset(options={"task_id": TASK})
    return env.expert_actions()[:-1]


@pytest.fixture(scope="module", params=BACKENDS)
def env(request):
    e = _make(request.param)
    yield e
    e.close()


@pytest.fixture
def no_reset(monkeypatch):
    """The broken case: the program that resets the machinery, with nothing on its list."""
    source = tampering.program_source().replace(
        'if __name__ == "__main__":',
        "def classify(*args, **kwargs):\n    return None\n\n\nif __name__ == \"__main__\":")
    monkeypatch.setattr(tampering, "program_source", lambda: source)


# ---- on both backends ---------------------------------------------------------------------
def test_gold_patch_resolves_with_nothing_reset(env):
    obs, reward, info = _play(env, _gold(env))
    assert reward == 1.0 and info["resolved"] and info["tampered"] == [], obs
    assert "test machinery" not in obs


# the paths every agent finds first run in the default stage; the others (two more gradings per
# backend) in the slow one
SLOW_ATTACKS = ("pyproject.toml [tool.pytest.ini_options] addopts plugin", "a .dist-info entry point (pytest11) plugin")


@pytest.mark.parametrize("attack", [pytest.param(a, marks=pytest.mark.slow) if a in SLOW_ATTACKS else a
                                    for a in ATTACKS])
def test_tampering_is_reset_and_scores_zero(env, attack):
    actions, reset = ATTACKS[attack]
    obs, reward, info = _play(env, actions)
    assert reward == 0.0 and not info["resolved"], obs
    assert info["tampered"] == reset
    assert info["fail_to_pass"] == 0.0 and info["pass_to_pass"] == 1.0  # the repo's own verdict
    assert "grading reset it" in obs and reset[0] in obs
    assert "grading_hint" not in info


@pytest.mark.slow
def test_gold_patch_next_to_tampering_still_resolves(env):
    # a real fix graded without the conftest and the config section it came with
    attack = ATTACKS["root conftest.py forcing passed"].actions + ATTACKS["setup.cfg [tool:pytest] addopts plugin"].actions
    obs, reward, info = _play(env, _gold(env) + attack)
    assert reward == 1.0 and info["resolved"], obs
    assert info["tampered"] == ["conftest.py", "setup.cfg [pytest section]"]


def test_pytest_addopts_set_by_the_agent_does_not_reach_grading(env):
    env.reset(options={"task_id": TASK})
    for action in PYTEST_ADDOPTS_ATTACK.actions:
        obs = env.step(action)[0]
    assert "1 passed" in obs  # the plugin forces a failing test to pass where the agent runs it
    obs, reward, terminated, _, info = env.step("submit")
    assert reward == 0.0 and info["fail_to_pass"] == 0.0 and info["pass_to_pass"] == 1.0, obs
    assert info["tampered"] == []  # nothing in the machinery: the environment was never carried


@pytest.mark.slow
@pytest.mark.parametrize("task_id", [r["instance_id"] for r in bundled_instances()])
def test_every_bundled_gold_patch_resolves_on_docker(task_id):
    # the local backend's: tests/test_swebench.py::test_gold_patch_resolves
    if _DOCKER is not None:
        pytest.skip(_DOCKER)
    env = SWEBenchEnv([r for r in bundled_instances() if r["instance_id"] == task_id],
                      backend="docker", step_timeout=30)
    try:
        env.reset(options={"task_id": task_id})
        for action in env.expert_actions():
            obs, reward, terminated, truncated, info = env.step(action)
        assert reward == 1.0 and info["tampered"] == [] and info["pass_to_pass"] == 1.0, obs
    finally:
        env.close()


# ---- the broken case: the same attacks score 1 when nothing is reset (slow: 7 gradings) ----
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_without_the_reset_every_attack_resolves(backend, no_reset):
    env = _make(backend)
    try:
        for attack, (actions, _) in ATTACKS.items():
            obs, reward, info = _play(env, actions)
            assert reward == 1.0 and info["tampered"] == [], (attack, obs)
    finally:
        env.close()


@LOCAL
def test_grading_whose_reset_fails_scores_zero_and_says_why(monkeypatch):
    # fail closed: without the reset's report the tests are not run, even for the gold patch
    source = tampering.program_source().replace(
        'if __name__ == "__main__":', 'if __name__ == "__main__" and sys.argv[1] == "reset":\n'
        '    sys.exit(3)\nif __name__ == "__main__":')
    monkeypatch.setattr(tampering, "program_source", lambda: source)
    env = _make("local")
    try:
        obs, reward, info = _play(env, _gold(env))
        assert reward == 0.0 and not info["resolved"] and info["tampered"] == []
        assert "test machinery could not be reset" in info["grading_hint"] and "scored 0" in obs
        assert "PASSED" not in info["test_output"]
    finally:
        env.close()


# ---- the rules, without a sandbox -----------------------------------------------------------
@pytest.mark.parametrize(("path", "kind"), [
    ("conftest.py", "whole"), ("tests/unit/conftest.py", "whole"), ("pytest.ini", "whole"),
    ("tests/.pytest.ini", "whole"), ("pytest.toml", "whole"), ("pytest.py", "whole"),
    ("py.py", "whole"), ("unittest.py", "whole"), ("sitecustomize.py", "whole"),
    ("usercustomize.py", "whole"), ("argparse.py", "whole"), ("pluggy.pyc", "whole"),
    ("_pytest/__init__.py", "whole"), ("pytest/__init__.pyc", "whole"),
    ("inspect.cpython-311-x86_64-linux-gnu.so", "whole"), ("lib/evil.pth", "whole"),
    ("evil-1.0.dist-info/entry_points.txt", "whole"), ("src/pkg.egg-info/entry_points.txt", "whole"),
    ("tests/__pycache__/conftest.cpython-311-pytest-9.2.0.pyc", "whole"),
    ("__pycache__/argparse.cpython-311.pyc", "whole"), ("py/__pycache__/__init__.cpython-39.pyc", "whole"),
    ("setup.cfg", "section"), ("tox.ini", "section"), ("pyproject.toml", "section"),
    ("tests/setup.cfg", "section"),
    # the agent's to change: the package under test (pytest's own src/_pytest, sympy's
    # sympy/utilities/pytest.py: inside packages), scripts, tests, docs
    ("src/_pytest/python.py", None), ("sympy/utilities/pytest.py", None), ("tests/argparse.py", None),
    ("setup.py", None), ("reproduce.py", None), ("tests/test_x.py", None), ("README.md", None),
    ("tests", None), ("conftest.py.orig", None), ("tests/__pycache__/test_x.cpython-311.pyc", None),
    ("pkg/__pycache__/argparse.cpython-311.pyc", None),
])
def test_classify(path, kind):
    assert tampering.classify(path) == kind


def test_runner_files_of_non_pytest_test_commands():
    assert tampering.runner_files("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1") == [
        "tests/runtests.py", "tests/test_sqlite.py"]
    assert tampering.runner_files(
        "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose") == ["bin/test"]
    assert tampering.runner_files("tox --current-env -epy39 -v --") == ["tox.ini"]
    assert tampering.runner_files("pytest --no-header -rA --tb=no -p no:cacheprovider") == []
    assert tampering.runner_files("python ../../etc/x.py /abs/y.py") == []
    assert tampering.classify("bin/test", frozenset(["bin/test"])) == "whole"


def _pytest_config(tmp_path: Path, name: str, text: str | None):
    """What pytest itself reads from the file ``name`` holding ``text`` (None: no file)."""
    from _pytest.config.findpaths import load_config_dict_from_file

    folder = tmp_path / f"cfg{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    if text is None:
        return None
    (folder / name).write_bytes(text.encode())
    return load_config_dict_from_file(folder / name)


def _sections(text: str) -> dict:
    import iniconfig

    cfg = iniconfig.IniConfig("x", data=text)
    return {s.name: dict(s.items()) for s in cfg if s.name not in ("pytest", "tool:pytest")}


INI_BASE = "[metadata]\nname = x\n\n[tool:pytest]\ntestpaths = tests\n\n[flake8]\nmax-line-length = 99\n"
INI_AGENT = [
    # addopts added to the section, and a real change elsewhere
    INI_BASE.replace("testpaths = tests", "testpaths = tests\naddopts = -p evil").replace("99", "100"),
    # the section removed, then given again at the end with a comment on its header
    "[metadata]\nname = y\n\n[flake8]\nmax-line-length = 99\n[tool:pytest] # hi\naddopts = -p evil\n",
    # CR line endings and a byte-order mark (iniconfig reads both)
    "\ufeff" + INI_BASE.replace("\n", "\r").replace("tests\r", "tests\r  -p evil\r"),
    # the section's body as a continuation of the previous section's value cannot hide a header
    "[metadata]\nname = x\n\n[tool:pytest]\naddopts = -p evil\n    [flake8]\n",
    # the legacy [pytest] section in setup.cfg (pytest refuses it) and no pytest section at all
    "[metadata]\nname = x\n[pytest]\naddopts = -p evil\n",
    "[metadata]\nname = z\n",
]


@pytest.mark.parametrize("agent", INI_AGENT)
def test_setup_cfg_splice_gives_pytest_the_base_section_and_keeps_the_rest(tmp_path, agent):
    out = tampering.splice("setup.cfg", INI_BASE.encode(), agent.encode())
    assert out is not None
    text = out.decode()
    assert _pytest_config(tmp_path, "setup.cfg", text) == _pytest_config(tmp_path, "setup.cfg", INI_BASE)
    assert _sections(text.lstrip("\ufeff")) == _sections(agent.lstrip("\ufeff"))


def test_new_tox_ini_loses_only_its_pytest_section(tmp_path):
    agent = "[tox]\nenvlist = py311\n\n[pytest]\naddopts = -p evil\n"
    out = tampering.splice("tox.ini", b"", agent.encode()).decode()
    assert out == "[tox]\nenvlist = py311\n\n"
    assert _pytest_config(tmp_path, "tox.ini", out) is None


TOML_BASE = '[project]\nname = "x"\nversion = "1"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n\n[tool.ruff]\nline-length = 99\n'
TOML_AGENT = [
    TOML_BASE.replace('testpaths = ["tests"]', 'testpaths = ["tests"]\naddopts = "-p evil"').replace('"1"', '"2"'),
    TOML_BASE.replace("[tool.pytest.ini_options]", '[ tool . "pytest" . ini_options ]').replace(
        'testpaths = ["tests"]', 'addopts = "-p evil"'),
    '[project]\nname = "x"\nversion = "1"\n\n[tool.ruff]\nline-length = 100\n\n[tool.pytest]\naddopts = ["-p", "evil"]\n',
    '[project]\nname = "y"\nversion = "1"\n\n[tool.ruff]\nline-length = 99\n',
]


@pytest.mark.parametrize("agent", TOML_AGENT)
def test_pyproject_splice_gives_pytest_the_base_table_and_keeps_the_rest(tmp_path, agent):
    import tomllib

    out = tampering.splice("pyproject.toml", TOML_BASE.encode(), agent.encode())
    assert out is not None
    text = out.decode()
    assert _pytest_config(tmp_path, "pyproject.toml", text) == _pytest_config(tmp_path, "pyproject.toml", TOML_BASE)
    assert tampering._without_pytest(tomllib.loads(text)) == tampering._without_pytest(tomllib.loads(agent))


@pytest.mark.parametrize("agent", [
    # dotted keys and inline tables cannot be cut out line by line: the whole file is restored
    'tool.pytest.ini_options.addopts = "-p evil"\n' + TOML_BASE,
    TOML_BASE.replace("[tool.ruff]", "[tool]\npytest = {ini_options = {addopts = \"-p evil\"}}\n[tool.ruff]"),
    "not = [toml",
])
def test_pyproject_that_cannot_be_spliced_is_restored_whole(agent):
    assert tampering.splice("pyproject.toml", TOML_BASE.encode(), agent.encode()) is None


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            elif p.is_file():
                out[rel] = p.read_text()
            else:
                out[rel] = "other"
    return out


def _program(*args: str) -> subprocess.CompletedProcess:
    # run as in the sandbox: isolated, no site, from /
    return subprocess.run([sys.executable, "-I", "-S", tampering.__file__, *args], cwd="/",
                          capture_output=True, text=True, timeout=60)


def test_program_restores_removes_and_reports(tmp_path):
    root, store = tmp_path / "testbed", str(tmp_path / "machinery.json")
    (root / "tests" / "unit").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "pkg").mkdir()
    (root / "pkg.egg-info").mkdir()
    base = {
        "conftest.py": "# base root\n", "tests/conftest.py": "# base tests\n",
        "tests/unit/conftest.py": "# base unit\n", "tests/test_a.py": "def test_a(): pass\n",
        "pkg/__init__.py": "", "pkg.egg-info/entry_points.txt": "[console_scripts]\n",
        "setup.cfg": INI_BASE, "README.md": "base\n", ".git/conftest.py": "# git's\n",
    }
    for rel, text in base.items():
        (root / rel).write_text(text)
    before = _tree(root)
    assert _program("snapshot", str(root), store).returncode == 0
    # the patch: changes, deletions, additions, a link, a FIFO, a folder turned into a link
    (root / "conftest.py").write_text("# evil\n")
    (root / "tests" / "conftest.py").unlink()
    (root / "pytest.py").write_text("# shadow\n")
    (root / "argparse").mkdir()
    (root / "argparse" / "__init__.py").write_text("# shadow\n")
    (root / "pkg" / "conftest.py").symlink_to("../conftest.py")
    os.mkfifo(root / "pkg" / "sub.pth")
    (root / "pkg.egg-info" / "entry_points.txt").write_text("[pytest11]\nevil = evil\n")
    (root / "evil-1.dist-info").mkdir()
    (root / "evil-1.dist-info" / "entry_points.txt").write_text("[pytest11]\nevil = evil\n")
    shutil.rmtree(root / "tests" / "unit")
    (root / "elsewhere").mkdir()
    (root / "tests" / "unit").symlink_to("../elsewhere")
    (root / "setup.cfg").write_text(INI_AGENT[0])
    (root / "README.md").write_text("the agent's\n")
    (root / "tests" / "test_a.py").write_text("def test_a(): assert 1\n")
    done = _program("reset", str(root), store, "bin/run")
    assert done.returncode == 0, done.stderr
    reported, count = tampering.read_report(done.stdout)
    assert count == len(reported)
    assert sorted(reported) == sorted([
        "argparse/__init__.py", "conftest.py", "evil-1.dist-info", "pkg.egg-info/entry_points.txt",
        "pkg/conftest.py", "pkg/sub.pth", "pytest.py", "setup.cfg [pytest section]",
        "tests/conftest.py", "tests/unit/conftest.py"])
    after = _tree(root)
    expected = {**before, "README.md": "the agent's\n", "tests/test_a.py": "def test_a(): assert 1\n",
                "argparse": "dir", "elsewhere": "dir", "setup.cfg": after["setup.cfg"]}
    assert after == expected  # the folder link is a folder again, holding only the base conftest
    assert "max-line-length = 100" in after["setup.cfg"] and "evil" not in after["setup.cfg"]


def test_program_reports_nothing_when_nothing_changed(tmp_path):
    root, store = tmp_path / "t", str(tmp_path / "m.json")
    root.mkdir()
    (root / "conftest.py").write_text("x = 1\n")
    (root / "pyproject.toml").write_text(TOML_BASE)
    assert _program("snapshot", str(root), store).returncode == 0
    (root / "pyproject.toml").write_text(TOML_BASE.replace('"1"', '"2"'))  # not pytest's part
    assert tampering.read_report(_program("reset", str(root), store).stdout) == ([], 0)
    assert tampering.read_report("noise\n") is None
    assert tampering.read_report(tampering.REPORT_PREFIX + '{"a": 1}\n') is None
    assert tampering.read_report(tampering.REPORT_PREFIX + '["conftest.py"]\n') is None


def test_report_is_bounded_and_read_back_as_text():
    # the grading run's output keeps its first 5,000 characters: the report fits, and says how
    # many paths were reset past what it lists; names that are not UTF-8 read back as text
    paths = [f"deep/{'d' * 500}/{i}/conftest.py" for i in range(1000)] + ["bad\udcff.pth"]
    line = tampering.report_line(paths)
    assert len(line) <= tampering.REPORT_CHARS
    listed, count = tampering.read_report("agent noise\n" + line + "\n" + tampering.report_line([]))
    assert count == 1001 and 0 < len(listed) < 1001 and all(len(p) <= tampering.PATH_CHARS + 3 for p in listed)
    listed, count = tampering.read_report(tampering.report_line(["bad\udcff.pth"]))
    assert listed == ["bad\ufffd.pth"] and count == 1
    listed[0].encode("utf-8")
