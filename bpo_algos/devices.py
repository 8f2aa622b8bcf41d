"""Where and in which precision the policy computes (``TrainerConfig.device`` / ``precision``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import torch

from bpo_algos import data_parallel as dp
from bpo_algos.policy.base import Policy


def policy_device(policy: Policy) -> torch.device:
    """Where ``policy`` computes: its ``device`` attribute, else its first parameter's device,
    else the CPU."""
    if policy.device is not None:
        return torch.device(policy.device)
    if isinstance(policy, torch.nn.Module):
        for p in policy.parameters():
            return p.device
    return torch.device("cpu")


def resolve_device(name: str, policy: Policy) -> torch.device:
    """The device ``TrainerConfig.device`` names for ``policy`` (see :class:`TrainerConfig`)."""
    if name == "auto":
        return policy_device(policy)
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"device={name!r} but CUDA is not available (torch.cuda.is_available() is False)")
    if name == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) if dp.is_distributed() else torch.cuda.current_device())
    return torch.device(name)


def upcast_trainable(parameters: Sequence[torch.nn.Parameter]) -> int:
    """Hold trainable parameters in fp32 (master weights), in place; returns how many changed.

    A bf16 weight ``w`` cannot move by less than about ``|w| / 256``: an lr-1e-6 step leaves most
    weights unchanged. In fp32 the step lands, and autocast still runs the matmuls in bf16."""
    changed = 0
    for p in parameters:
        if p.dtype in (torch.bfloat16, torch.float16):
            p.data = p.data.float()
            changed += 1
    return changed


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bfloat16 autocast for ``precision="bf16"``, else nothing."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
