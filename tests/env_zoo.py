"""Every BPO env, made small, for the tests that run on all of them (fuzzing, bad input).

``make_or_skip(name)`` returns a factory, or skips the test when an optional part of the env is
declared absent: one of its Python packages is not installed, or making it raises
:class:`bpo_envs.system.MissingPartError` (a system part such as bubblewrap or a Docker daemon).
Any other exception while importing the env's module or making the env is raised: the test
fails (a half-installed engine or a bug must not pass as a skip). Under ``BPO_REQUIRE_ALL=1``
(``.ci/run``) even those skips fail, except for the reasons ``skip_policy`` allows.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable

import gymnasium as gym
import pytest

import bpo_envs  # noqa: F401 - registers the ids
from bpo_envs.system import MissingPartError

# name -> (gym id, make kwargs, modules it needs, how to get them)
ENVS: dict[str, tuple[str, dict, tuple[str, ...], str]] = {
    "treemdp": ("BPO-TreeMDP-v0", {"depth": 4, "n_actions": 3, "seed": 1, "n_tasks": 3}, (), ""),
    "webshop": ("BPO-WebShop-v0", {"max_episode_steps": 8}, (), ""),  # core dependencies: never skipped
    "alfworld": ("BPO-ALFWorld-v0", {"games_per_type": 2, "max_episode_steps": 12}, ("bpo_envs.alfworld", "textworld", "fast_downward"), "pip install 'bpo-gym[alfworld]' and run bpo-gym-setup alfworld"),
    "swebench": ("BPO-SWEBench-v0", {"step_timeout": 20}, ("bpo_envs.swebench", "swebench"), "pip install 'bpo-gym[swe]' and run bpo-gym-setup swebench"),
}
NAMES = list(ENVS)

# bad model output: none of it may raise
ADVERSARIAL_ACTIONS = [
    "",
    " ",
    "\n\n\t",
    "x" * 1_000_000,
    "search[" + "a" * 100_000 + "]",
    "click[" * 10_000,
    "]" * 5_000 + "[",
    "search[]",
    "click[]",
    "click[[[]]]",
    "\x00\x01\x02\x7f\x1b[31m",
    "".join(map(chr, range(256))),
    "\ud800\udfff lone surrogates",
    "héllo wörld 日本語 🚀 \u202eRTL\u202c e\u0301",
    "$(echo pwned) `id` ; echo x | cat > /dev/null && true || false",
    "'\"\\ %s %n {0} {{}} ${HOME} ~ * ? !!",
    "go to\x00 countertop 1",
    "a0\na1\na2",
    "A0 ",
    "look" * 20_000,
]

# the subset that no env can read as a real action (a shell env still runs them)
GARBAGE_ACTIONS = ["", " ", "\n\n\t", "\x00\x01\x02\x7f\x1b[31m", "\ud800\udfff lone surrogates", "click[[[]]]"]

_cache: dict[str, Callable[[], gym.Env]] = {}


def make_or_skip(name: str) -> Callable[[], gym.Env]:
    """A factory for env ``name`` (one instance made already: it works), or ``pytest.skip``."""
    if name in _cache:
        return _cache[name]
    env_id, kwargs, modules, how = ENVS[name]
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is not installed (a broken one raises)
            found = False
        if not found:
            pytest.skip(f"{name}: module {module!r} is not installed ({how})")
    for module in modules:
        if module.startswith("bpo_envs."):
            importlib.import_module(module)  # raises: a module that is there must import
    factory = functools.partial(gym.make, env_id, **kwargs)
    try:
        factory().close()
    except MissingPartError as exc:
        pytest.skip(f"{name}: a system part is not installed ({exc.part}): {str(exc)[:300]}")
    _cache[name] = factory
    return factory


def same(a, b) -> bool:
    """Deep equality of env outputs (floats exactly: the envs are deterministic)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "shape") or hasattr(b, "shape"):
        import numpy as np

        return bool(np.array_equal(a, b))
    return type(a) is type(b) and a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
