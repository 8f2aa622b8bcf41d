"""The BPO envs in TRL's ``GRPOTrainer`` environment mode (``environment_factory``).

TRL (>= 1.8) runs a multi-turn agent episode as tool calls: it makes one environment instance
per rollout with ``factory()``, calls ``reset(**row)`` with the dataset row and appends the
returned string to the row's last prompt message, exposes every public method of the env class
as a tool, runs the model until it answers without a tool call, and scores the rollout with the
env's ``get_reward()``. :func:`environment_factory` gives such a class for any ``BPO-*`` id:

* ``reset(task_id=..., **row)`` resets the Gymnasium env to the row's task
  (``options={"task_id": ...}``; a ``seed`` column picks one when there is no ``task_id``; a
  ``state`` column of :func:`portable_state` bytes resumes a saved mid-episode state instead);
  it returns the first user message in this project's chat format
  (:func:`bpo_envs.prompting.build_messages`: task, recent steps, current observation,
  admissible actions);
* ``act(action)`` is the one tool: each call is one ``env.step(action)``, its result (a ``tool``
  message in TRL's conversation) the next observation and admissible actions in the same
  format; calls after the episode ended do not step the env;
* ``get_reward()`` is the env's return: the sum of the rewards of the steps since ``reset``.

:func:`make_dataset` builds the training rows (``prompt`` + ``task_id``, and ``environment``
when several envs share one run: pass :func:`environment_factories` to the trainer then).
:func:`snapshot` / :func:`restore` save and restore an instance's episode (env state and the
adapter's bookkeeping), :func:`portable_state` gives them as bytes for a dataset column;
docs/other-trainers.md shows both.

What TRL cannot express: GRPO's advantage is one number per rollout, shared by every token of
every turn, so per-step advantages (BPO, docs/unbiasedness.md, rule 4) and branched rollouts
(several continuations of one snapshot in the same group) have no place in its loss.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym

import bpo_envs
from bpo_envs.capabilities import require_declared
from bpo_envs.core import SnapshotError, check_step_limit, decode_portable
from bpo_envs.integrations import require, require_summary_layout
from bpo_envs.portable import dumps
from bpo_envs.prompting import (
    Context,
    PromptConfig,
    build_messages,
    context_data,
    context_from_data,
)

require("trl", "trl", "trl", minimum="1.8", below="2")

TOOL_SYSTEM_PROMPT = (
    "You are an agent acting in a text environment. Read the task and the current observation, "
    "then choose the next action. Act by calling the act tool with exactly one action per turn; "
    "the tool answers with the next observation. When the episode is over, stop calling tools."
)
TOOL_INSTRUCTION = "Call the act tool with your next action."

_STATE_FORMAT = "bpo-trl-episode-v1"


@dataclass
class Episode:
    """What one instance saw since its last ``reset`` (read by tests, callbacks and reward functions).

    Attributes:
        task_id: the env's task id.
        context: the current decision point (observation, admissible actions, history).
        rewards: the reward of every ``act`` call that stepped the env.
        done: the env terminated or truncated.
        won: the env's ``info["won"]`` after the last step.
        invalid_actions: steps the env answered with ``invalid_action``.
        calls_after_end: ``act`` calls after the episode ended (not sent to the env).
        resumed: the episode started from a saved state, not from ``env.reset``.
    """

    task_id: Any
    context: Context
    rewards: list[float] = field(default_factory=list)
    done: bool = False
    won: bool = False
    invalid_actions: int = 0
    calls_after_end: int = 0
    resumed: bool = False

    @property
    def actions(self) -> list[str]:
        return [turn.action for turn in self.context.history]


class BPOToolEnv:
    """One ``BPO-*`` env as a TRL environment; subclasses made by :func:`environment_factory`
    fix the id, its kwargs and the prompt format.

    Only ``reset``, ``act`` and ``get_reward`` are public functions: TRL turns every other
    public method into a tool, so the rest is properties and module functions.
    """

    env_id: ClassVar[str] = ""
    env_kwargs: ClassVar[dict[str, Any]] = {}
    prompt_config: ClassVar[PromptConfig] = PromptConfig(system_prompt=TOOL_SYSTEM_PROMPT)

    def __init__(self) -> None:
        if not self.env_id:
            raise TypeError("make the env class with environment_factory(env_id, ...), not BPOToolEnv()")
        self._env = gym.make(self.env_id, **self.env_kwargs)
        check_step_limit(self._env)
        self._episode: Episode | None = None

    @property
    def env(self) -> gym.Env:
        """The Gymnasium env (``bpo_envs.snapshot(tool_env.env)`` works on it)."""
        return self._env

    @property
    def episode(self) -> Episode | None:
        """The current episode's record; None before the first ``reset`` (TRL < 1.9 reads every
        property of a fresh instance, so this one must not raise)."""
        return self._episode

    def _current(self) -> Episode:
        if self._episode is None:
            raise RuntimeError("no episode yet: TRL calls reset(**row) before the first turn")
        return self._episode

    def reset(self, task_id: Any = None, seed: int | None = None, state: bytes | None = None, **row: Any) -> str:
        """Start the row's episode; returns the first user message (appended by TRL to the prompt).

        ``state`` (bytes from :func:`portable_state`) resumes that saved episode instead.
        Other row columns (``prompt``, ...) are ignored.
        """
        if state is not None:
            _restore_portable(self, state)
            return self._message(self._current().context, first=True)
        if task_id is None and seed is None:
            raise ValueError(
                f"the dataset row for {self.env_id} has neither a task_id nor a seed column "
                f"(columns: {sorted(row)}); make_dataset() builds rows with task_id"
            )
        options = {"task_id": task_id} if task_id is not None else None
        obs, info = self._env.reset(seed=seed, options=options)
        admissible = info.get("admissible_actions")
        context = Context(
            info["task_id"], obs, tuple(admissible) if admissible is not None else None, (), obs
        )
        self._episode = Episode(task_id=info["task_id"], context=context)
        return self._message(context, first=True)

    def act(self, action: str) -> str:
        """Take one action in the environment.

        Args:
            action: The action to take, for example one of the admissible actions.

        Returns:
            The environment's next observation.
        """
        episode = self._current()
        if episode.done:
            episode.calls_after_end += 1
            return "The episode is over; do not call act again."
        action = action if isinstance(action, str) else str(action)
        obs, reward, terminated, truncated, info = self._env.step(action)
        episode.rewards.append(float(reward))
        episode.invalid_actions += bool(info.get("invalid_action"))
        episode.won = bool(info.get("won", False))
        episode.done = bool(terminated or truncated)
        episode.context = episode.context.child(action, obs, info.get("admissible_actions"))
        if episode.done:
            outcome = "won" if episode.won else "not won"
            return (
                f"Current observation:\n{obs}\n\nThe episode is over ({outcome}, reward "
                f"{sum(episode.rewards):g}). Do not call act again."
            )
        return self._message(episode.context)

    def get_reward(self) -> float:
        """The env's return since ``reset``: the sum of the step rewards (0 without a step)."""
        return float(sum(self._current().rewards))

    def _message(self, context: Context, *, first: bool = False) -> str:
        """The user content of the project's chat format for ``context`` (TRL adds the system message).

        The first message shows the whole decision point (task and recent steps, for a resumed
        episode); later ones only the current observation and admissible actions, since the
        conversation already holds the history.
        """
        if not first:
            context = Context(context.task_id, context.observation, context.admissible_actions, (), context.observation)
        return build_messages(context, self.prompt_config, instruction=TOOL_INSTRUCTION)[1]["content"]


def _class_name(env_id: str) -> str:
    return re.sub(r"\W", "_", env_id.split(":")[-1])


def environment_factory(
    env_id: str, *, prompt_config: PromptConfig | None = None, **env_kwargs: Any
) -> type[BPOToolEnv]:
    """The class to pass as ``GRPOTrainer(environment_factory=...)`` for ``env_id``.

    ``env_kwargs`` go to ``gym.make(env_id, ...)`` for every instance. The class is named after
    the id (``BPO_WebShop_v0``), which is how TRL names its reward column
    (``rewards/BPO_WebShop_v0/mean``). ``prompt_config`` defaults to the project's format with a
    system prompt that asks for tool calls (:data:`TOOL_SYSTEM_PROMPT`).
    """
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"env_id must be a registered env id such as 'BPO-WebShop-v0', got {env_id!r}")
    if env_id.split(":")[-1] not in gym.registry:
        raise ValueError(f"unknown env id {env_id!r}; the BPO ids are {', '.join(bpo_envs.ENV_IDS)}")
    config = require_summary_layout(prompt_config or BPOToolEnv.prompt_config, "TRL")
    return type(
        _class_name(env_id),
        (BPOToolEnv,),
        {"env_id": env_id, "env_kwargs": dict(env_kwargs), "prompt_config": config, "__module__": __name__},
    )


def environment_factories(
    envs: Mapping[str, str | tuple[str, Mapping[str, Any]]], *, prompt_config: PromptConfig | None = None
) -> dict[str, type[BPOToolEnv]]:
    """``{name: env class}`` for a run that mixes envs (TRL's per-example ``environment`` column).

    ``envs`` maps each name to an id or to ``(id, kwargs)``.
    """
    out: dict[str, type[BPOToolEnv]] = {}
    for name, spec in envs.items():
        env_id, kwargs = (spec, {}) if isinstance(spec, str) else (spec[0], dict(spec[1]))
        out[name] = environment_factory(env_id, prompt_config=prompt_config, **kwargs)
    return out


def system_message(env_class: type[BPOToolEnv] | None = None) -> dict[str, str]:
    """The system message of the prompts (the project's, asking for tool calls)."""
    config = env_class.prompt_config if env_class is not None else BPOToolEnv.prompt_config
    return {"role": "system", "content": config.system_text}


def make_dataset(
    env_class: type[BPOToolEnv],
    task_ids: Iterable[Any] | None = None,
    *,
    repeat: int = 1,
    environment: str | None = None,
) -> Any:
    """A ``datasets.Dataset`` of rows ``{"prompt": [system, user], "task_id": ...}`` for ``env_class``.

    The user message is empty: ``reset`` returns the observation and TRL appends it.
    ``task_ids`` defaults to the env's ``task_ids()`` (its split); ``repeat`` repeats the list;
    ``environment`` adds TRL's routing column for :func:`environment_factories`.
    """
    from datasets import Dataset

    if task_ids is None:
        env = gym.make(env_class.env_id, **env_class.env_kwargs)
        try:
            listed = require_declared(env, "make_dataset without task_ids=").task_ids()
        finally:
            env.close()
        if listed is None:
            raise ValueError(f"{env_class.env_id} does not list its tasks: pass task_ids=")
        task_ids = list(listed)
    ids = list(task_ids) * repeat
    if not ids:
        raise ValueError("make_dataset needs at least one task id")
    if len({type(t) for t in ids}) > 1:
        ids = [str(t) for t in ids]
    rows: dict[str, list[Any]] = {
        "prompt": [[system_message(env_class), {"role": "user", "content": ""}] for _ in ids],
        "task_id": ids,
    }
    if environment is not None:
        rows["environment"] = [environment] * len(ids)
    return Dataset.from_dict(rows)


@dataclass
class EpisodeSnapshot:
    """An instance's saved episode: the env's snapshot and a copy of the adapter's record."""

    env_snapshot: bpo_envs.Snapshot
    episode: Episode

    def release(self) -> None:
        self.env_snapshot.release()


def snapshot(tool_env: BPOToolEnv) -> EpisodeSnapshot:
    """Save ``tool_env``'s episode (docs/snapshots.md: the env's full state, plus the history
    and rewards the adapter keeps for prompts and ``get_reward``)."""
    return EpisodeSnapshot(bpo_envs.snapshot(tool_env.env), copy.deepcopy(tool_env._current()))


def restore(tool_env: BPOToolEnv, snap: EpisodeSnapshot) -> None:
    """Return ``tool_env`` to ``snap`` (any instance of the same env class)."""
    if not isinstance(snap, EpisodeSnapshot):
        raise TypeError(f"restore() takes an EpisodeSnapshot from snapshot(), not {type(snap).__name__}")
    bpo_envs.restore(tool_env.env, snap.env_snapshot)
    tool_env._episode = copy.deepcopy(snap.episode)


def portable_state(tool_env: BPOToolEnv, *, keep_rewards: bool = False) -> bytes:
    """``tool_env``'s episode as bytes for a dataset's ``state`` column (``reset(state=...)``).

    The resumed episode's prompt shows the task and the recent steps, as this project's
    policies see a mid-episode decision point. ``get_reward`` counts only the rewards after the
    resume unless ``keep_rewards``. The bytes are plain data (:mod:`bpo_envs.portable`):
    resuming from them never runs code (docs/snapshots.md#trust).
    """
    episode = tool_env._current()
    payload = {
        "env_id": type(tool_env).env_id,
        "env": bpo_envs.snapshot(tool_env.env).portable(),
        "episode": {
            "task_id": episode.task_id,
            "context": context_data(episode.context),
            "rewards": [float(r) for r in episode.rewards] if keep_rewards else [],
            "done": episode.done,
            "won": episode.won,
            "invalid_actions": episode.invalid_actions,
            "calls_after_end": episode.calls_after_end,
        },
    }
    return dumps(_STATE_FORMAT, payload)


def _restore_portable(tool_env: BPOToolEnv, state: bytes) -> None:
    try:
        payload = decode_portable(state, format=_STATE_FORMAT, what="portable_state() bytes",
                                  fields={"env_id": str, "env": bytes, "episode": dict})
    except SnapshotError as exc:
        raise ValueError(f"the row's state column: {exc}") from exc
    if payload["env_id"] != type(tool_env).env_id:
        raise ValueError(f"a state of {payload['env_id']} cannot resume a {type(tool_env).env_id} env")
    saved = payload["episode"]
    rewards, counts = saved.get("rewards"), (saved.get("invalid_actions"), saved.get("calls_after_end"))
    if not (isinstance(rewards, list) and all(isinstance(r, float) for r in rewards)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in counts)
            and isinstance(saved.get("done"), bool) and isinstance(saved.get("won"), bool)):
        raise ValueError("the row's state column: the episode's rewards, flags or counts have the wrong types")
    context = context_from_data(saved.get("context"))
    bpo_envs.restore(tool_env.env, payload["env"])
    tool_env._episode = Episode(saved.get("task_id"), context, rewards, saved["done"], saved["won"], counts[0], counts[1],
                                resumed=True)


def episodes(environments: Sequence[BPOToolEnv] | None) -> list[Episode]:
    """The episodes of ``GRPOTrainer.environments`` (the current batch's instances)."""
    return [e._current() for e in environments or ()]
