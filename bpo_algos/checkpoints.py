"""Checkpoints of a :class:`~bpo_algos.trainer.Trainer` run (the ``trainer`` argument of the
functions here), written atomically.

``checkpoint.pt`` holds everything a killed run needs to resume losing at most the update in
progress: the policy and optimizer state (under FSDP the full state, gathered to rank 0), the
algorithm's state (e.g. BPO's adaptive threshold and the budget's tree-cost estimate), the
trainer's, policy's and torch's RNG states, the metrics so far, the compute total and the
configuration.

A checkpoint that does not load (truncated by a crash, a pickle of someone else's, any bytes
``torch.load(weights_only=True)`` refuses) raises :class:`CheckpointUnreadableError` naming the
file before anything of the trainer is changed: a resuming trainer then redoes its run from the
start with a warning (docs/main-job.md), as a bad ``policy.pt`` is redone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from bpo_algos import data_parallel as dp
from bpo_algos.compute import Budget, ComputeMeter


def atomic_write(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """Write ``path`` through a temporary file, flushed and renamed: never half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def policy_state_dict(trainer: Any) -> dict[str, Any]:
    """The policy's full state dict (under FSDP gathered to rank 0, empty on the other ranks;
    every rank must call it)."""
    if trainer.fsdp:
        return dp.full_state_dicts(trainer.policy, trainer.optimizer)[0]
    return trainer.policy.state_dict()


def save_checkpoint(trainer: Any, path: str | os.PathLike[str]) -> None:
    """Write everything needed to resume ``trainer``, atomically (under FSDP every rank calls
    it: the state is gathered to rank 0, which writes)."""
    if trainer.fsdp:
        policy_state, optimizer_state = dp.full_state_dicts(trainer.policy, trainer.optimizer)
        if trainer.rank != 0:
            return
    else:
        policy_state, optimizer_state = trainer.policy.state_dict(), trainer.optimizer.state_dict()
    policy = trainer.policy
    state = {
        "update": trainer.update,
        "algorithm_name": trainer.algorithm.name,
        "fsdp": trainer.fsdp,
        "policy": policy_state,
        "optimizer": optimizer_state,
        "algorithm": trainer.algorithm.state_dict(),
        "trainer_rng": trainer._rng.bit_generator.state,
        "task_walk": {"order": list(trainer._task_order), "cursor": trainer._task_cursor},
        "policy_rng": policy.rng_state(),
        "torch_rng": torch.get_rng_state(),
        "history": trainer.history,
        "total_compute": trainer.total_compute.to_dict(),
        "config": {k: (v.to_dict() if isinstance(v, Budget) else v) for k, v in vars(trainer.config).items() if k != "out_dir"},
    }
    atomic_write(Path(path), lambda fh: torch.save(state, fh))


class CheckpointUnreadableError(ValueError):
    """A checkpoint file that does not load (truncated, or not a checkpoint); the message names it."""


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state saved in ``path`` (tensors and plain data only: loading runs no code);
    :class:`CheckpointUnreadableError` naming the file for anything that does not load as one."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise  # not the file's bytes: nothing to redo
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for bad bytes (pickle, zip, EOF)
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointUnreadableError(f"{path} does not load as a checkpoint ({type(exc).__name__}: {why[:300]})") from None
    if not isinstance(state, dict) or "update" not in state:
        raise CheckpointUnreadableError(f"{path} does not load as a checkpoint (it holds no trainer state)")
    return state


def load_checkpoint(trainer: Any, path: str | os.PathLike[str]) -> None:
    """Restore ``trainer`` from a checkpoint written by :func:`save_checkpoint`
    (:class:`CheckpointUnreadableError` before anything changes when it does not load)."""
    state = read_checkpoint(path)
    if state.get("algorithm_name") != trainer.algorithm.name:
        raise ValueError(
            f"{path} is a checkpoint of {state.get('algorithm_name')!r}, not of "
            f"{trainer.algorithm.name!r}: use another out_dir or resume=False"
        )
    if bool(state.get("fsdp", False)) != trainer.fsdp:
        raise ValueError(
            f"{path} was written {'with' if state.get('fsdp') else 'without'} FSDP sharding and this "
            f"run is {'sharded' if trainer.fsdp else 'not sharded'}: their optimizer states differ in "
            "form; resume with the same fsdp setting and number of ranks > 1, or resume=False"
        )
    if trainer.fsdp:
        trainer.optimizer = trainer.make_optimizer()
        dp.load_full_state_dicts(trainer.policy, trainer.optimizer, state["policy"], state["optimizer"])
    else:
        trainer.policy.load_state_dict(state["policy"])  # first: a tabular policy grows entries here
        trainer.optimizer = trainer.make_optimizer()
        trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.algorithm.load_state_dict(state["algorithm"])
    trainer._rng.bit_generator.state = state["trainer_rng"]
    walk = state.get("task_walk") or {"order": [], "cursor": 0}  # absent in checkpoints before task_draw
    trainer._task_order, trainer._task_cursor = [int(i) for i in walk["order"]], int(walk["cursor"])
    if state["policy_rng"] is not None:
        trainer.policy.set_rng_state(state["policy_rng"])
    torch.set_rng_state(state["torch_rng"])
    trainer.update = state["update"]
    trainer.history = list(state["history"])
    trainer.total_compute = ComputeMeter.from_dict(state["total_compute"])
    trainer.log.rewrite(trainer.history)  # rows logged after the checkpoint are redone
