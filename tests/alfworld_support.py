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
