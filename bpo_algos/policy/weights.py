"""Initial weights saved once and reloaded per run, instead of deep copies of a policy.

A comparison trains every algorithm and seed from the same initial policy. Deep-copying an LLM
policy per run copies the model (and, for a ``VLLMPolicy``, the whole vLLM engine); instead
:class:`InitialWeights` keeps the trainable parameters once (CPU memory, or a file loaded with
``mmap``) and :meth:`InitialWeights.restore` copies them back into the same policy object in
place. Frozen weights (a LoRA base) never change, so they are not stored. Restoring also drops
what depends on trained weights: the frozen KL reference, the prompt-KV store, and (through
the in-place copy, which bumps the parameters' versions) a ``VLLMPolicy``'s pushed weights,
which the next ``sample`` syncs in place.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bpo_algos.policy.base import Policy


class InitialWeights:
    """The trainable parameters of ``policy`` now, to :meth:`restore` before each run.

    Args:
        policy: an ``nn.Module`` policy (its ``trainable_parameters()``).
        path: where to save them (None: CPU memory). A file is loaded memory-mapped.
    """

    def __init__(self, policy: Policy, path: str | os.PathLike[str] | None = None) -> None:
        if not isinstance(policy, nn.Module):
            raise TypeError(f"InitialWeights needs an nn.Module policy, got {type(policy).__name__}")
        names = self._names(policy)
        state = {n: p.detach().to("cpu", copy=True) for n, p in policy.named_parameters() if n in names}
        if not state:
            raise ValueError("the policy has no trainable parameters to save")
        self.names = sorted(state)
        self.rng = policy.rng_state()
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, self.path)
            self._state: dict[str, torch.Tensor] | None = None
        else:
            self._state = state

    @staticmethod
    def _names(policy: Policy) -> set[str]:
        chosen = {id(p) for p in policy.trainable_parameters() if p.requires_grad}
        return {n for n, p in policy.named_parameters() if id(p) in chosen}

    def state(self) -> dict[str, torch.Tensor]:
        if self._state is not None:
            return self._state
        assert self.path is not None
        return torch.load(self.path, map_location="cpu", mmap=True, weights_only=True)

    @torch.no_grad()
    def restore(self, policy: Policy) -> Policy:
        """Copy the saved values into ``policy``'s parameters in place (any device or dtype)
        and reset its sampling RNG; returns ``policy``."""
        state = self.state()
        params = dict(policy.named_parameters())
        missing = [n for n in self.names if n not in params]
        if missing:
            raise ValueError(f"the policy lacks saved parameters {missing[:3]} (a different model?)")
        for name in self.names:
            params[name].copy_(state[name])
            params[name].requires_grad_(True)
        policy._reference = None  # made again from the restored weights on first use
        policy.clear_cache()
        policy.set_rng_state(self.rng)
        return policy


def fresh_copy(initial: Any, saved: InitialWeights | None) -> Any:
    """The policy one run trains: ``initial`` itself restored from ``saved`` (LLM policies), or
    a deep copy (small policies that add parameters while collecting, like ``TabularPolicy``)."""
    if saved is not None:
        return saved.restore(initial)
    import copy

    return copy.deepcopy(initial)


def reusable(policy: Any) -> bool:
    """Whether runs should restore ``policy`` in place rather than deep-copy it: what a
    :class:`Policy` declares (:attr:`Policy.restored_in_place`; True for transformers and vLLM
    policies, whose parameters are fixed at construction); any other object (a bare module) is
    copied."""
    return isinstance(policy, Policy) and policy.restored_in_place


def state_digest(policy: Any) -> str | None:
    """SHA-256 of ``policy``'s whole state (every parameter and buffer: names, dtypes, shapes and
    bytes), or None for a policy whose outputs depend on more than that (an LLM policy restored
    in place, :func:`reusable`: its engines and caches) or that is not a module. Two states
    with the same digest are the same policy, so their evaluations on the same episodes are the
    same (docs/main-job.md, "Scheduling": ``frozen``)."""
    if reusable(policy) or not isinstance(policy, nn.Module):
        return None
    digest = hashlib.sha256()
    for name, tensor in policy.state_dict().items():
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()
