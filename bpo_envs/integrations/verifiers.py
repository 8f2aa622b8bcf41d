"""The BPO envs in verifiers (0.4, ``verifiers.v1``) through a ``bpo-serve`` server (docs/other-trainers.md).

verifiers' own OpenEnv taskset (``verifiers.v1.tasksets.openenv``) plays any OpenEnv server: the
model's reply becomes the action ``{"text": reply}`` (the action schema from ``/schema`` has one
required field), the next observation comes back as the user turn, and the served env's rewards
are summed into the trace's ``openenv_reward``. So no adapter class is needed; this module only
builds the configuration that points that taskset at a server:

* :func:`env_config`: the ``EnvConfig`` (as a dict) of one served env: one task per ``reset``
  argument set (``{"task_id": ...}`` or ``{"seed": ...}``), the player with verifiers' plain chat
  harness (``null``) in a local subprocess runtime and a turn cap;
* :func:`load_environment`: ``verifiers.v1.load_environment`` of that config (the ``Env`` that
  ``vf-eval`` and prime-rl run);
* :func:`eval_config`: the whole ``vf-eval`` configuration (model endpoint included), for
  ``vf-eval @ file.toml`` (:func:`eval_toml`).

verifiers must live in its own venv (its pins of ``mcp`` and ``openai`` clash with openenv-core
0.3, which the server needs), with ``verifiers[openenv]`` and ``uv`` (each rollout's chat harness
runs as a PEP 723 script that ``uv`` prepares from PyPI once):
``BPO_INSTALL_VERIFIERS=1 bpo-gym-setup verifiers`` makes it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

DEFAULT_MAX_TURNS = 8


def env_config(
    base_url: str,
    resets: Sequence[dict[str, Any]] = ({"seed": 0},),
    max_turns: int = DEFAULT_MAX_TURNS,
) -> dict[str, Any]:
    """The verifiers ``EnvConfig`` of the env served at ``base_url`` (one task per reset)."""
    if not resets:
        raise ValueError("resets: at least one set of reset arguments (one task each)")
    return {
        "taskset": {"id": "openenv", "base_url": base_url.rstrip("/"), "resets": [dict(r) for r in resets]},
        "player": {"max_turns": int(max_turns), "harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
    }


def load_environment(
    base_url: str,
    resets: Sequence[dict[str, Any]] = ({"seed": 0},),
    max_turns: int = DEFAULT_MAX_TURNS,
) -> Any:
    """``verifiers.v1.load_environment`` of :func:`env_config` (needs verifiers >= 0.4)."""
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ImportError(
            "bpo_envs.integrations.verifiers needs verifiers 0.4 (verifiers.v1), in its own venv: "
            "BPO_INSTALL_VERIFIERS=1 bpo-gym-setup verifiers"
        ) from exc
    from verifiers.v1.tasksets.openenv import OpenEnvEnvConfig

    return vf.load_environment(OpenEnvEnvConfig.model_validate(env_config(base_url, resets, max_turns)))


def eval_config(
    base_url: str,
    model: str,
    model_base_url: str,
    resets: Sequence[dict[str, Any]] = ({"seed": 0},),
    max_turns: int = DEFAULT_MAX_TURNS,
    api_key_var: str = "OPENAI_API_KEY",
    max_tokens: int = 64,
    output_dir: str = "outputs",
    rollouts: int = 1,
) -> dict[str, Any]:
    """A ``vf-eval`` configuration: the served env, the model at an OpenAI-compatible endpoint,
    no upload (``push = false``)."""
    return {
        "model": model,
        "num_rollouts": int(rollouts),
        "push": False,
        "output_dir": output_dir,
        "client": {"base_url": model_base_url, "api_key_var": api_key_var},
        "sampling": {"max_tokens": int(max_tokens)},
        "env": env_config(base_url, resets, max_turns),
    }


def eval_toml(config: dict[str, Any]) -> str:
    """:func:`eval_config`'s dict as TOML (``vf-eval @ file.toml``): tables of scalars, lists
    of scalars and inline tables, which JSON's literals write exactly."""

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list | tuple):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v)

    lines: list[str] = []

    def table(name: str, body: dict[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not (isinstance(v, dict) and k != "resets")}
        if name:
            lines.append(f"\n[{name}]")
        lines.extend(f"{k} = {value(v)}" for k, v in scalars.items())
        for k, v in body.items():
            if isinstance(v, dict):
                table(f"{name}.{k}" if name else k, v)

    table("", config)
    return "\n".join(lines).lstrip() + "\n"


__all__ = ["DEFAULT_MAX_TURNS", "env_config", "eval_config", "eval_toml", "load_environment"]
