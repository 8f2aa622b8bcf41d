"""The chat format of this project's LLM policies: decision points, prompts and action parsing.

A :class:`Context` is one decision point (the history ``h``). :func:`build_messages` renders it
as a system + user chat showing the model:

* the task: the reset observation (omitted when it is the current observation);
* the last ``history`` (observation, action) turns of the path (default 2), older ones elided;
* the current observation;
* the admissible actions, when the env gives them.

With ``PromptConfig(layout="turns")`` the same decision point is instead a chat of turns, each
step's observation a user message and each action an assistant message, written so that the
next step's prompt *extends* this one (see :func:`build_messages`): a policy that keeps
prompts' key-value caches (``HFPolicy(prefix_store_tokens=...)``) then prefills only the new turn.

The model answers with one action between configurable tags, ``<action>...</action>`` by
default; with ``PromptConfig(reasoning=True)`` it first reasons between ``<think>...</think>``
and then states the action (verl-agent's reply format). :func:`parse_action` extracts it; output that does not parse is sent to the env as the
raw text (:func:`env_action`), so the env answers with an invalid-action observation (bad model
output is an observation, never an exception).

This lives in ``bpo_envs`` so that the trainer integrations (``bpo_envs.integrations``) show
exactly the prompts ``bpo_algos``' policies see; ``bpo_algos.policy.prompt_builder`` tokenizes it.
Nothing here imports ``transformers`` or ``torch``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Turn:
    """One past (observation, action) pair of a path."""

    observation: str
    action: str


@dataclass(frozen=True)
class Context:
    """One decision point: what the agent knows before acting.

    Attributes:
        task_id: the env's task id.
        observation: the current observation.
        admissible_actions: the env's admissible actions here, or None when it has none.
        history: the (observation, action) pairs before this one on this path, oldest first.
        initial_observation: the reset observation (it carries the task for most envs).
    """

    task_id: Any
    observation: str
    admissible_actions: tuple[str, ...] | None
    history: tuple[Turn, ...] = ()
    initial_observation: str = ""

    def child(self, action: str, observation: str, admissible: Sequence[str] | None) -> Context:
        """The context after taking ``action`` here and seeing ``observation``."""
        return Context(
            task_id=self.task_id,
            observation=observation,
            admissible_actions=tuple(admissible) if admissible is not None else None,
            history=(*self.history, Turn(self.observation, action)),
            initial_observation=self.initial_observation,
        )


def context_data(context: Context) -> dict[str, Any]:
    """``context`` as plain data (for :mod:`bpo_envs.portable` bytes)."""
    return {
        "task_id": context.task_id,
        "observation": context.observation,
        "admissible_actions": context.admissible_actions,
        "history": tuple((t.observation, t.action) for t in context.history),
        "initial_observation": context.initial_observation,
    }


def context_from_data(obj: Any) -> Context:
    """The :class:`Context` that :func:`context_data` made ``obj`` from, its fields checked
    (``ValueError`` on anything else)."""
    if not isinstance(obj, dict):
        raise ValueError("a saved decision point is not a dict")
    admissible, history = obj.get("admissible_actions"), obj.get("history")
    texts = (obj.get("observation"), obj.get("initial_observation"))
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("a saved decision point's observations are not text")
    if admissible is not None and not (isinstance(admissible, tuple) and all(isinstance(a, str) for a in admissible)):
        raise ValueError("a saved decision point's admissible actions are not text")
    if not (isinstance(history, tuple) and all(
        isinstance(t, tuple) and len(t) == 2 and all(isinstance(x, str) for x in t) for t in history
    )):
        raise ValueError("a saved decision point's history is not (observation, action) text pairs")
    return Context(obj.get("task_id"), texts[0], admissible, tuple(Turn(o, a) for o, a in history), texts[1])


DEFAULT_SYSTEM_PROMPT = (
    "You are an agent acting in a text environment. Read the task and the current observation, "
    "then choose the next action. Answer with exactly one action in the form {open}ACTION{close}."
)

REASONING_SYSTEM_PROMPT = (
    "You are an agent acting in a text environment. Read the task and the current observation. "
    "First reason step by step about the situation and which action best advances the task; this "
    "reasoning MUST be enclosed in {think_open} {think_close} tags. Then state exactly one action "
    "in the form {open}ACTION{close}."
)
"""The system prompt of a reasoning reply (``PromptConfig(reasoning=True)``; after verl-agent's
WebShop/ALFWorld prompts: reasoning in think tags, then the action in action tags)."""


LAYOUTS = ("summary", "turns")
"""How :func:`build_messages` lays a decision point out (``PromptConfig.layout``)."""


@dataclass(frozen=True)
class PromptConfig:
    """How contexts become prompts and completions become actions.

    Attributes:
        history: how many past (observation, action) turns to show (0 = none).
        action_open / action_close: the tags around the action in the model's answer.
        system_prompt: the system message; ``{open}``/``{close}`` are filled with the tags.
        show_admissible: list the admissible actions when the env gives them.
        max_observation_chars: observations longer than this (in history and the current one)
            keep their head and tail around a marker; None = never cut.
        reasoning: the reply is reasoning between ``think_open``/``think_close``, then the
            action between the action tags; the action is read after the last closing think
            tag, and a reply with reasoning but no action there parses to None (the env answers
            "invalid action"). The system prompt default becomes :data:`REASONING_SYSTEM_PROMPT`.
        think_open / think_close: the reasoning tags.
        layout: ``"summary"`` (one user message: task, recent steps, current observation) or
            ``"turns"`` (a user message a step and an assistant message an action, each step's
            prompt extending the one before; the window of past turns moves ``history`` turns
            at a time). See :func:`build_messages`.
    """

    history: int = 2
    action_open: str = "<action>"
    action_close: str = "</action>"
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    show_admissible: bool = True
    max_observation_chars: int | None = 8000
    reasoning: bool = False
    think_open: str = "<think>"
    think_close: str = "</think>"
    layout: str = "summary"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if isinstance(self.history, bool) or not isinstance(self.history, int) or self.history < 0:
            raise ValueError(f"history must be an int >= 0, got {self.history!r}")
        if not self.action_open or not self.action_close:
            raise ValueError("action_open and action_close must be non-empty tags")
        if self.max_observation_chars is not None and self.max_observation_chars < 64:
            raise ValueError(f"max_observation_chars must be >= 64 or None, got {self.max_observation_chars}")
        if self.reasoning and (not self.think_open or not self.think_close):
            raise ValueError("reasoning=True needs non-empty think_open and think_close tags")

    @property
    def system_text(self) -> str:
        """The system message with the tags filled in."""
        template = self.system_prompt
        if self.reasoning and template == DEFAULT_SYSTEM_PROMPT:
            template = REASONING_SYSTEM_PROMPT
        return template.format(open=self.action_open, close=self.action_close, think_open=self.think_open, think_close=self.think_close)


def _cut(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters cut ...]\n"
    keep = max(limit - len(marker), 0)
    return text[: keep // 2] + marker + text[len(text) - (keep - keep // 2) :]


def format_action(action: str, config: PromptConfig = PromptConfig()) -> str:
    """The answer text that states ``action`` (what SFT teaches and entropy scoring scores)."""
    return f"{config.action_open}{action}{config.action_close}"


def parse_action(text: str, config: PromptConfig = PromptConfig()) -> str | None:
    """The action in the model's answer ``text`` (the last complete tag pair), or None.

    Surrounding whitespace is stripped; an empty action counts as no action. With
    ``config.reasoning`` only the text after the last closing think tag is read (an action
    written inside the reasoning is not the answer), so reasoning without an action is None.
    """
    if config.reasoning and config.think_close in text:
        text = text.rsplit(config.think_close, 1)[1]
    pattern = re.escape(config.action_open) + r"(.*?)" + re.escape(config.action_close)
    matches = re.findall(pattern, text, flags=re.DOTALL)
    if not matches:
        return None
    action = matches[-1].strip()
    return action or None


def env_action(text: str, config: PromptConfig = PromptConfig()) -> str:
    """What to send to ``env.step``: the parsed action, else the raw text (the env rejects it)."""
    parsed = parse_action(text, config)
    return text if parsed is None else parsed


def build_messages(
    context: Context, config: PromptConfig = PromptConfig(), *, instruction: str | None = None
) -> list[dict[str, str]]:
    """The chat for one decision point: system + one user message (``config.layout ==
    "summary"``), or system + alternating user and assistant turns (``"turns"``,
    :func:`_turn_messages`).

    ``instruction`` replaces the closing line (default: answer with the action between the
    tags); the trainer integrations use it where the answer is a tool call instead.
    """
    if instruction is None:
        instruction = f"Answer with your next action as {format_action('ACTION', config)}."
        if config.reasoning:
            instruction = (
                f"First reason step by step within {config.think_open} {config.think_close}, then answer "
                f"with your next action as {format_action('ACTION', config)}."
            )
    if config.layout == "turns":
        return _turn_messages(context, config, instruction)
    limit = config.max_observation_chars
    parts: list[str] = []
    history = context.history[-config.history :] if config.history else ()
    has_task = bool(context.initial_observation) and (
        context.history or context.initial_observation != context.observation
    )
    if has_task:
        parts.append("Task:\n" + _cut(context.initial_observation, limit))
    if history:
        skipped = len(context.history) - len(history)
        header = f"Recent steps ({skipped} earlier step{'s' if skipped != 1 else ''} not shown):" if skipped else "Recent steps:"
        lines = [header]
        for i, turn in enumerate(history, start=skipped + 1):
            shown = (
                "(the task above)"
                if has_task and turn.observation == context.initial_observation and i == 1
                else _cut(turn.observation, limit)
            )
            lines.append(f"Step {i} observation:\n{shown}")
            lines.append(f"Step {i} action: {turn.action}")
        parts.append("\n".join(lines))
    parts.append("Current observation:\n" + _cut(context.observation, limit))
    if config.show_admissible and context.admissible_actions:
        parts.append("Admissible actions:\n" + "\n".join(f"- {a}" for a in context.admissible_actions))
    parts.append(instruction)
    system = config.system_text
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def window_start(steps: int, history: int) -> int:
    """The first past step the ``"turns"`` layout shows, of ``steps`` past ones: the largest
    multiple of ``history`` that leaves at least ``history`` shown (0 while ``steps <= history``).
    It moves ``history`` steps at a time, so between moves each prompt extends the one before;
    between ``history`` and ``2 * history - 1`` past steps are shown."""
    if history <= 0:
        return steps
    return max(0, steps - history) // history * history


def _turn_messages(context: Context, config: PromptConfig, instruction: str) -> list[dict[str, str]]:
    """The ``"turns"`` layout: system; a user message for each shown step, "Step i
    observation:" (the first one led by the task, and by how many earlier steps are not shown);
    after each past step an assistant message with its action (as the model states one); the
    current step's user message ends with the admissible actions and ``instruction``.

    Everything before the current step's admissible actions is exactly what the previous step's
    prompt showed, as long as the window (:func:`window_start`) did not move: the next step
    appends its action and observation. A past step's reply shows its action only (a reasoning
    reply's reasoning is not kept)."""
    limit = config.max_observation_chars
    start = window_start(len(context.history), config.history)
    shown = [*context.history[start:], Turn(context.observation, "")]

    def observation(step: int, text: str) -> str:
        same = step == 1 and context.initial_observation and text == context.initial_observation
        return f"Step {step} observation:\n" + ("(the task above)" if same else _cut(text, limit))

    lead: list[str] = []
    if context.initial_observation:
        lead.append("Task:\n" + _cut(context.initial_observation, limit))
    if start:
        lead.append(f"({start} earlier step{'s' if start != 1 else ''} not shown.)")
    current = start + len(shown)
    messages = [{"role": "system", "content": config.system_text}]
    for step, turn in enumerate(shown, start=start + 1):
        parts = [*(lead if step == start + 1 else ()), observation(step, turn.observation)]
        if step < current:
            messages.append({"role": "user", "content": "\n\n".join(parts)})
            messages.append({"role": "assistant", "content": format_action(turn.action, config)})
            continue
        if config.show_admissible and context.admissible_actions:
            parts.append("Admissible actions:\n" + "\n".join(f"- {a}" for a in context.admissible_actions))
        messages.append({"role": "user", "content": "\n\n".join([*parts, instruction])})
    return messages


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]]) -> str:
    """The prompt text with the generation prompt: the tokenizer's chat template, else plain."""
    if getattr(tokenizer, "chat_template", None):  # third-party: a transformers tokenizer (older ones lack it)
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    text = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages)
    return text + "Assistant: "
