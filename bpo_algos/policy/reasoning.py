"""``ReasoningTabularPolicy``: a synthetic text policy that reasons before it acts (for tests).

Each reply is ``<think>REASON</think><action>ACTION</action>``: first one of ``R`` reasoning
strings ``r ~ p(r | h) = softmax(rho[h])``, then an admissible action
``a ~ p(a | h, r) = softmax(alpha[h, r])``. The policy's distribution over env actions is the
marginal ``pi(a | h) = sum_r p(r | h) p(a | h, r)`` (:meth:`log_probs`, what the exact gradient
of TreeMDP's expected return is taken of); a reply is two "tokens" ``(r, a)``, so
``token_logprobs`` gives ``log p(r | h)`` and ``log p(a | h, r)`` and their sum is the log-prob
of the whole reply (the score function whose expectation is that gradient).

It exists to check the decision-entropy rules of policies that reason (docs/paper-setting.md)
on the exact-gradient TreeMDP, with the same parsing and probe code as the LLM policies:

* ``decision_entropy="exact"``: the entropy of an immediate answer at ``h``, ``softmax(alpha0[h])``
  (the proxy an LLM's exact mode computes: answers scored at ``h`` without reasoning).
* ``decision_entropy="probe"``: :meth:`~bpo_algos.policy.base.Policy.probe_entropy` with
  ``probe_samples`` replies, parsed by :func:`~bpo_envs.prompting.parse_action`.
* ``decision_entropy="sampled-reasoning"``: the rule that is **not** offered by the LLM
  policies. The backbone's own reasoning ``r`` is sampled first and the entropy of
  ``p(a | h, r)`` decides the branch (as ARPO branches where the rollout's own tokens are
  uncertain); the next ``sample`` at that context starts its first reply (the backbone's) from
  that ``r``. The branch decision then depends on the backbone's sampled reply, which breaks
  rule 1 of docs/unbiasedness.md, and the test shows the bias.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from bpo_algos.policy.base import Action, Context, Policy, StepLike, TablePolicy, as_steps
from bpo_envs.prompting import PromptConfig, env_action, parse_action
from bpo_envs.validation import check_count

REASONING_RULES: tuple[str, ...] = ("exact", "probe", "sampled-reasoning")
CONFIG = PromptConfig(reasoning=True)


def _key(observation: str) -> str:
    return "o" + hashlib.blake2b(observation.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()


class ReasoningTabularPolicy(TablePolicy, nn.Module):
    """Think, then act, from tables keyed by observation (module docstring).

    Args:
        reasons: the reasoning strings (``R >= 1``).
        decision_entropy: one of :data:`REASONING_RULES`.
        probe_samples: replies per probe.
        seed: seeds sampling.
    """

    def __init__(self, reasons: Sequence[str] = ("I am sure.", "I am unsure."), *, decision_entropy: str = "exact", probe_samples: int = 4, seed: int = 0) -> None:
        Policy.__init__(self)
        nn.Module.__init__(self)
        if decision_entropy not in REASONING_RULES:
            raise ValueError(f"decision_entropy must be one of {REASONING_RULES}, got {decision_entropy!r}")
        check_count("probe_samples", probe_samples)
        if not reasons:
            raise ValueError("need at least one reasoning string")
        self.reasons = tuple(reasons)
        self.decision_entropy_mode = decision_entropy
        self.probe_samples = int(probe_samples)
        self.config = CONFIG
        self.table = nn.ParameterDict()
        self._rng = np.random.default_rng(seed)
        self._stash: dict[int, int] = {}

    # ---- table ---------------------------------------------------------------------------
    def entry(self, observation: str, n_actions: int) -> nn.Parameter:
        """``[R + (R + 1) * A]`` logits of ``observation``: ``rho``, then ``alpha[r]`` per reason,
        then ``alpha0`` (the immediate answer); zeros on first sight."""
        key = _key(observation)
        if key not in self.table:
            self.table[key] = nn.Parameter(torch.zeros(len(self.reasons) + (len(self.reasons) + 1) * n_actions))
        return self.table[key]

    def set_entry(self, observation: str, n_actions: int, reason_logits: Sequence[float], action_logits: Sequence[Sequence[float]], immediate: Sequence[float]) -> None:
        values = torch.tensor([*reason_logits, *(x for row in action_logits for x in row), *immediate], dtype=torch.float32)
        with torch.no_grad():
            self.entry(observation, n_actions).copy_(values)

    def _split(self, observation: str, n_actions: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log p(r), log p(a | r) as ``[R, A]``, log of the immediate answer's ``[A]``)."""
        r = len(self.reasons)
        theta = self.entry(observation, n_actions)
        rho, alpha, alpha0 = theta[:r], theta[r : r + r * n_actions].view(r, n_actions), theta[r + r * n_actions :]
        return torch.log_softmax(rho, -1), torch.log_softmax(alpha, -1), torch.log_softmax(alpha0, -1)

    def _split_np(self, observation: str, n_actions: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_split` without autograd, in float64 numpy (sampling and entropies)."""
        r = len(self.reasons)
        theta = self.entry(observation, n_actions).detach().double().numpy()

        def log_softmax(x: np.ndarray) -> np.ndarray:
            z = x - x.max(-1, keepdims=True)
            return z - np.log(np.exp(z).sum(-1, keepdims=True))

        rho, alpha, alpha0 = theta[:r], theta[r : r + r * n_actions].reshape(r, n_actions), theta[r + r * n_actions :]
        return log_softmax(rho), log_softmax(alpha), log_softmax(alpha0)

    def log_probs(self, observation: str, actions: Sequence[str]) -> torch.Tensor:
        """Differentiable marginal ``log pi(a | h)`` over ``actions`` (reasoning summed out)."""
        lr, la, _ = self._split(observation, len(actions))
        return torch.logsumexp(lr[:, None] + la, 0)

    # ---- Policy --------------------------------------------------------------------------
    def _reply(self, context: Context, reason: int | None, rng: np.random.Generator) -> Action:
        actions = context.admissible_actions or ()
        lr, la, _ = self._split_np(context.observation, len(actions))
        pr = np.exp(lr)
        r = int(rng.choice(len(pr), p=pr / pr.sum())) if reason is None else reason
        pa = np.exp(la[r])
        a = int(rng.choice(len(pa), p=pa / pa.sum()))
        text = f"{CONFIG.think_open}{self.reasons[r]}{CONFIG.think_close}{CONFIG.action_open}{actions[a]}{CONFIG.action_close}"
        self.meter.gen_tokens += 2
        return Action(text, (r, a), (float(lr[r]), float(la[r, a])), env_action(text, CONFIG), (0,))

    def _generate(self, contexts: Sequence[Context], n: int, rngs: Sequence[np.random.Generator] | None = None) -> list[list[Action]]:
        if rngs is not None and len(rngs) != len(contexts):
            raise ValueError(f"{len(rngs)} generators for {len(contexts)} contexts")
        out = []
        for j, context in enumerate(contexts):
            rng = self._rng if rngs is None else rngs[j]
            first = self._stash.pop(id(context), None)
            out.append([self._reply(context, first if i == 0 else None, rng) for i in range(n)])
            self.meter.prefill_tokens += 1
        return out

    def sample(self, contexts: Sequence[Context], n: int, rngs: Sequence[np.random.Generator] | None) -> list[list[Action]]:
        check_count("n", n)
        self.meter.policy_calls += 1
        return self._generate(contexts, n, rngs)

    def decision_entropy(self, contexts: Sequence[Context]) -> list[float]:
        self.meter.policy_calls += 1
        if self.decision_entropy_mode == "probe":
            return self.probe_entropy(contexts, self.probe_samples, self._generate, lambda text: parse_action(text, CONFIG))
        out = []
        for context in contexts:
            n_actions = len(context.admissible_actions or ())
            lr, la, l0 = self._split_np(context.observation, n_actions)
            if self.decision_entropy_mode == "exact":
                logp = l0
                self.meter.score_tokens += 1 + n_actions
            else:  # "sampled-reasoning": the backbone's own reasoning, kept for its reply
                pr = np.exp(lr)
                r = int(self._rng.choice(len(pr), p=pr / pr.sum()))
                self._stash[id(context)] = r
                logp = la[r]
                self.meter.score_tokens += 2 + n_actions
            out.append(float(-(np.exp(logp) * logp).sum()))
        return out

    def token_logprobs(self, steps: Sequence[StepLike]) -> torch.Tensor:
        """``[n_steps, 2]``: ``log p(r | h)`` and ``log p(a | h, r)`` of each recorded reply."""
        rows = []
        for s in as_steps(steps):
            lr, la, _ = self._split(s.context.observation, len(s.context.admissible_actions or ()))
            r, a = s.action.token_ids
            rows.append(torch.stack([lr[r], la[r, a]]))
        return torch.stack(rows) if rows else torch.zeros(0, 2)


def tree_reasoning_policy(env: Any, decision_entropy: str = "exact", *, task: int = 0, seed: int = 0, probe_samples: int = 4) -> tuple[ReasoningTabularPolicy, torch.Tensor]:
    """A policy for TreeMDP ``env``'s task ``task`` that reasons in one of two ways at every
    inner node, "sure" (most of its mass on the child with the best reachable reward) or
    "unsure" (uniform), each with probability 1/2, and whose immediate answer has random
    logits; and the direction ``+rho[unsure] - rho[sure]`` at the non-root nodes (the
    parameters a branch rule that reads the sampled reasoning distorts).

    The exact gradient is ``env.unwrapped.expected_return(policy.log_probs, task)``'s."""
    tree = env.unwrapped
    rng = np.random.default_rng(seed)
    policy = ReasoningTabularPolicy(decision_entropy=decision_entropy, probe_samples=probe_samples, seed=seed)
    a = tree.n_actions

    def best(path: tuple[int, ...]) -> float:
        if len(path) == tree.depth:
            return float(tree.reward_of(task, path))
        return max(best((*path, b)) for b in range(a))

    direction = []
    for depth in range(tree.depth):
        for prefix in np.ndindex(*([a] * depth)):
            sure = np.full(a, -2.0)
            sure[int(np.argmax([best((*prefix, b)) for b in range(a)]))] = 2.0
            policy.set_entry(tree.observation_of(task, tuple(prefix)), a, [0.0, 0.0], [sure, np.zeros(a)], rng.normal(0.0, 1.5, a))
            d = torch.zeros(2 + 3 * a)
            if depth:
                d[0], d[1] = -1.0, 1.0
            direction.append(d)
    return policy, torch.cat(direction)
