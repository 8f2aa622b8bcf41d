"""``ChoicePolicy``: a softmax over the env's admissible actions, whatever scores them.

``pi(a | h) = softmax(s_theta(h, A(h)) / temperature)[a]`` for ``a`` in the admissible list
``A(h)`` of the context, in the order the env lists it. A subclass only says how the scores
``s_theta`` are computed (:meth:`ChoicePolicy.scores`); sampling, the exact decision entropy,
the differentiable log-probs for the loss, the frozen reference for the k3 KL and the
behaviour-cloning target are shared. An action is one "token": its index in ``A(h)``, so
``gen_tokens`` counts sampled actions. Every forward pass scores the context and each of its
candidates, ``1 + |A(h)|`` tokens (the cost model of :mod:`bpo_algos.compute`): a ``sample``
charges them as ``prefill_tokens``, a decision-entropy pass as ``score_tokens``, and the
learner's pass over a step as :meth:`ChoicePolicy.train_tokens`.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from itertools import accumulate
from typing import Any

import numpy as np
import torch
from torch import nn

from bpo_algos.policy.base import (
    Action,
    Context,
    Policy,
    StepLike,
    TablePolicy,
    as_context,
    as_steps,
)
from bpo_envs.validation import check_count


@lru_cache(maxsize=1 << 14)
def context_key(text: str) -> int:
    """A stable 32-bit id of ``text`` (recorded as the action's prompt id; cached: the pages
    of an env recur)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=4).digest(), "big")


def gumbel_top_k(logp: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``min(k, n)`` distinct draws without replacement from ``exp(logp)``, in draw
    order (Gumbel-top-k)."""
    logp = np.asarray(logp, dtype=np.float64)
    keys = logp + rng.gumbel(size=logp.shape)
    keys[~np.isfinite(logp)] = -np.inf  # zero-probability actions are never drawn
    order = np.argsort(-keys, kind="stable")
    return order[: min(int(k), int(np.isfinite(logp).sum()))]


def categorical_draws(p: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` i.i.d. indices drawn from the probabilities ``p`` (float64, summing to 1): the very
    draws (and generator state after them) of ``rng.choice(len(p), size=n, p=p)``, which inverts
    the normalised cumulative sum at ``n`` uniforms, without its per-call checks (a few times
    its cost for the handful of actions a step has). ``p`` that is not finite and non-negative
    goes to ``rng.choice``, which says what is wrong with it."""
    if not (np.isfinite(p).all() and (p >= 0).all()):
        return rng.choice(len(p), size=n, p=p)
    cdf = p.cumsum()
    cdf /= cdf[-1]
    return cdf.searchsorted(rng.random(n), side="right")


def categorical_rows(probs: np.ndarray, sizes: np.ndarray, n: int, rngs: Sequence[np.random.Generator]) -> list[list[int]]:
    """For each row ``i`` of the unnormalised probabilities ``probs`` (float64, the rows of
    ``sizes[i]`` entries concatenated), ``n`` i.i.d. indices into the row drawn from ``rngs[i]``:
    the very draws (and generator states after them), row after row, of
    ``categorical_draws(row / row.sum(), n, rngs[i])``, with the cumulative sums, their
    normalisation and the inversion done for all rows at once.

    The rows go into a zero-padded matrix: a cumulative sum along a row is the row's own
    (sequential, and the padding comes after it), the padding normalises to exactly 1 (``x / x``),
    which no uniform draw in ``[0, 1)`` reaches, and for a non-decreasing row
    ``searchsorted(u, side="right")`` is the number of entries ``<= u``. Each row's sum is taken
    on its own slice, as before (numpy's pairwise sum depends on the length it adds)."""
    m = len(sizes)
    ends = list(accumulate(sizes.tolist()))
    bounds = list(zip([0, *ends[:-1]], ends, strict=True))
    if m < FEW_ROWS:  # the matrix's fixed cost is more than a few rows' loop
        return [categorical_draws((row := probs[a:b]) / row.sum(), n, rng).tolist() for (a, b), rng in zip(bounds, rngs, strict=True)]
    # the per-row sums as categorical_draws' callers took them: the pairwise sum of the row alone
    sums = np.array([probs[a:b].sum() for a, b in bounds])
    width = int(sizes.max())
    p = np.zeros((m, width))
    p[np.arange(width) < sizes[:, None]] = probs
    p /= sums[:, None]
    valid = (np.isfinite(p) & (p >= 0)).all(axis=1)
    cdf = p.cumsum(axis=1)
    cdf /= np.where(valid, cdf[np.arange(m), sizes - 1], 1.0)[:, None]  # the rows that are not distributions are not read
    draws = np.empty((m, n))
    picks: list[list[int] | None] = [None] * m
    for i, (rng, ok) in enumerate(zip(rngs, valid.tolist(), strict=True)):
        if ok:
            draws[i] = rng.random(n)
        else:  # not a distribution: rng.choice says what is wrong with it
            picks[i] = rng.choice(int(sizes[i]), size=n, p=p[i, : sizes[i]]).tolist()
    counted = (cdf[:, None, :] <= draws[:, :, None]).sum(axis=2).tolist()
    return [row if row is not None else drawn for row, drawn in zip(picks, counted, strict=True)]


FEW_ROWS = 5
"""Below this many rows :func:`categorical_rows` loops over them (the same draws either way)."""


def chosen(step: StepLike) -> int:
    """The index of ``step``'s action in its context's admissible list, checked against the
    action's text (the two travel together from the sample to the loss)."""
    index, admissible = step.action.index, step.context.admissible_actions or ()
    if index is None or not 0 <= index < len(admissible) or admissible[index] != step.action.text:
        raise ValueError(f"the recorded action {step.action.text[:60]!r} (index {index}) is not that admissible action of its context")
    return index


class ChoicePolicy(TablePolicy, nn.Module):
    """Base class of the policies that pick one of the admissible actions.

    Subclasses implement :meth:`scores`; they may override :meth:`set_reference` and
    :meth:`reference_token_logprobs` when a frozen copy of the module is not the right reference.
    """

    def __init__(self, temperature: float = 1.0, seed: int = 0) -> None:
        Policy.__init__(self)
        nn.Module.__init__(self)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self._rng = np.random.default_rng(seed)
        self._reference: nn.Module | None = None
        self._shared: dict[int, tuple[Context, torch.Tensor]] | None = None

    # ---- what a subclass provides --------------------------------------------------------
    def scores(self, contexts: Sequence[Context]) -> list[torch.Tensor]:
        """Differentiable scores, one 1-D tensor per context over its admissible actions."""
        raise NotImplementedError

    # ---- shared --------------------------------------------------------------------------
    @staticmethod
    def _admissible(context: Context) -> tuple[str, ...]:
        if not context.admissible_actions:
            raise ValueError(
                f"a choice policy needs admissible actions; none at {context.observation[:60]!r}"
            )
        return context.admissible_actions

    def log_probs_of(self, contexts: Sequence[Context]) -> list[torch.Tensor]:
        """Differentiable log-probabilities over each context's admissible actions."""
        contexts = [as_context(c) for c in contexts]
        for context in contexts:
            self._admissible(context)
        return [torch.log_softmax(s, dim=-1) for s in self._tempered(self.scores(contexts))]

    def _tempered(self, scores: list[torch.Tensor]) -> list[torch.Tensor]:
        """``scores / temperature``; at temperature 1 the scores themselves (``x / 1`` is ``x``
        exactly, and so is its gradient: one division per context less)."""
        if self.temperature == 1.0:
            return scores
        return [s / self.temperature for s in scores]

    @contextmanager
    def shared_pass(self, contexts: Sequence[Context]) -> Iterator[None]:
        """One forward pass, without gradient, over all ``contexts`` on entry; inside,
        :meth:`sample`, :meth:`sample_distinct` and :meth:`decision_entropy` read their scores
        from it (the same numbers their own passes would give, up to float rounding in a larger
        batch; the meter counts each call's tokens as before). Scores are keyed by the context
        object, so a context the pass did not cover is scored on its own. A pass opened inside
        one that covers all of its contexts scores nothing again: it reads the outer one
        (:func:`~bpo_algos.rollout.run_together` opens one pass over several engines' steps)."""
        contexts = [as_context(c) for c in contexts]
        outer = self._shared
        if outer is not None and all((found := outer.get(id(c))) is not None and found[0] is c for c in contexts):
            yield
            return
        for context in contexts:
            self._admissible(context)
        with torch.no_grad():
            scores = self.scores(contexts)
        outer, self._shared = self._shared, {id(c): (c, s) for c, s in zip(contexts, scores, strict=True)}
        try:
            yield
        finally:
            self._shared = outer

    def _scores_no_grad(self, contexts: Sequence[Context]) -> list[torch.Tensor]:
        """Scores without gradient: from the open :meth:`shared_pass` where it covers every
        context, else one pass over them."""
        shared = self._shared
        if shared is not None:
            found = [shared.get(id(c)) for c in contexts]
            if all(f is not None and f[0] is c for f, c in zip(found, contexts, strict=True)):
                return [f[1] for f in found]  # type: ignore[index]  # all found
        with torch.no_grad():
            return self.scores(contexts)

    def _log_probs_no_grad(self, contexts: Sequence[Context]) -> list[torch.Tensor]:
        """:meth:`log_probs_of` without gradient (through :meth:`_scores_no_grad`)."""
        for context in contexts:
            self._admissible(context)
        with torch.no_grad():
            return [torch.log_softmax(s, dim=-1) for s in self._tempered(self._scores_no_grad(contexts))]

    def action_distribution(self, context: Any) -> dict[str, float]:
        """``{action: probability}`` at one context (for inspection)."""
        context = as_context(context)
        with torch.no_grad():
            probs = self.log_probs_of([context])[0].exp().tolist()
        return dict(zip(self._admissible(context), probs, strict=True))

    def recorded_action(self, context: Context, command: str) -> Action | None:
        """The :class:`Action` that chooses ``command`` at ``context`` (behaviour cloning), or
        None when ``command`` is not one of the admissible actions there."""
        context = as_context(context)
        actions = self._admissible(context)
        if command not in actions:
            return None
        i = actions.index(command)
        return Action(command, (i,), (0.0,), None, (context_key(context.observation),), index=i)

    def sample(self, contexts: Sequence[Context], n: int, rngs: Sequence[np.random.Generator] | None) -> list[list[Action]]:
        """``n`` i.i.d. samples per context; token id = index in the admissible list.

        ``rngs``: one generator per context that its samples are drawn from (the engine's
        per-path streams); None: the policy's own generator."""
        check_count("n", n)
        contexts = [as_context(c) for c in contexts]
        if not contexts:
            return []
        if rngs is not None and len(rngs) != len(contexts):
            raise ValueError(f"{len(rngs)} generators for {len(contexts)} contexts")
        all_logp = self._log_probs_no_grad(contexts)
        sizes = np.fromiter(map(len, all_logp), dtype=np.int64, count=len(all_logp))
        # float32 -> float64 is exact: numpy's cast gives the values torch's .double() gives
        flat = torch.cat(all_logp).numpy().astype(np.float64)
        picks = categorical_rows(np.exp(flat), sizes, n, [self._rng] * len(contexts) if rngs is None else rngs)
        logps = flat.tolist()
        out: list[list[Action]] = []
        start = 0
        for context, size, row in zip(contexts, sizes.tolist(), picks, strict=True):
            actions = context.admissible_actions
            prompt = (context_key(context.observation),)
            out.append([Action(actions[j], (j,), (logps[start + j],), None, prompt, index=j) for j in row])
            start += size
        self.meter.gen_tokens += n * len(contexts)
        # the forward pass behind each softmax: the context and every candidate, as a scoring pass
        self.meter.prefill_tokens += len(contexts) + int(sizes.sum())
        self.meter.policy_calls += 1
        return out

    def sample_distinct(
        self, contexts: Sequence[Context], k: int, rngs: Sequence[np.random.Generator] | None = None
    ) -> list[list[Action]]:
        """``min(k, |A(h)|)`` distinct actions per context, drawn without replacement (Gumbel-top-k,
        in draw order: the first is a plain sample from ``pi``), for ``siblings="distinct"``
        (docs/unbiasedness.md, rule 7). Log-probs in float64: the set weights read the mass of
        the actions not drawn from them (:func:`bpo_algos.siblings.node_set`)."""
        check_count("k", k)
        contexts = [as_context(c) for c in contexts]
        if not contexts:
            return []
        if rngs is not None and len(rngs) != len(contexts):
            raise ValueError(f"{len(rngs)} generators for {len(contexts)} contexts")
        for context in contexts:
            self._admissible(context)
        with torch.no_grad():
            all_logp = [torch.log_softmax(s.double() / self.temperature, dim=-1).numpy() for s in self._scores_no_grad(contexts)]
        out: list[list[Action]] = []
        for i, (context, logp) in enumerate(zip(contexts, all_logp, strict=True)):
            actions = self._admissible(context)
            picks = gumbel_top_k(logp, k, self._rng if rngs is None else rngs[i])
            prompt = (context_key(context.observation),)
            out.append([Action(actions[j], (int(j),), (float(logp[j]),), None, prompt, index=int(j)) for j in picks])
            self.meter.gen_tokens += len(picks)
            self.meter.prefill_tokens += 1 + len(actions)
        self.meter.policy_calls += 1
        return out

    def decision_entropy(self, contexts: Sequence[Context]) -> list[float]:
        """Exact entropy ``-sum_a pi(a|h) log pi(a|h)`` over the admissible actions."""
        contexts = [as_context(c) for c in contexts]
        if not contexts:
            return []
        all_logp = self._log_probs_no_grad(contexts)
        # a scoring pass: the context (one token) and every candidate action (one each)
        self.meter.score_tokens += sum(1 + len(lp) for lp in all_logp)
        self.meter.policy_calls += 1
        return [float(-(lp.double().exp() * lp.double()).sum()) for lp in all_logp]

    def train_tokens(self, step: StepLike) -> int:
        """``1 + |A(h)|``: the learner's forward and backward score the context and every
        candidate (the softmax's normaliser needs them all)."""
        return 1 + len(step.context.admissible_actions or ())

    def token_logprobs(self, steps: Sequence[StepLike]) -> torch.Tensor:
        """``[n_steps, 1]`` differentiable log-probs of the recorded actions (steps or a Batch)."""
        steps = as_steps(steps)
        if not steps:
            return torch.zeros(0, 1)
        all_logp = self.log_probs_of([s.context for s in steps])
        # one gather from the concatenated rows instead of a select per step: the same values,
        # and in the backward the same per-row gradients (zero but at the chosen action), with
        # two autograd nodes instead of two per step
        starts = np.cumsum([0] + [len(lp) for lp in all_logp[:-1]])
        index = torch.from_numpy(starts + np.fromiter((chosen(s) for s in steps), dtype=np.int64, count=len(steps)))
        return torch.cat(all_logp).index_select(0, index).unsqueeze(-1)

    # ---- reference policy (k3 KL) --------------------------------------------------------
    def set_reference(self) -> None:
        """Freeze a copy of the current policy as the reference."""
        reference = copy.deepcopy(self)
        reference._reference = None
        for p in reference.parameters():
            p.requires_grad_(False)
        self._reference = reference

    def reference_token_logprobs(self, steps: Sequence[StepLike]) -> torch.Tensor:
        steps = as_steps(steps)
        if self._reference is None:
            self.set_reference()
        assert self._reference is not None
        with torch.no_grad():
            return self._reference.token_logprobs(steps)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False):  # type: ignore[override]
        self._prepare_reference_load(state_dict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)
