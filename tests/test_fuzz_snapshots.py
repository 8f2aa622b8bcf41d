"""Snapshot fuzzing for every env: random interleavings of reset / step / snapshot / restore
(in place, into another instance, from portable bytes) / release, checked step by step against
a replay reference (a third instance that gets ``reset(seed)`` + the recorded actions).

The default run is bounded (a few dozen programs per env); ``-m slow`` runs the long profile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from env_zoo import ADVERSARIAL_ACTIONS, NAMES, make_or_skip, same
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

import bpo_envs
from bpo_envs.tree_mdp import TreeMDPEnv

# examples per env (default, slow): the heavier envs get fewer programs
PROFILES = {
    "treemdp": (400, 2000),
    "webshop": (200, 1000),
    "alfworld": (5, 40),
    "swebench": (4, 20),
}
STEPS = (40, 80)

SEEDS = st.integers(0, 2**16)
FREE_TEXT = st.text(max_size=40) | st.sampled_from([a[:2000] for a in ADVERSARIAL_ACTIONS])


def sequential(command: str) -> str:
    """``command`` with its concurrent parts run one after another.

    bash runs ``a & b`` and ``a | b`` concurrently, so the order of their output is a race that
    no snapshot can fix (the long fuzzer once typed ``x&y``: two "command not found" lines in
    either order). The sandbox is checked on commands whose output is a function of its state."""
    return command.replace("&", ";").replace("|", ";")


@dataclass(eq=False)
class Saved:
    snap: bpo_envs.Snapshot
    seed: int
    actions: tuple[str, ...]
    done: bool
    released: bool = False


class SnapshotMachine(RuleBasedStateMachine):
    """Two envs under test (restores may cross between them) and one replay reference."""

    saved = Bundle("saved")

    def __init__(self, make, shell=False):
        super().__init__()
        self.shell = shell
        self.envs = [make(), make()]
        self.ref = make()
        self.cur = 0
        self.seed = 0
        self.actions: list[str] = []
        self.done = False
        self.info: dict = {}
        self.all_saved: list[Saved] = []

    @property
    def env(self):
        return self.envs[self.cur]

    def _replay_reference(self, seed, actions):
        obs, info = self.ref.reset(seed=seed)
        for action in actions:
            obs, _, _, _, info = self.ref.step(action)
        return obs, info

    @initialize(seed=SEEDS)
    def start(self, seed):
        self.reset(seed)

    @rule(seed=SEEDS)
    def reset(self, seed):
        got = self.env.reset(seed=seed)
        want = self.ref.reset(seed=seed)
        assert same(got, want), f"reset(seed={seed}) differs from the reference"
        self.seed, self.actions, self.done, self.info = seed, [], False, got[1]

    @precondition(lambda self: not self.done)
    @rule(valid=st.booleans() | st.just(True), pick=st.integers(0, 10**6), text=FREE_TEXT)
    def step(self, valid, pick, text):
        admissible = self.info.get("admissible_actions")
        sampled = self.env.unwrapped.sample_action(np.random.default_rng(pick)) if valid and not admissible else None
        if valid and admissible:
            action = admissible[pick % len(admissible)]
        elif sampled is not None:  # the env's declared sampler (None where it has none)
            action = sampled
        else:
            action = sequential(text) if self.shell else text
        got = self.env.step(action)
        want = self.ref.step(action)
        assert same(got, want), f"step {len(self.actions)} ({action[:60]!r}) after {self.actions[-5:]} differs from the replay reference"
        self.actions.append(action)
        self.done = bool(got[2] or got[3])
        self.info = got[4]

    @rule(target=saved)
    def snapshot(self):
        saved = Saved(bpo_envs.snapshot(self.env), self.seed, tuple(self.actions), self.done)
        self.all_saved.append(saved)
        return saved

    @rule(saved=saved, into=st.integers(0, 1), portable=st.booleans())
    def restore(self, saved, into, portable):
        if saved.released:
            with pytest.raises(bpo_envs.SnapshotReleasedError):
                bpo_envs.restore(self.envs[into], saved.snap)
            return
        bpo_envs.restore(self.envs[into], saved.snap.portable() if portable else saved.snap)
        self.cur = into
        self.seed, self.actions, self.done = saved.seed, list(saved.actions), saved.done
        _, self.info = self._replay_reference(saved.seed, saved.actions)

    @rule(saved=saved)
    def release(self, saved):
        saved.snap.release()
        saved.released = True

    def teardown(self):
        for saved in self.all_saved:
            saved.snap.release()
        for env in (*self.envs, self.ref):
            env.close()


def _run(name, profile):
    make = make_or_skip(name)
    run_state_machine_as_test(
        lambda: SnapshotMachine(make, shell=name == "swebench"),
        settings=settings(
            max_examples=PROFILES[name][profile],
            stateful_step_count=STEPS[profile],
            deadline=None,
            database=None,
            derandomize=profile == 0,
            suppress_health_check=list(HealthCheck),
        ),
    )


@pytest.mark.parametrize("name", NAMES)
def test_snapshot_fuzz(name):
    _run(name, 0)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_snapshot_fuzz_long(name):
    _run(name, 1)


class ForgetfulTreeMDP(TreeMDPEnv):
    """A broken env: restoring loses the last action of the saved path."""

    def _set_state(self, state):
        path, nonce = state
        super()._set_state((path[:-1], nonce))


def test_the_fuzzer_catches_a_broken_restore():
    make = lambda: ForgetfulTreeMDP(depth=4, n_actions=3, seed=1)  # noqa: E731
    with pytest.raises(AssertionError, match="differs from the replay reference"):
        run_state_machine_as_test(
            lambda: SnapshotMachine(make),
            settings=settings(max_examples=200, phases=[Phase.generate], deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)),
        )
