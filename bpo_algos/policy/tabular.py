"""``TabularPolicy``: a softmax table keyed by observation string (for TreeMDP and tests).

A :class:`~bpo_algos.policy.choice.ChoicePolicy` whose scores are a table lookup.

``pi(a | obs) = softmax(theta[obs] / temperature)[a]`` over the admissible actions of ``obs``,
in the order the env lists them. An entry of zero logits appears the first time an observation
is seen; entries live in an ``nn.ParameterDict`` in insertion order, so ``parameters()`` has a
stable order and an optimizer can pick up new entries (see ``Trainer``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from bpo_algos.policy.base import Context, StepLike, as_steps
from bpo_algos.policy.choice import ChoicePolicy, chosen


def _key(observation: str) -> str:
    # ParameterDict keys cannot contain "."; a digest keeps them short and stable.
    return "o" + hashlib.blake2b(observation.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()


class TabularPolicy(ChoicePolicy):
    """A softmax table over admissible actions, one entry per observation."""

    def __init__(self, temperature: float = 1.0, seed: int = 0) -> None:
        super().__init__(temperature=temperature, seed=seed)
        self.table = nn.ParameterDict()
        self._reference_table: dict[str, torch.Tensor] | None = None

    # ---- table ---------------------------------------------------------------------------
    def logits(self, observation: str, n_actions: int) -> nn.Parameter:
        """The entry for ``observation`` (created as zeros on first sight)."""
        key = _key(observation)
        entry = self.table[key] if key in self.table else None
        if entry is None:
            entry = nn.Parameter(torch.zeros(n_actions))
            self.table[key] = entry
        elif entry.shape[0] != n_actions:
            raise ValueError(
                f"observation {observation[:60]!r} was seen with {entry.shape[0]} actions, "
                f"now with {n_actions}"
            )
        return entry

    def set_logits(self, observation: str, logits: Sequence[float]) -> None:
        """Set the entry for ``observation`` (used to build fixed policies)."""
        values = torch.as_tensor(list(logits), dtype=torch.float32)
        with torch.no_grad():
            self.logits(observation, values.shape[0]).copy_(values)

    @classmethod
    def from_logits(cls, table: Mapping[str, Sequence[float]], **kwargs: Any) -> TabularPolicy:
        policy = cls(**kwargs)
        for observation, logits in table.items():
            policy.set_logits(observation, logits)
        return policy

    def log_probs(self, observation: str, actions: Sequence[str]) -> torch.Tensor:
        """Differentiable log-probabilities over ``actions`` (the admissible list of ``obs``)."""
        if not actions:
            raise ValueError(f"no admissible actions at {observation[:60]!r}: a tabular policy needs them")
        return torch.log_softmax(self.logits(observation, len(actions)) / self.temperature, dim=-1)

    # ---- ChoicePolicy ------------------------------------------------------------------
    def scores(self, contexts: Sequence[Context]) -> list[torch.Tensor]:
        return [self.logits(c.observation, len(c.admissible_actions or ())) for c in contexts]

    def shared_pass(self, contexts: Sequence[Context]) -> AbstractContextManager[None]:
        """Nothing shared: a lookup has no pass to batch, and looking every deciding context up
        first would create unseen entries in another order than the calls do (the order of
        ``parameters()``)."""
        return nullcontext()

    # ---- reference policy (k3 KL) --------------------------------------------------------
    def set_reference(self) -> None:
        """Freeze the current table as the reference policy (unseen entries: zero logits)."""
        self._reference_table = {k: v.detach().clone() for k, v in self.table.items()}

    def reference_token_logprobs(self, steps: Sequence[StepLike]) -> torch.Tensor:
        steps = as_steps(steps)
        if self._reference_table is None:
            self.set_reference()
        assert self._reference_table is not None
        rows = []
        for s in steps:
            actions = s.context.admissible_actions or ()
            logits = self._reference_table.get(_key(s.context.observation), torch.zeros(len(actions)))
            rows.append(torch.log_softmax(logits / self.temperature, dim=-1)[chosen(s)])
        return torch.stack(rows).unsqueeze(-1) if rows else torch.zeros(0, 1)

    # ---- checkpoints ---------------------------------------------------------------------
    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):  # type: ignore[override]
        """Create the saved entries (in saved order) before loading them."""
        prefix = "table."
        for name, value in state_dict.items():
            if name.startswith(prefix):
                key = name[len(prefix) :]
                if key not in self.table:
                    self.table[key] = nn.Parameter(torch.zeros_like(value))
        return super().load_state_dict(state_dict, strict=strict, assign=assign)
