"""The ``Policy`` protocol: what the rollout engine and the losses need from a policy.

A *context* is one decision point (history ``h``) as the engine sees it; an :class:`Action` is
one sample from the policy there, with the token ids and per-token log-probabilities of the
sampled text. Every policy (tabular, transformers, vLLM) implements the same three methods:

* ``sample(contexts, n)`` — ``n`` i.i.d. samples per context (never deduplicated); a policy
  may take ``rngs=`` (one ``numpy.random.Generator`` per context, the engine's per-path
  streams) and draw each context's samples from its own, so a tree does not depend on what
  else was in the batch (:mod:`bpo_algos.rollout`);
* ``decision_entropy(contexts)`` — the entropy of the policy's distribution at each context,
  computed without sampling (docs/unbiasedness.md, rule 1: exact over the admissible actions, or of the
  first action token);
* ``token_logprobs(steps)`` — differentiable per-token log-probs of recorded actions, a
  ``[n_steps, max_action_tokens]`` tensor padded with zeros past each action's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from bpo_algos.compute import ComputeMeter
from bpo_envs.prompting import Context, Turn  # noqa: F401  (re-exported: the decision point lives with the chat format)


def admissible_of(info: dict[str, Any]) -> tuple[str, ...] | None:
    """The env's admissible actions from a step's ``info`` (None where the env gives none)."""
    actions = info.get("admissible_actions")
    return tuple(actions) if actions is not None else None


def as_context(value: Any) -> Context:
    """A :class:`Context` from a Context, an ``(observation, admissible_actions)`` pair or a
    dict with those keys (handy in notebooks and tests)."""
    if isinstance(value, Context):
        return value
    if isinstance(value, dict):
        admissible = value.get("admissible_actions")
        return Context(
            task_id=value.get("task_id"),
            observation=value["observation"],
            admissible_actions=tuple(admissible) if admissible is not None else None,
            initial_observation=value.get("initial_observation", value["observation"]),
        )
    if isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], str):
        admissible = value[1]
        return Context(None, value[0], tuple(admissible) if admissible is not None else None, (), value[0])
    raise TypeError(f"cannot make a Context from {type(value).__name__}")


def as_steps(batch_or_steps: Any) -> Sequence[StepLike]:
    """The recorded steps of a :class:`~bpo_algos.algorithm.Batch`, or the sequence itself."""
    steps = getattr(batch_or_steps, "steps", batch_or_steps)
    return steps


@dataclass(frozen=True)
class Action:
    """One sampled action.

    Attributes:
        text: what the policy generated (the raw completion for an LLM).
        token_ids: ids of the generated tokens (a tabular action is one token: its index).
        logprobs: per-token log-probabilities under the sampling policy ("old" log-probs).
        env_action: the string sent to ``env.step``; defaults to ``text``. An LLM policy whose
            output does not parse sends the raw text, and the env answers with an invalid
            action observation (bad model output is an observation, never a crash).
        prompt_token_ids: the prompt the action was generated from.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    env_action: str | None = None
    prompt_token_ids: tuple[int, ...] = field(default=(), repr=False)

    @property
    def command(self) -> str:
        return self.text if self.env_action is None else self.env_action

    @property
    def logprob(self) -> float:
        """Log-probability of the whole action (sum over tokens)."""
        return float(sum(self.logprobs))


class StepLike(Protocol):
    """What ``token_logprobs`` reads of a recorded step (a tree edge satisfies it)."""

    context: Context
    action: Action


@runtime_checkable
class Policy(Protocol):
    """The binding policy interface (docs/unbiasedness.md states the rules it serves)."""

    meter: ComputeMeter

    def sample(self, contexts: Sequence[Context], n: int) -> list[list[Action]]: ...

    def decision_entropy(self, contexts: Sequence[Context]) -> list[float]: ...

    def token_logprobs(self, steps: Sequence[StepLike]) -> torch.Tensor: ...


class PolicyBase:
    """Shared plumbing: the usage meter, seeding and optional reference log-probs.

    Subclasses count ``policy_calls``, ``gen_tokens`` and ``prefill_tokens`` (generation) and
    ``score_tokens`` (decision-entropy passes: the prompt and every candidate scored) in
    ``self.meter``; the engine reads the difference around each call and charges it to the
    trees the call served.
    """

    def __init__(self) -> None:
        self.meter = ComputeMeter()

    def seed(self, seed: int) -> None:
        """Seed the policy's sampling randomness."""
        raise NotImplementedError

    def reference_token_logprobs(self, steps: Sequence[StepLike]) -> torch.Tensor:
        """Per-token log-probs under the reference policy (for the k3 KL), no gradient."""
        raise NotImplementedError(f"{type(self).__name__} has no reference policy")

    def _prepare_reference_load(self, state_dict: Any) -> None:
        """Make the frozen reference before loading a checkpoint that holds one.

        A reference copy is a submodule, so a checkpoint saved after it was made holds its
        weights under ``_reference.``; a fresh policy has none yet and would refuse those keys.
        Making it first lets loading restore it, so the KL keeps its original anchor.
        """
        if getattr(self, "_reference", None) is None and any(k.startswith("_reference.") for k in state_dict):
            self.set_reference()  # type: ignore[attr-defined]

    def rng_state(self) -> Any:
        """The sampling RNG state, for checkpoints."""
        raise NotImplementedError

    def set_rng_state(self, state: Any) -> None:
        raise NotImplementedError


def pad_token_rows(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack 1-D per-step tensors into ``[n, max_len]``, zero-padded (keeps gradients)."""
    if not rows:
        return torch.zeros(0, 0)
    width = max(int(r.shape[0]) for r in rows)
    return torch.stack([torch.nn.functional.pad(r, (0, width - int(r.shape[0]))) for r in rows])


def action_mask(steps: Sequence[StepLike], width: int | None = None) -> torch.Tensor:
    """``[n, max_len]`` float mask of real (non-padding) action tokens."""
    lengths = torch.tensor([len(s.action.token_ids) for s in steps], dtype=torch.long)
    width = int(lengths.max()) if width is None and len(steps) else (width or 0)
    return (torch.arange(width)[None, :] < lengths[:, None]).float()
