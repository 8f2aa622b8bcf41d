"""The ``baseline=`` option of BPO and RLOO: their own baseline, ``"anchored"`` or ``"anchored+history"``.

* the plain baseline (``"tree"`` for BPO: rule 4; ``"trajectory"`` for RLOO: rule 5);
* ``"anchored"``: ``A(e) = Q(e) - mean Q`` over the same-key edges of e's tree outside e's
  lineage, else the plain advantage (:func:`bpo_algos.advantages.anchored_advantages`);
* ``"anchored+history"``: that pool joined by the same-key edges of the previous
  ``history_window`` batches, frozen before the batch (docs/unbiasedness.md, rule 6).

Either anchored choice uses the pool only when it holds at least ``min_matches`` edges (default
1), else the plain advantage; the pool's size is decided off e's lineage, so this stays unbiased.

The anchor key is a function of the decision node (the history) only: by default a stable hash
of the task and the observation the policy sees (:func:`bpo_algos.advantages.observation_key`);
``anchor_key=`` takes any ``key(tree, node) -> hashable``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bpo_algos.advantages import AnchorHistory, AnchorKey, observation_key
from bpo_algos.checks import check_count
from bpo_algos.tree import RolloutTree


class BaselineChoice:
    """Which estimator and options an algorithm's ``baseline=`` stands for, and its history."""

    def __init__(
        self,
        baseline: str,
        *,
        plain: str,
        plain_estimator: str,
        anchor_key: AnchorKey | None = None,
        history_window: int = 4,
        min_matches: int = 1,
    ) -> None:
        choices = (plain, "anchored", "anchored+history")
        if baseline not in choices:
            raise ValueError(f"baseline must be one of {choices}, got {baseline!r}")
        if anchor_key is not None and not callable(anchor_key):
            raise TypeError(f"anchor_key must be callable(tree, node), got {type(anchor_key).__name__}")
        self.baseline = baseline
        self.plain_estimator = plain_estimator
        self.anchor_key: AnchorKey = anchor_key or observation_key
        self.history_window = check_count("history_window", history_window, 1)
        self.min_matches = check_count("min_matches", min_matches, 1)
        self.history = (
            AnchorHistory(self.history_window, self.anchor_key) if baseline == "anchored+history" else None
        )

    @property
    def anchored(self) -> bool:
        return self.baseline in ("anchored", "anchored+history")

    def estimator(self) -> tuple[str, dict[str, Any]]:
        """``(estimator name, options)`` for :func:`bpo_algos.advantages.estimate_advantages`."""
        if not self.anchored:
            return self.plain_estimator, {}
        return "anchored", {
            "fallback": self.plain_estimator,
            "anchor_key": self.anchor_key,
            "history": self.history,
            "min_matches": self.min_matches,
        }

    def end_batch(self, trees: Sequence[RolloutTree]) -> None:
        """Record the batch into the history (after its advantages are written)."""
        if self.history is not None:
            self.history.record(trees)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history.state_dict()} if self.history is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.history is not None and "history" in state:
            self.history.load_state_dict(state["history"])

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"baseline": self.baseline}
        if self.anchored:
            out["min_matches"] = self.min_matches
        if self.history is not None:
            out["history_window"] = self.history_window
        return out


class AnchoredBaselineMixin:
    """For an :class:`~bpo_algos.algorithm.Algorithm` with a ``baseline_choice``: the estimator
    it names. (The algorithm calls ``baseline_choice.end_batch`` and saves its state itself.)"""

    baseline_choice: BaselineChoice

    @property
    def advantage_estimator(self) -> str:
        return self.baseline_choice.estimator()[0]

    def advantage_options(self) -> dict[str, Any]:
        return self.baseline_choice.estimator()[1]
