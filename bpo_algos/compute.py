"""The compute meter, the cost model and per-batch budgets.

Every algorithm collects through the same engine, which counts the same things, so a comparison
can fix one unit for all algorithms and report the others.

The cost model (docs/main-job.md, "Cost units"), one for every policy:

* a forward pass of the policy over a context is charged the tokens it processes: an LLM's
  prompt (``prefill_tokens``), every generated token (``gen_tokens``), and a scoring pass's
  prompt and scored candidates (``score_tokens``); a choice policy (a softmax over the
  admissible actions ``A(h)``) processes the context and every candidate, ``1 + |A(h)|``
  tokens, whether it samples (``prefill_tokens``) or scores (``score_tokens``), and each
  action it reads off that softmax is one ``gen_tokens``;
* the learner's forward and backward over a collected step are ``train_tokens``: the step's
  prompt and action tokens for an LLM, ``1 + |A(h)|`` for a choice policy
  (:meth:`~bpo_algos.policy.base.Policy.train_tokens`), once per optimizer epoch;
* ``flops`` = ``2 P`` per prefill, generated and scored token + ``6 P`` per trained token,
  ``P`` the policy's parameter count (:meth:`~bpo_algos.policy.base.Policy.flops_parameters`): the standard
  forward ``2P`` / forward+backward ``6P`` per token of a dense transformer (Kaplan et al.
  2020), attention's context-length term left out.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

COMPUTE_UNITS: tuple[str, ...] = (
    "env_steps",
    "replay_steps",
    "restores",
    "snapshots",
    "leaves",
    "gen_tokens",
    "prefill_tokens",
    "score_tokens",
    "policy_tokens",
    "policy_calls",
    "seconds",
    "train_tokens",
    "flops",
)
"""Units a :class:`Budget` can be set in (every one is a :class:`ComputeMeter` field)."""

DERIVED_UNITS: tuple[str, ...] = ("policy_tokens",)
"""Meter values computed from the others (in :meth:`ComputeMeter.to_dict`, not constructor
arguments)."""


@dataclass
class ComputeMeter:
    """What a tree or batch cost.

    Attributes:
        env_steps: every ``env.step`` the collection causes: the steps of the rollouts, the
            steps a ``ReplaySnapshot`` restore replays and the steps the engine replays to
            rebuild a path after a failure.
        replay_steps: the part of ``env_steps`` spent re-reaching a state rather than
            exploring (``ReplaySnapshot`` restores, rebuilds after failures).
        restores: snapshot restores (each fork onto an env costs one).
        snapshots: snapshots taken (branch points and the root).
        leaves: finished episodes (terminated or truncated paths).
        gen_tokens: tokens of sampled actions (a tabular action is one token).
        prefill_tokens: prompt tokens the policy processed to generate (counted once per
            context when a policy shares the prefix among the samples of that context).
        score_tokens: tokens of decision-entropy (scoring) passes: the prompt and every
            candidate action scored, kept apart from generation's prefill. A prompt whose
            cache a scoring pass fills and generation then reuses is counted here only.
        policy_calls: batched calls to ``sample`` / ``decision_entropy``.
        seconds: time. A batch's is the wall clock of its collection (policy, env and engine
            time); a tree's is the policy and env time spent on it, each batched call's time
            shared among the paths it served, so the trees of a batch add up to about the
            batch's time however many ran at once.
        resets: ``env.reset`` calls (one per tree root, plus rebuilds after a failure).
        failures: env or worker errors the engine handled (a step, restore, snapshot or reset
            that raised, or a dead Ray actor); see :mod:`bpo_algos.recovery`.
        dropped_steps: env steps of paths dropped after failures (already in ``env_steps``).
        train_tokens: tokens the learner's forward and backward passes cover: each collected
            step's :meth:`~bpo_algos.policy.base.Policy.train_tokens`, charged when the
            step is recorded (so a budget sees it), once per optimizer epoch.
        flops: the cost model's floating-point operations (module docstring):
            ``2 P (prefill + gen + score tokens) + 6 P train_tokens``.

    ``policy_tokens`` (derived) = ``gen_tokens + prefill_tokens + score_tokens``: every token a
    policy forward pass processed, what a GPU pays for.
    """

    env_steps: int = 0
    replay_steps: int = 0
    restores: int = 0
    snapshots: int = 0
    leaves: int = 0
    gen_tokens: int = 0
    prefill_tokens: int = 0
    score_tokens: int = 0
    policy_calls: int = 0
    seconds: float = 0.0
    resets: int = 0
    failures: int = 0
    dropped_steps: int = 0
    train_tokens: int = 0
    flops: float = 0.0

    @property
    def policy_tokens(self) -> int:
        """``gen_tokens + prefill_tokens + score_tokens``."""
        return self.gen_tokens + self.prefill_tokens + self.score_tokens

    def __add__(self, other: ComputeMeter) -> ComputeMeter:
        return ComputeMeter(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def __sub__(self, other: ComputeMeter) -> ComputeMeter:
        return ComputeMeter(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def add(self, other: ComputeMeter) -> None:
        """In-place ``self += other``."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def copy(self) -> ComputeMeter:
        return copy.copy(self)  # every field is a number: a shallow copy is a copy

    def get(self, unit: str) -> float:
        if unit not in COMPUTE_UNITS and unit != "resets":
            raise ValueError(f"unknown compute unit {unit!r}; one of {COMPUTE_UNITS}")
        return getattr(self, unit)

    def to_dict(self) -> dict[str, Any]:
        """Every field plus the derived ``policy_tokens``."""
        return {**asdict(self), "policy_tokens": self.policy_tokens}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ComputeMeter:
        """The inverse of :meth:`to_dict` (derived values dropped; fields missing from an older
        record are 0)."""
        names = {f.name for f in fields(cls)}
        unknown = set(values) - names - set(DERIVED_UNITS)
        if unknown:
            raise ValueError(f"unknown compute meter field(s) {sorted(unknown)}")
        return cls(**{k: v for k, v in values.items() if k in names})


FORWARD_FLOPS_PER_PARAM = 2
"""Flops per parameter and token of a forward pass (a multiply and an add per weight)."""
TRAIN_FLOPS_PER_PARAM = 6
"""Flops per parameter and token of a forward and backward pass (the backward costs two
forwards: the gradients of the activations and of the weights)."""


def cost_flops(params: int, *, prefill_tokens: float = 0, gen_tokens: float = 0, score_tokens: float = 0, train_tokens: float = 0) -> float:
    """The cost model: ``2 P (prefill + gen + score) + 6 P train`` flops for ``P = params``."""
    inference = prefill_tokens + gen_tokens + score_tokens
    return float(params) * (FORWARD_FLOPS_PER_PARAM * inference + TRAIN_FLOPS_PER_PARAM * train_tokens)


def should_start(amount: float, spent: float, open_costs: Sequence[float], known_costs: Sequence[float], z: float = 3.0) -> bool:
    """The budget's start rule: start another tree when the batch is expected to end closer to
    the budget with it, allowing for what the trees in flight may still cost.

    ``spent`` is what the batch has used, ``open_costs`` what each started-but-unfinished tree
    has used so far, ``known_costs`` measured costs of whole trees (the previous batch's, or
    the trees already finished, or a prior). An open tree that has cost ``c`` is expected to
    cost the mean of the known costs above ``c`` (``c`` itself when none is above), with their
    variance. With ``end`` the expected total of the batch with the new tree and ``sd`` the
    standard deviation of what the open trees still cost (their spread, plus the error of the
    estimated mean, which is shared by them and the new tree), the tree starts when

        ``end - mean / 2 + z * sd <= amount``

    i.e. when the batch then ends, in expectation, nearer the budget than without it (the
    ``mean / 2``), with ``z`` standard deviations to spare: trees started together reveal their
    costs only later, so without the margin a batch with ``n`` trees in flight overshoots by
    the sum of their deviations (about ``sqrt(n)`` trees' spread). The margin holds part of
    the budget back until running trees finish and the uncertainty shrinks.
    """
    if not known_costs:
        raise ValueError("should_start needs at least one known tree cost")
    known = np.asarray(known_costs, dtype=float)
    mean = float(known.mean())
    spread = float(known.var(ddof=1)) if known.size > 1 else 0.0
    # the new tree's own spread is no risk beyond one tree's cost; the open trees' spreads add up
    end, variance = spent + mean, 0.0
    for c in open_costs:
        above = known[known > c]
        if above.size:
            end += float(above.mean()) - c
            variance += float(above.var(ddof=1)) if above.size > 1 else 0.0
    # the means are estimated from the same sample: their error adds up over the open trees
    # (the new tree's own share of it is, like its spread, no risk beyond one tree's cost; with
    # no tree in flight the rule is the centred one, which matches budgets on average)
    variance += len(open_costs) ** 2 * spread / known.size
    return end - mean / 2 + z * variance**0.5 <= amount


class Budget:
    """A per-batch budget in one compute unit.

    ``Budget("env_steps", 512)``, ``Budget(env_steps=512)`` or ``Budget("policy_tokens", 2e6)``.
    A tree in progress is always finished (cutting it would bias the estimate); the engine
    starts another tree only while the batch is expected to end closer to the budget with it
    (:func:`should_start`), counting every started tree at its expected cost, so a batch ends
    within about half a tree's cost of the budget whatever ``max_parallel_trees`` and the pool
    size; the meters report what was used.
    """

    __slots__ = ("unit", "amount")

    def __init__(self, unit: str | None = None, amount: float | None = None, **by_unit: float) -> None:
        if by_unit:
            if unit is not None or amount is not None or len(by_unit) != 1:
                raise ValueError(f"budget takes one unit, as Budget(unit, amount) or Budget(unit=amount); got {by_unit}")
            ((unit, amount),) = by_unit.items()
        if unit not in COMPUTE_UNITS:
            raise ValueError(f"budget unit must be one of {COMPUTE_UNITS}, got {unit!r}")
        if isinstance(amount, bool) or not isinstance(amount, int | float) or not amount > 0:
            raise ValueError(f"budget amount must be a positive number, got {amount!r}")
        object.__setattr__(self, "unit", unit)
        object.__setattr__(self, "amount", amount)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Budget is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Budget) and (self.unit, self.amount) == (other.unit, other.amount)

    def __hash__(self) -> int:
        return hash((self.unit, self.amount))

    def __repr__(self) -> str:
        return f"Budget({self.unit!r}, {self.amount!r})"

    def __reduce__(self):
        return (Budget, (self.unit, self.amount))

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "amount": self.amount}

    @classmethod
    def parse(cls, value: Budget | dict[str, Any] | tuple[str, float] | float | None) -> Budget | None:
        """Accept a Budget, ``{"unit": u, "amount": a}``, ``{u: a}``, ``(u, a)``, a bare number
        (env steps) or None (no budget)."""
        if value is None or isinstance(value, Budget):
            return value
        if isinstance(value, dict):
            if set(value) == {"unit", "amount"}:
                return cls(value["unit"], value["amount"])
            if len(value) == 1:
                ((unit, amount),) = value.items()
                return cls(unit, amount)
        if isinstance(value, tuple | list) and len(value) == 2:
            return cls(*value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return cls("env_steps", value)
        raise ValueError(f"budget must be a Budget, (unit, amount), {{unit: amount}} or a number of env steps, got {value!r}")
