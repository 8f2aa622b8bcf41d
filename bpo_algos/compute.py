"""The compute meter and per-batch budgets.

Every algorithm collects through the same engine, which counts the same things, so a comparison
can fix one unit for all algorithms and report the others.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

COMPUTE_UNITS: tuple[str, ...] = (
    "env_steps",
    "restores",
    "snapshots",
    "leaves",
    "gen_tokens",
    "prefill_tokens",
    "policy_calls",
    "seconds",
)


@dataclass
class ComputeMeter:
    """What a tree or batch cost.

    Attributes:
        env_steps: ``env.step`` calls (replays done by a ReplaySnapshot restore not included).
        restores: snapshot restores (each fork onto an env costs one).
        snapshots: snapshots taken (branch points and the root).
        leaves: finished episodes (terminated or truncated paths).
        gen_tokens: tokens of sampled actions (a tabular action is one token).
        prefill_tokens: prompt tokens the policy processed (counted once per context when a
            policy shares the prefix among the samples of that context).
        policy_calls: batched calls to ``sample`` / ``decision_entropy``.
        seconds: wall-clock seconds.
        resets: ``env.reset`` calls (one per tree root, plus rebuilds after a failure).
        failures: env or worker errors the engine handled (a step, restore, snapshot or reset
            that raised, or a dead Ray actor); see :mod:`bpo_algos.engine`.
        dropped_steps: env steps of paths dropped after failures (already in ``env_steps``).
    """

    env_steps: int = 0
    restores: int = 0
    snapshots: int = 0
    leaves: int = 0
    gen_tokens: int = 0
    prefill_tokens: int = 0
    policy_calls: int = 0
    seconds: float = 0.0
    resets: int = 0
    failures: int = 0
    dropped_steps: int = 0

    def __add__(self, other: ComputeMeter) -> ComputeMeter:
        return ComputeMeter(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def __sub__(self, other: ComputeMeter) -> ComputeMeter:
        return ComputeMeter(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def add(self, other: ComputeMeter) -> None:
        """In-place ``self += other``."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def copy(self) -> ComputeMeter:
        return ComputeMeter(**asdict(self))

    def get(self, unit: str) -> float:
        if unit not in COMPUTE_UNITS and unit != "resets":
            raise ValueError(f"unknown compute unit {unit!r}; one of {COMPUTE_UNITS}")
        return getattr(self, unit)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Budget:
    """A per-batch budget: collection starts no new tree once ``amount`` of ``unit`` is spent.

    ``Budget("env_steps", 512)`` or ``Budget(env_steps=512)``. A tree in progress is always
    finished (cutting it would bias the estimate); the engine starts another tree only while the
    batch is expected to end closer to the budget with it, and reports what was used.
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

    def exhausted(self, meter: ComputeMeter) -> bool:
        return meter.get(self.unit) >= self.amount

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
