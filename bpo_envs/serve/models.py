"""The served env's action, observation and state as openenv-core's pydantic types.

They describe the wire format of :mod:`.protocol` (``/schema`` answers their JSON schemas) and
a client can validate what it receives with them. The server builds its messages as plain dicts
on the hot path; the tests check that they validate here.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class TextAction(Action):
    """One env step: the action text, exactly what ``env.step`` takes."""

    text: str = Field(description="the action, e.g. 'search[red shoes]'")


class TextObservation(Observation):
    """What a served env returns after ``reset`` and ``step`` (plus OpenEnv's reward/done)."""

    text: str = Field(description="the observation text")
    admissible_actions: list[str] | None = Field(default=None, description="where the env knows them")
    task_id: Any = Field(default=None, description="the episode's task")
    won: bool = Field(default=False, description="the task is solved")
    invalid_action: bool = Field(default=False, description="the last action could not run")
    truncated: bool = Field(default=False, description="done because of the step limit")
    info: dict[str, Any] = Field(default_factory=dict, description="the rest of the env's info")


class ServedState(State):
    """``state``: OpenEnv's episode id and step count, and a snapshot id of the current state."""

    snapshot_id: str | None = Field(default=None, description="restore with reset(snapshot_id=...)")
    task_id: Any = None
    done: bool = False


def schemas() -> dict[str, Any]:
    """OpenEnv's ``/schema`` answer: JSON schemas of the action, observation and state."""
    return {
        "action": TextAction.model_json_schema(),
        "observation": TextObservation.model_json_schema(),
        "state": ServedState.model_json_schema(),
    }
