"""A private ALFWorld game cache for a test module (generated games are cached on disk under
``$BPO_ALFWORLD_CACHE``; a module of its own keeps tests from sharing or racing on one)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def private_cache(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[None]:
    """``$BPO_ALFWORLD_CACHE`` set to a new folder ``name`` while the block runs, then as before."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BPO_ALFWORLD_CACHE", str(tmp_path_factory.mktemp(name)))
        yield


@pytest.fixture
def engine_every_step() -> Iterator[None]:
    """The transition memo off (:mod:`bpo_envs.alfworld.transitions`): every reset and step runs
    the engine, for the tests of the engine's own work (its loads, epochs and derivations). Its
    own patch, so that a test's ``monkeypatch.undo()`` leaves it on."""
    from bpo_envs.alfworld.transitions import MEMO

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MEMO, "max_bytes", 0)
        yield
