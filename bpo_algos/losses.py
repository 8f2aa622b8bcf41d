"""The policy loss shared by every algorithm: clipped surrogate, optional k3 KL, aggregation.

Per token ``t`` of step ``s`` (weight ``w_s`` from rule 3, advantage ``A_s``)::

    ratio = exp(logp - old_logp)
    l_t   = -min(ratio * A_s, clip(ratio, 1 - eps_low, 1 + eps_high) * A_s)
            + kl_coef * k3(logp, ref_logp),   k3 = min(exp(r) - r - 1, 10),  r = clip(ref - logp, ±20)

Aggregations (``m`` is the action-token mask, ``T`` the number of trees):

* ``token-mean``: ``sum_{s,t} w_s m l / sum_{s,t} w_s m``
* ``seq-mean-token-mean``: ``sum_s w_s mean_t(l) / sum_s w_s``
* ``step-sum``: ``(1/T) sum_s w_s sum_t l`` — at ratio 1, no KL, ``backward()`` gives minus the
  algorithm's policy-gradient estimate ``(1/T) sum_s w_s A_s grad log pi(a_s | h_s)``.

Every aggregation is a sum over steps divided by a batch-level normaliser ``Z``
(:func:`loss_normaliser`: ``sum w m``, ``sum w`` or ``T``). Computing ``Z`` once over the whole
batch (all micro-batches, all data-parallel ranks) and passing it as ``normaliser=`` makes the
sum of the micro-batch losses (and of their gradients) equal the one-batch loss: that is what
bounds training memory by one micro-batch without changing the gradient.

Every tensor is moved to ``logp``'s device (the policy's), so a CUDA policy meets CPU-built
advantages, weights and masks without a device error.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "step-sum")


def _scalar(value: torch.Tensor) -> float:
    """A logged statistic as a float (NaN on the ``meta`` device, which holds no values)."""
    return float("nan") if value.is_meta else float(value)


K3_LOG_RATIO_CLIP = 20.0
K3_CLIP = 10.0
"""verl's clamps in its ``low_var_kl`` (``kl_penalty`` in ``verl/trainer/ppo/core_algos.py``):
the log-ratio to ``[-20, 20]`` before ``exp``, the estimate to ``[-10, 10]`` after."""


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref), per token: non-negative, unbiased, and clamped
    as verl's ``low_var_kl`` is (:data:`K3_LOG_RATIO_CLIP`, :data:`K3_CLIP`).

    The clamps only act where k3 > 10: where the reference gives the token over e^2.6 ~ 14x the
    policy's probability, or the policy over e^11 x the reference's; there the penalty stops
    growing and gives no gradient, as in verl.
    """
    log_ratio = (ref_logp.to(logp.device) - logp).clamp(-K3_LOG_RATIO_CLIP, K3_LOG_RATIO_CLIP)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-K3_CLIP, K3_CLIP)


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss ``-min(r A, clip(r) A)`` and the 0/1 clipped indicator."""
    ratio = torch.exp(logp - old_logp.to(logp.device))
    adv = advantages.to(logp.device)[:, None]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped).float()


def _check_mode(mode: str) -> None:
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")


def loss_normaliser(mask: torch.Tensor, weights: torch.Tensor, mode: str, n_trees: int) -> float:
    """The denominator ``Z`` of ``mode`` over these steps: ``sum w m`` (token-mean),
    ``sum w`` (seq-mean-token-mean) or the number of trees (step-sum).

    For micro-batches or data-parallel ranks, sum the per-part values of the first two (and
    the trees) and pass the total to :func:`aggregate` as ``normaliser``."""
    _check_mode(mode)
    if mode == "token-mean":
        return float((mask * weights.to(mask.device)[:, None]).sum())
    if mode == "seq-mean-token-mean":
        return float(weights.sum())
    return float(n_trees)


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    mode: str,
    n_trees: int,
    normaliser: float | None = None,
) -> torch.Tensor:
    """Reduce ``[n_steps, n_tokens]`` per-token losses to a scalar (see module docstring).

    ``normaliser`` replaces the denominator computed from these steps (a whole-batch ``Z``
    from :func:`loss_normaliser` when these steps are one micro-batch of it)."""
    _check_mode(mode)
    device = per_token.device
    mask, weights = mask.to(device), weights.to(device)
    w = weights[:, None]
    if mode == "token-mean":
        numerator = (per_token * mask * w).sum()
        denom = (mask * w).sum().clamp_min(1e-12) if normaliser is None else max(normaliser, 1e-12)
    elif mode == "seq-mean-token-mean":
        per_step = (per_token * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
        numerator = (per_step * weights).sum()
        denom = weights.sum().clamp_min(1e-12) if normaliser is None else max(normaliser, 1e-12)
    else:
        numerator = (per_token * mask * w).sum()
        denom = max(n_trees, 1) if normaliser is None else max(normaliser, 1.0)
    return numerator / denom


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    *,
    n_trees: int,
    aggregation: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    normaliser: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The full loss and its diagnostics (clip fraction, KL, approx. KL to the old policy).

    ``normaliser``: the whole batch's ``Z`` (:func:`loss_normaliser`) when these tensors are
    one micro-batch; the statistics are means over these steps' tokens."""
    mask = mask.to(logp.device)
    old_logp = old_logp.to(logp.device)
    per_token, clipped = clipped_surrogate(
        logp, old_logp, advantages, clip_low, clip_low if clip_high is None else clip_high
    )
    stats: dict[str, float] = {}
    if kl_coef:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs reference log-probs")
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + kl_coef * kl
        stats["kl_ref"] = _scalar((kl.detach() * mask).sum() / mask.sum().clamp_min(1.0))
    loss = aggregate(per_token, mask, weights, aggregation, n_trees, normaliser)
    denom = mask.sum().clamp_min(1.0)
    stats["clip_frac"] = _scalar((clipped * mask).sum() / denom)
    stats["approx_kl_old"] = _scalar((((old_logp - logp).detach()) * mask).sum() / denom)
    return loss, stats


def gradient_norm(parameters: Sequence[torch.nn.Parameter]) -> float:
    """L2 norm of all gradients together (accumulated in float64: a float32 sum over millions
    of squares is off in the fourth digit)."""
    norms = [torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float64) for p in parameters if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
