"""How an env turns its task outcome into the reward it pays (WebShop and ALFWorld).

Three knobs, the same on every env that has them:

* ``reward_mode="score"`` pays the env's own score at the end of the episode (WebShop: the
  upstream dense score in [0, 1]; ALFWorld: 1 on success, so both modes agree there);
  ``"success"`` pays 1 when the task is won (``info["won"]``) and 0 otherwise.
* ``reward_scale=c`` multiplies that terminal reward: ``r = c * base``.
* ``invalid_penalty=p`` (>= 0): a step whose action the env cannot run
  (``info["invalid_action"]``) pays ``-p`` instead of 0.

:data:`REWARD_SETTINGS` names two settings: ``"default"`` (the env's score, no penalty) and
``"verl-agent"`` (``10 * success``, ``-0.1`` per invalid action: verl-agent's WebShop and
ALFWorld rewards). verl-agent charges the 0.1 for an answer its parser cannot read; here it is
charged for any action the env cannot run, which includes an unreadable one (the policy's parse
failure reaches the env as text the env rejects).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

REWARD_MODES: tuple[str, ...] = ("score", "success")

REWARD_SETTINGS: dict[str, dict[str, Any]] = {
    "default": {"reward_mode": "score", "reward_scale": 1.0, "invalid_penalty": 0.0},
    "verl-agent": {"reward_mode": "success", "reward_scale": 10.0, "invalid_penalty": 0.1},
}
"""Named reward settings: pass ``**REWARD_SETTINGS[name]`` to ``gym.make``."""

VERL_AGENT_REWARD: dict[str, Any] = REWARD_SETTINGS["verl-agent"]


@dataclass(frozen=True)
class RewardSettings:
    """A checked ``(reward_mode, reward_scale, invalid_penalty)`` triple (see the module doc)."""

    reward_mode: str = "score"
    reward_scale: float = 1.0
    invalid_penalty: float = 0.0

    def terminal(self, score: float, won: bool) -> float:
        """``reward_scale * (score if mode == "score" else 1[won])``."""
        base = float(score) if self.reward_mode == "score" else (1.0 if won else 0.0)
        return self.reward_scale * base

    @property
    def invalid(self) -> float:
        """The reward of a step whose action the env could not run (``-invalid_penalty``)."""
        return -self.invalid_penalty if self.invalid_penalty else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def reward_settings(reward_mode: str = "score", reward_scale: float = 1.0, invalid_penalty: float = 0.0) -> RewardSettings:
    """Check the three env kwargs; raise ``ValueError`` naming the bad one."""
    if reward_mode not in REWARD_MODES:
        raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
    scale = _finite_number(reward_scale, "reward_scale")
    penalty = _finite_number(invalid_penalty, "invalid_penalty")
    if penalty < 0:
        raise ValueError(f"invalid_penalty is subtracted, so it must be >= 0, got {invalid_penalty!r}")
    return RewardSettings(reward_mode, scale, penalty)
