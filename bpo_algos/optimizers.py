"""Adam over only the rows an update can move: behaviour cloning's optimizer.

A text scorer's embedding table has one row per hashed n-gram bucket (32,768), but one batch of
demos reaches a few hundred of them. Adam without weight decay moves an entry by

    m ← β1·m + (1 − β1)·g,   v ← β2·v + (1 − β2)·g²,
    θ ← θ − lr/(1 − β1^t) · m / (√(v/(1 − β2^t)) + ε)

so an entry whose gradient has been 0 at every step so far has m = v = 0 and does not move: on
such a row the step is exactly the identity. :class:`TouchedRowsAdam` computes the step only on
the rows of each parameter that any step has given a non-zero gradient (torch's own Adam,
``torch.optim.adam.adam``, on the gathered rows, scattered back), and the full step once half or
more of a parameter's rows are touched (a linear layer's after its first batch), where the
gather and scatter would cost more than they save. Its parameters and moments equal
``torch.optim.AdamW(params, weight_decay=0.0)``'s bit for bit (elementwise kernels give each
entry the same operations wherever it sits; ``tests/test_optimizers.py`` checks it, odd row sizes
included). Weight decay moves every row at every step, so it is not offered.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim.adam import adam


class TouchedRowsAdam(torch.optim.Optimizer):
    """Adam without weight decay that skips the rows no gradient has reached yet (module docstring).

    Args:
        params: the parameters (or parameter groups) to optimize.
        lr: the learning rate.
        betas: ``(β1, β2)``, the moments' decay rates.
        eps: ε, added to the second moment's root.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter] | Iterable[dict], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        if lr < 0 or eps < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"need lr >= 0, eps >= 0 and betas in [0, 1), got {lr}, {eps}, {betas}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("TouchedRowsAdam.step takes no closure")
        for group in self.param_groups:
            dense: list[list[torch.Tensor]] = [[], [], [], [], []]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("TouchedRowsAdam takes dense gradients (an embedding with sparse=False)")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    # rows that have had a non-zero gradient; None once the full step is taken
                    state["touched"] = torch.zeros(p.shape[0], dtype=torch.bool) if p.dim() >= 2 else None
                tensors = (p, p.grad, state["exp_avg"], state["exp_avg_sq"])
                touched = state["touched"]
                if touched is not None:
                    rows_of = p.grad.reshape(p.shape[0], -1)
                    # max and min per row: 0.4 ms on a 32,768 x 32 table where any(dim=1) takes 3
                    touched |= (rows_of.amax(dim=1) != 0) | (rows_of.amin(dim=1) != 0)
                    rows = touched.nonzero().squeeze(1)
                    if 2 * rows.numel() < p.shape[0]:
                        part = [t.index_select(0, rows) for t in tensors]
                        self._adam(group, *([t] for t in part), [state["step"]])
                        for whole, gathered in zip((p, state["exp_avg"], state["exp_avg_sq"]), (part[0], part[2], part[3]), strict=True):
                            whole.index_copy_(0, rows, gathered)
                        continue
                    state["touched"] = None
                for into, tensor in zip(dense, (*tensors, state["step"]), strict=True):
                    into.append(tensor)
            if dense[0]:
                self._adam(group, *dense)

    @staticmethod
    def _adam(group: dict, params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
              exp_avg_sqs: list[torch.Tensor], steps: list[torch.Tensor]) -> None:
        """torch's Adam step (its multi-tensor form, as ``AdamW(foreach=True)`` takes it) on these tensors."""
        beta1, beta2 = group["betas"]
        adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True, amsgrad=False, beta1=beta1, beta2=beta2,
             lr=group["lr"], weight_decay=0.0, eps=group["eps"], maximize=False)


__all__ = ["TouchedRowsAdam"]
