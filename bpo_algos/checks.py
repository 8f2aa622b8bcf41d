"""Argument checks shared by the engine, the algorithms and the policies (one implementation,
in the env layer, so both layers use the same check)."""

from __future__ import annotations

from bpo_envs.args import check_count

__all__ = ["check_count"]
