"""Adapters that put the BPO envs inside other RL trainers (docs/other-trainers.md).

* :mod:`bpo_envs.integrations.trl`: an ``environment_factory`` for TRL's ``GRPOTrainer``
  (extra ``trl``);
* :mod:`bpo_envs.integrations.skyrl`: a ``skyrl_gym`` text env, :class:`~bpo_envs.integrations.skyrl.SkyRLEnv`
  (extra ``skyrl``).

Each adapter imports its trainer package when it is imported; a missing or too old package
raises an ``ImportError`` that names the extra to install.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType

from bpo_envs.prompting import PromptConfig


def require(module: str, distribution: str, extra: str, minimum: str, below: str | None = None) -> ModuleType:
    """Import ``module`` from ``distribution`` at a version in ``[minimum, below)``, or raise.

    The error names the extra: ``pip install 'bpo-gym[<extra>]'``.
    """
    hint = f"pip install 'bpo-gym[{extra}]'"
    span = f">={minimum}" + (f",<{below}" if below else "")
    try:
        installed = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        raise ImportError(
            f"bpo_envs.integrations.{extra} needs {distribution}{span}, which is not installed: {hint}"
        ) from None
    if not _at_least(installed, minimum) or (below is not None and _at_least(installed, below)):
        raise ImportError(
            f"bpo_envs.integrations.{extra} needs {distribution}{span}, found {installed}: {hint}"
        )
    return importlib.import_module(module)


def require_summary_layout(config: PromptConfig, trainer: str) -> PromptConfig:
    """``config``, whose layout must be ``"summary"``: an adapter's trainer keeps the
    conversation, and so the history, itself; the adapter sends each step's observation only."""
    if config.layout != "summary":
        raise ValueError(f"prompt_config layout={config.layout!r}: {trainer}'s conversation holds the history itself, "
                         "so the integration needs the 'summary' layout")
    return config


def _at_least(version: str, floor: str) -> bool:
    def key(v: str) -> tuple[int, ...]:
        out = []
        for part in v.split("+")[0].split("."):
            digits = "".join(ch for ch in part if ch.isdigit()) if not part.isdigit() else part
            if not digits:
                break
            out.append(int(digits))
            if not part.isdigit():
                break
        return tuple(out)

    return key(version) >= key(floor)
