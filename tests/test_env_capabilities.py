"""What an env declares (docs/envs.md, "What an env declares"): each shipped env's declarations,
the base defaults a user's env gets, the readers that use them, and a scan that keeps the
project from probing its own objects with ``getattr(x, name, default)`` / ``hasattr``."""

from __future__ import annotations

import ast
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from env_zoo import ENVS, NAMES, make_or_skip

import bpo_envs
from baselines import RLOO
from bpo_algos import TabularPolicy
from bpo_envs import EnvCapabilities, SnapshotEnv, declared, require_declared
from bpo_envs.snapshot_check import _default_chooser
from bpo_envs.timing import random_action
from bpo_experiments.tasks import _ids_and_provenance

ROOT = Path(__file__).resolve().parents[1]

# ---- each shipped env ------------------------------------------------------------------------
# name: (step_may_block, restore_prefers_origin, has_expert, has provenance, has a sampler)
DECLARED = {
    "treemdp": (False, False, True, False, True),
    "webshop": (False, False, True, True, True),
    "alfworld": (True, True, True, True, False),
    "swebench": (True, False, True, False, True),
}
assert set(DECLARED) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_each_shipped_env_declares_what_it_can_do(name):
    env = make_or_skip(name)()
    try:
        owner = declared(env)
        assert owner is env.unwrapped and require_declared(env, "this test") is owner  # through gym.make's wrappers
        may_block, prefers_origin, has_expert, has_provenance, has_sampler = DECLARED[name]
        assert (owner.step_may_block, owner.restore_prefers_origin, owner.has_expert) == (may_block, prefers_origin, has_expert)
        assert type(owner).step_may_block is may_block  # a class attribute: the pool and bpo-serve read the class
        assert isinstance(owner.max_episode_steps, int) and owner.max_episode_steps >= 1

        ids = owner.task_ids()
        assert ids is not None and len(ids) > 0
        _, info = env.reset(seed=0, options={"task_id": ids[0]})  # ALFWorld: its first game plans in ms
        assert info["task_id"] == ids[0]
        plan = owner.expert_actions()
        assert plan and all(isinstance(a, str) for a in plan)

        provenance = owner.provenance()
        if has_provenance:
            assert isinstance(provenance, dict) and provenance["env"] == ENVS[name][0]
        else:
            assert provenance is None

        rng, twin = np.random.default_rng(5), np.random.default_rng(5)
        action = owner.sample_action(rng)
        if has_sampler:
            assert isinstance(action, str) and action == owner.sample_action(twin)
        else:
            assert action is None
            assert rng.random() == twin.random()  # the default consumes nothing
    finally:
        env.close()


# ---- a user's env that overrides nothing -------------------------------------------------------
class Minimal(SnapshotEnv):
    """The least a user writes: the task logic, no declarations."""

    def __init__(self) -> None:
        super().__init__(max_episode_steps=3)
        self._position = 0

    def _reset_task(self, task_id):
        self._position = 0
        return f"task {task_id} at 0", {"admissible_actions": ["go", "stay"]}

    def _step(self, action):
        self._position += action == "go"
        return f"at {self._position}", float(self._position), self._position >= 2, {"admissible_actions": ["go", "stay"]}

    def _get_state(self):
        return self._position

    def _set_state(self, state):
        self._position = state


def test_a_users_env_that_declares_nothing_gets_the_documented_defaults():
    env = Minimal()
    assert isinstance(env, EnvCapabilities) and declared(env) is env
    assert (env.step_may_block, env.restore_prefers_origin, env.has_expert, env.max_episode_steps) == (True, False, False, 3)
    assert env.task_ids() is None and env.provenance() is None
    rng = np.random.default_rng(0)
    assert env.sample_action(rng) is None and rng.random() == np.random.default_rng(0).random()
    with pytest.raises(NotImplementedError, match="has_expert"):
        env.expert_actions()
    # no fixed task list: a task is named at reset, any name the env's _reset_task takes
    with pytest.raises(ValueError, match="task_id"):
        env.reset(seed=0)
    obs, info = env.reset(options={"task_id": "anything"})
    assert obs == "task anything at 0" and info["task_id"] == "anything"


def test_the_readers_use_the_defaults():
    env = Minimal()
    env.reset(options={"task_id": "t"})
    with pytest.raises(ValueError, match="no sample_action"):  # no admissible actions, no sampler
        random_action(env, {}, np.random.default_rng(0))
    chooser = _default_chooser(env)  # falls back to the action space
    assert all(isinstance(chooser("", {}, np.random.default_rng(s)), str) for s in range(5))
    # the engine reads the declared step limit (its first tree's cost prior) and no restore preference
    batch = RLOO(group_size=2, seed=0).collect(TabularPolicy(seed=0), [Minimal] * 2, ["t", "u"])
    assert batch.n_trees == 2 and {t.task_id for t in batch.trees} == {"t", "u"}
    with pytest.raises(ValueError, match="no fixed task list"):  # a comparison needs a task list
        _ids_and_provenance(Minimal)


class NotOurs(gym.Env):
    """A Gymnasium env that is not a bpo_envs env: it declares nothing."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)


def test_an_env_that_is_not_ours_declares_nothing_and_is_refused_where_declarations_are_needed():
    env = gym.wrappers.OrderEnforcing(NotOurs())
    assert declared(env) is None
    with pytest.raises(TypeError, match=r"SnapshotEnv.*NotOurs|NotOurs.*SnapshotEnv") as caught:
        require_declared(env, "a comparison's task split")
    assert "a comparison's task split" in str(caught.value)
    with pytest.raises(TypeError, match="SnapshotEnv"):
        _ids_and_provenance(NotOurs)
    # where nothing needs them, an env that is not ours still works: walked by its action space
    assert _default_chooser(env)("", {}, np.random.default_rng(0)) in (0, 1, "this is not an action #%&")


def test_a_time_limit_above_the_env_is_checked_against_its_declared_limit():
    with pytest.raises(ValueError, match="truncates at its own limit, 3 steps"):
        bpo_envs.check_step_limit(gym.wrappers.TimeLimit(Minimal(), max_episode_steps=5))
    bpo_envs.check_step_limit(gym.wrappers.TimeLimit(Minimal(), max_episode_steps=2))
    bpo_envs.check_step_limit(gym.wrappers.TimeLimit(NotOurs(), max_episode_steps=5))  # declares no limit


# ---- no probing of the project's own objects ---------------------------------------------------
SCANNED = ("bpo_envs", "bpo_algos")
MARK = "third-party"
"""A probe of an object that is not ours says so in a comment on its line (or the line above):
``# third-party: <why>``."""

def probes(source: str) -> list[tuple[int, str, bool]]:
    """Every ``getattr(x, name, default)`` and ``hasattr(x, name)`` in ``source``: (line, code,
    whether a comment on its lines or the line above marks it third-party)."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if (node.func.id, len(node.args)) not in (("getattr", 3), ("hasattr", 2)):
            continue
        around = lines[max(node.lineno - 2, 0) : node.end_lineno]
        marked = any("#" in line and MARK in line.split("#", 1)[1].lower() for line in around)
        out.append((node.lineno, ast.get_source_segment(source, node), marked))
    return out


def unmarked(root: Path) -> list[str]:
    found = []
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for line, code, marked in probes(path.read_text()):
                if not marked:
                    found.append(f"{rel}:{line}: {code}")
    return found


def test_no_probe_of_the_projects_own_objects():
    found = unmarked(ROOT)
    assert not found, (
        "read a declaration (docs/envs.md, 'What an env declares') instead of probing; a probe of an "
        "object that is not ours says why in a '# third-party: ...' comment:\n" + "\n".join(found)
    )


def test_the_scan_flags_a_probe_and_passes_a_commented_third_party_one(tmp_path):
    package = tmp_path / "bpo_envs"
    package.mkdir()
    (package / "ok.py").write_text(
        "def f(env, tokenizer):\n"
        "    a = getattr(env, 'name')  # two arguments: no default, not a probe\n"
        "    b = getattr(tokenizer, 'chat_template', None)  # third-party: a transformers tokenizer\n"
        "    # third-party: numpy scalars\n"
        "    return a, b, hasattr(\n        env, 'item')\n"
    )
    assert unmarked(tmp_path) == []
    (package / "probe.py").write_text(
        "def f(env):\n"
        "    limit = getattr(env.unwrapped, 'max_episode_steps', None)  # the limit\n"
        "    return limit, hasattr(env, 'sample_action')\n"
    )
    assert unmarked(tmp_path) == [
        "bpo_envs/probe.py:2: getattr(env.unwrapped, 'max_episode_steps', None)",
        "bpo_envs/probe.py:3: hasattr(env, 'sample_action')",
    ]
