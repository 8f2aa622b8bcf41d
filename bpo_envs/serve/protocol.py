"""The wire format of a served env: OpenEnv's WebSocket messages with this project's fields.

Client -> server (OpenEnv's ``WSResetMessage`` / ``WSStepMessage`` / ``WSStateMessage`` /
``WSCloseMessage``), one JSON object per text frame::

    {"type": "reset", "data": {"task_id": ..., "seed": 3}}      # or {"snapshot_id": "..."}
    {"type": "step",  "data": {"text": "click[buy now]"}}
    {"type": "state"}
    {"type": "close"}
    {"type": "release", "data": {"snapshot_ids": ["..."]}}     # this project's: no reply

Server -> client: ``{"type": "observation", "data": {"observation": {...}, "reward": r, "done":
d}}`` (what OpenEnv's ``serialize_observation`` sends), ``{"type": "state", "data": {...}}``, or
``{"type": "error", "data": {"message": ..., "code": ...}}`` with OpenEnv's ``WSErrorCode``
values. The observation's fields are :class:`~bpo_envs.serve.models.TextObservation`'s; ``info`` carries the rest of
the env's ``info`` dict as JSON (docs/serving.md).
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Any

try:  # orjson is several times faster on the hot path; plain json gives the same objects
    import orjson
except ImportError:  # pragma: no cover - openenv-core depends on orjson through fastmcp
    orjson = None

RESET_ARGS = ("task_id", "seed", "snapshot_id", "episode_id")
"""The keys ``reset``'s ``data`` may carry (``episode_id`` is OpenEnv's, echoed by ``state``)."""

PROMOTED_INFO_KEYS = ("task_id", "won", "admissible_actions", "invalid_action")

MAX_ID_CHARS = 256
"""Longest ``episode_id`` and ``snapshot_id`` (characters); a longer one is refused."""
MAX_TASK_ID_BYTES = 1024
"""Longest ``task_id``, as JSON text; a longer one is refused (every env's ids are far shorter)."""
MAX_SEED = 2**64 - 1
"""Largest ``seed`` (numpy's seeds are unsigned 64-bit words)."""
MAX_ECHO_CHARS = 80
"""How much of a refused value an error message quotes."""
MAX_ERROR_CHARS = 8192
"""Longest error message sent (an env's exception text is cut there)."""


class WSErrorCode(StrEnum):
    """OpenEnv's error codes (``openenv.core.env_server.types.WSErrorCode``; the same values,
    kept here so that a client does not import openenv-core, which takes seconds)."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"


def dumps(message: dict[str, Any]) -> str:
    """JSON text of a message (orjson where it can; it refuses lone surrogates, json does not)."""
    if orjson is not None:
        try:
            return orjson.dumps(message).decode()
        except TypeError:
            pass
    return json.dumps(message)


def loads(text: str | bytes) -> Any:
    """Parse one message; raises ``ValueError`` on anything that is not JSON (including nesting
    too deep to parse and integers too long to read)."""
    if orjson is not None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass  # e.g. a lone surrogate escape, which json accepts
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None


def shown(value: Any) -> str:
    """``repr(value)`` cut to :data:`MAX_ECHO_CHARS` characters, for quoting client input in an
    error message (a refused 1 MB field is not sent back)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= MAX_ECHO_CHARS else f"{text[:MAX_ECHO_CHARS]}... ({len(text):,} characters)"


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON types: tuples and sets to lists, numpy scalars to numbers,
    non-string keys to strings, non-finite floats to strings, anything else to ``str``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((json_safe(v) for v in value), key=repr)
    item = getattr(value, "item", None)  # third-party: a numpy (or torch) scalar, not imported here
    if callable(item) and getattr(value, "shape", None) == ():  # third-party: 0-d only, as above
        return json_safe(item())
    return str(value)


def observation_data(
    obs: str, reward: float | None, terminated: bool, truncated: bool, info: dict[str, Any]
) -> dict[str, Any]:
    """The ``data`` of an observation message for one ``reset``/``step`` result.

    ``info`` minus the promoted keys goes to ``observation["info"]``; ``invalid_action`` stays
    there unless it is True, so :func:`info_from_observation` rebuilds ``info`` exactly.
    """
    rest = {k: v for k, v in info.items() if k not in PROMOTED_INFO_KEYS}
    invalid = info.get("invalid_action")
    if "invalid_action" in info and invalid is not True:
        rest["invalid_action"] = invalid
    admissible = info.get("admissible_actions")
    return {
        "observation": {
            "text": obs,
            "admissible_actions": None if admissible is None else [str(a) for a in admissible],
            "task_id": json_safe(info.get("task_id")),
            "won": bool(info.get("won", False)),
            "invalid_action": invalid is True,
            "truncated": bool(truncated),
            "info": json_safe(rest),
        },
        "reward": None if reward is None else float(reward),
        "done": bool(terminated or truncated),
    }


def info_from_observation(observation: dict[str, Any]) -> dict[str, Any]:
    """The env's ``info`` dict back from a served observation (the inverse of
    :func:`observation_data`, up to JSON types)."""
    info = dict(observation.get("info") or {})
    info["task_id"] = observation.get("task_id")
    info["won"] = bool(observation.get("won", False))
    if observation.get("admissible_actions") is not None:
        info["admissible_actions"] = list(observation["admissible_actions"])
    if observation.get("invalid_action"):
        info["invalid_action"] = True
    return info


def error(code: WSErrorCode | str, message: str, **extra: Any) -> dict[str, Any]:
    """An OpenEnv error message (``WSErrorResponse``), the message cut to :data:`MAX_ERROR_CHARS`."""
    if len(message) > MAX_ERROR_CHARS:
        message = message[: MAX_ERROR_CHARS - 20] + " ... (cut)"
    return {"type": "error", "data": {"message": message, "code": str(code), **extra}}


__all__ = [
    "MAX_ECHO_CHARS", "MAX_ERROR_CHARS", "MAX_ID_CHARS", "MAX_SEED", "MAX_TASK_ID_BYTES", "RESET_ARGS", "WSErrorCode",
    "dumps", "error", "info_from_observation", "json_safe", "loads", "observation_data", "shown",
]  # fmt: skip
