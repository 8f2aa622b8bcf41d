"""Data-parallel training over ``torch.distributed`` (gloo on CPU, NCCL on GPUs).

Launched by ``torchrun --nproc_per_node=N`` (or ``accelerate launch``), every rank runs the same
:class:`~bpo_algos.trainer.Trainer` code; what makes them one training run:

* **Trees split, each its own random stream.** Every rank draws the same tasks (same seed);
  tree ``i`` of an update is built by rank ``i mod N`` from the stream keyed by
  ``(seed, update, i)`` (:mod:`bpo_algos.rollout`), the rule one process follows too, so a
  tree is the same whichever rank builds it and however many trees are in flight.
* **One gradient.** Each rank back-propagates its trees' loss divided by the *global*
  normaliser (the sum of every rank's :meth:`~bpo_algos.algorithm.Algorithm.loss_normaliser`),
  then :func:`all_reduce_gradients` sums the gradients: the result is the one-process
  gradient of the whole batch (up to float summation order).
* **Global meters.** Compute meters and per-tree statistics are all-reduced/gathered, so the
  logged row and the budget are those of the whole batch; checkpoints and logs come from rank 0.
* **FSDP** (``TrainerConfig(fsdp=True)``) when the model does not fit one GPU:
  :func:`shard_model` shards ``policy.model`` with FSDP2 (``fully_shard`` per decoder layer, then
  the whole model). A sharded forward is a collective and ranks run different numbers of
  forwards while collecting, so the Trainer gathers the full weights (:func:`unshard`, every
  rank at the same point) before collection and keeps them through the update, like verl's
  hybrid engine: rollouts and micro-batch forwards then issue no collectives (checked with
  FSDP2 on gloo: ranks with 3 and 1 forwards do not wait for each other). The only collectives
  of the update are the gradient reduce-scatters of each backward, one per layer: every
  micro-batch is exactly one forward (at most the policy's ``train_batch_size`` steps; more
  raises), and a rank with fewer micro-batches than the most (:func:`all_reduce_max`) runs
  zero-weighted one-token passes, so all ranks issue the same reduce-scatters in the same order.
  FSDP sums them (divide factor 1, sum-only collectives: gloo has no pre-multiplied sum), with
  each rank's loss divided by the global normaliser, in place of :func:`all_reduce_gradients`;
  :func:`reshard` then registers the sharded parameters for the norm
  (:func:`sharded_gradient_norm`: squares of the DTensor shards summed over ranks), clipping
  and the optimizer step. Memory per rank: the full weights (fp32, or bf16 with
  ``precision="bf16"``) from collection to the end of the update, plus shards of the fp32
  master weights, gradients and optimizer state, plus one layer's full gradient in flight.
  Checkpoints hold the full state dicts (:func:`full_state_dicts`, gathered to rank 0; the
  weights' keys are those of the unsharded policy), loaded back into the shards on resume. With
  a KL term the frozen reference is copied before sharding (a full replicated copy; LoRA needs
  none). Two FSDP ranks give the parameters of one process after 3 updates, full fine-tune and
  LoRA (float64: ~1e-16), also across a resume. The gradient-variance probe
  (``diagnostics.gradient_samples``) refuses a sharded policy.

Where it sits: on one process the loss path is ``Trainer -> Algorithm`` and nothing here runs
(:meth:`bpo_algos.trainer.Trainer.optimize`). Only on several ranks does the Trainer build a
:class:`DataParallel`, a layer *around* the algorithm's loss: it asks the algorithm for its
normaliser, all-reduces it, calls :meth:`~bpo_algos.algorithm.Algorithm.backward` with it, then
sums the gradients (``Trainer -> DataParallel -> Algorithm``, then back in ``DataParallel`` for
the reduce); the algorithm never calls into this module.

Nothing here starts a process group by itself except :func:`init_from_env`, which does so only
when ``WORLD_SIZE`` > 1 is set by a launcher.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bpo_algos.algorithm import Algorithm, Batch
from bpo_algos.compute import ComputeMeter
from bpo_algos.losses import gradient_norm  # (also reachable here, where it used to live)
from bpo_algos.policy.base import Policy

log = logging.getLogger(__name__)


def init_from_env(backend: str | None = None) -> bool:
    """Join the process group a launcher describes (``WORLD_SIZE``/``RANK``/``MASTER_ADDR``).

    Returns True when this process is one of several ranks. ``backend`` defaults to NCCL when
    CUDA is available, else gloo. Under NCCL, each rank uses GPU ``LOCAL_RANK``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() > 1
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend)
    # a group still alive at interpreter exit can abort the process from gloo's threads
    # ("terminate called without an active exception") after the work is done
    atexit.register(_leave_process_group)
    log.info("rank %d of %d joined the %s process group", dist.get_rank(), dist.get_world_size(), backend)
    return dist.get_world_size() > 1


def _leave_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # no rank leaves while another still talks to it
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def _comm_device() -> torch.device:
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def update_seed(seed: int, update: int) -> int:
    """The batch seed of update ``update`` of a run seeded ``seed``: with a tree's index, the key
    of the tree's random stream (the same whichever rank builds it)."""
    return int(np.random.SeedSequence([int(seed), int(update)]).generate_state(1)[0])


def shard_indices(n: int, rank_: int | None = None, world: int | None = None) -> list[int]:
    """The items ``i < n`` this rank builds: ``i mod world == rank`` (round robin)."""
    r = rank() if rank_ is None else rank_
    w = world_size() if world is None else world
    return [i for i in range(n) if i % w == r]


def all_reduce_sum(values: Sequence[float]) -> list[float]:
    """Element-wise sum over ranks (float64); the input itself on one process."""
    if not is_distributed():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu().tolist()


def all_reduce_max(value: int) -> int:
    """The largest ``value`` over ranks (the input itself on one process)."""
    if not is_distributed():
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (``[obj]`` on one process)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def check_same_parameters(parameters: Sequence[torch.nn.Parameter]) -> None:
    """Raise unless every rank trains the same number of parameter elements (gradients of
    different shapes cannot be summed: a policy that grows entries while collecting, like
    ``TabularPolicy``, cannot train data-parallel)."""
    if not is_distributed():
        return
    counts = all_gather_objects([int(p.numel()) for p in parameters])
    if any(c != counts[0] for c in counts):
        raise RuntimeError(
            "data-parallel ranks hold different trainable parameters "
            f"(element counts per rank: {[sum(c) for c in counts]}); a policy that creates "
            "parameters while collecting (TabularPolicy) cannot be trained data-parallel"
        )


def all_reduce_gradients(parameters: Sequence[torch.nn.Parameter], bucket_elements: int = 1 << 24) -> None:
    """Sum ``.grad`` over ranks in place, in flat buckets of at most ``bucket_elements`` (float32,
    float64 when a parameter is).

    A parameter with no gradient on one rank contributes zeros (it must still be summed: another
    rank may have one)."""
    if not is_distributed():
        return
    device = _comm_device()
    bucket: list[torch.nn.Parameter] = []
    size = 0

    def flush() -> None:
        nonlocal bucket, size
        if not bucket:
            return
        dtype = torch.float64 if any(p.dtype == torch.float64 for p in bucket) else torch.float32
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).to(device, dtype) for p in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in bucket:
            n = p.numel()
            chunk = flat[offset : offset + n].view_as(p).to(p.device, p.dtype)
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)
            offset += n
        bucket, size = [], 0

    for p in parameters:
        if size + p.numel() > bucket_elements:
            flush()
        bucket.append(p)
        size += p.numel()
    flush()


def broadcast_parameters(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (the same start everywhere)."""
    if not is_distributed():
        return
    device = _comm_device()
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            buf = t.detach().to(device).clone()
            dist.broadcast(buf, src=src)
            t.copy_(buf.to(t.device))


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The first ``ModuleList`` named ``layers`` (a transformer's decoder blocks; also under a
    LoRA wrapper), else none."""
    for name, module in model.named_modules():
        if name.split(".")[-1] == "layers" and isinstance(module, torch.nn.ModuleList):
            return list(module)
    return []


def shard_model(model: torch.nn.Module, mixed_precision: torch.dtype | None = torch.bfloat16) -> torch.nn.Module:
    """Shard ``model`` over the ranks with FSDP2 (``fully_shard``): each decoder layer, then the
    whole model. Parameters stay in their dtype (fp32 master weights); ``mixed_precision`` is
    the dtype of the gathered (unsharded) weights and of the compute, gradients are reduced in
    fp32. Use it when weights + gradients + optimizer state do not fit one GPU
    (``bpo-memory-plan`` says when).

    Gradients are reduced as a *sum* over ranks (divide factor 1, sum-only collectives, which
    gloo needs: it has no pre-multiplied sum): the Trainer divides each rank's loss by the
    global normaliser itself. Parameters are set to stay gathered after a forward and a
    backward (:func:`unshard` gathers them, :func:`reshard` frees them), so forwards issue no
    collectives (module docstring)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=mixed_precision, reduce_dtype=torch.float32) if mixed_precision else MixedPrecisionPolicy()
    for layer in _decoder_layers(model):
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    assert isinstance(model, FSDPModule)
    model.set_reshard_after_forward(False)
    model.set_reshard_after_backward(False)
    model.set_reduce_scatter_unused_params(True)  # every rank reduces the same tensors
    for module in fsdp_modules(model):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    return model


def fsdp_modules(model: torch.nn.Module) -> list[Any]:
    """The FSDP2-sharded modules inside ``model`` (outermost first)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds FSDP2-sharded modules."""
    return bool(fsdp_modules(model))


def unshard(model: torch.nn.Module) -> None:
    """Gather every sharded module's full weights (a collective: every rank calls it at the same
    point); a no-op for modules already gathered. Until :func:`reshard`, forwards and
    backwards run on the full weights without collectives, except the gradient reduce-scatter
    of a backward (see :func:`shard_model`)."""
    for module in fsdp_modules(model):
        module.unshard()


def reshard(model: torch.nn.Module) -> None:
    """Free the gathered weights; the sharded ones are registered again (what the optimizer
    updates and the checkpoint saves)."""
    for module in fsdp_modules(model):
        module.reshard()


def is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def sharded_gradient_norm(parameters: Sequence[torch.nn.Parameter]) -> float:
    """The L2 norm of the whole gradient when some gradients are FSDP shards (DTensors, each
    element on exactly one rank: squares summed over ranks) and the rest are plain tensors
    already equal on every rank (counted once). A collective."""
    sharded = 0.0
    plain = 0.0
    for p in parameters:
        if p.grad is None:
            continue
        if is_dtensor(p.grad):
            sharded += float(p.grad.to_local().detach().double().pow(2).sum())
        else:
            plain += float(p.grad.detach().double().pow(2).sum())
    (sharded,) = all_reduce_sum([sharded])
    return float((sharded + plain) ** 0.5)


def clip_gradients_(parameters: Sequence[torch.nn.Parameter], max_norm: float, norm: float) -> None:
    """Scale every gradient by ``min(1, max_norm / (norm + 1e-6))`` in place (what
    ``torch.nn.utils.clip_grad_norm_`` does, with the global ``norm`` given)."""
    coef = min(1.0, max_norm / (norm + 1e-6))
    if coef < 1.0:
        for p in parameters:
            if p.grad is not None:
                p.grad.mul_(coef)


def full_state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """The unsharded model and optimizer state dicts (keys as of the unsharded model), on the
    CPU of rank 0; empty elsewhere. A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def load_full_state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any], optim_state: dict[str, Any]) -> None:
    """Load :func:`full_state_dicts`' output on every rank (each keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    if optim_state.get("state"):
        set_optimizer_state_dict(model, optimizer, optim_state, options=options)
        return
    # a stateless optimizer (SGD without momentum): torch's loader finds no tensor to place
    # ("Expected device to be set"); the hyperparameters are all there is to restore
    groups = optim_state.get("param_groups", [])
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(f"the checkpoint has {len(groups)} optimizer parameter groups, the optimizer {len(optimizer.param_groups)}")
    for saved, group in zip(groups, optimizer.param_groups, strict=True):
        group.update({k: v for k, v in saved.items() if k != "params"})


class DataParallel:
    """This rank's part in a training run of ``N > 1`` ranks (``N`` FSDP ranks with ``fsdp``).

    A layer around the algorithm's loss, built by the :class:`~bpo_algos.trainer.Trainer` only
    when a launcher started several ranks (one process never builds one): :meth:`gradient` is the
    whole batch's gradient from this rank's trees (global normaliser, summed gradients, norm and
    clipping), and the global meters are the whole batch's (see the module docstring).
    """

    def __init__(self, policy: Policy, algorithm: Algorithm, *, fsdp: bool, precision: str, device: torch.device) -> None:
        init_from_env()
        self.rank, self.world_size = rank(), world_size()
        if self.world_size < 2:
            raise ValueError("DataParallel is for several ranks; one process trains Trainer -> Algorithm directly")
        self.policy = policy
        self.algorithm = algorithm
        self.device = device
        broadcast_parameters(policy)  # rank 0's initial weights everywhere, then shards
        self.fsdp = self._shard(fsdp, precision)

    # ---- FSDP ----------------------------------------------------------------------------
    def _shard(self, wanted: bool, precision: str) -> bool:
        """Shard ``policy.model`` when ``fsdp=True`` on several ranks (``TrainerConfig.fsdp``)."""
        if not wanted:
            return False
        model = self.policy.shardable_model()
        if model is None:
            raise TypeError(f"fsdp=True shards a transformers model; {type(self.policy).__name__} has none (Policy.shardable_model)")
        if self.algorithm.shared.kl_coef:
            # the frozen reference is copied before sharding: a plain replicated copy whose
            # forwards are no collectives (LoRA needs none: its base model is the reference)
            self.policy.set_reference()
        shard_model(model, mixed_precision=torch.bfloat16 if precision == "bf16" else None)
        # a micro-batch must be exactly one forward pass through the sharded model on every rank
        # (its backward is one reduce-scatter per layer): at most the rows of one forward
        self._fsdp_steps = self.policy.train_batch_size
        self._forwards = 0
        self._counting = False
        model.register_forward_pre_hook(self._count_forward)
        return True

    def _count_forward(self, module: torch.nn.Module, args: Any) -> None:
        if not (self._counting and torch.is_grad_enabled()):
            return
        self._forwards += 1
        if self._forwards > 1:
            raise RuntimeError(
                f"fsdp=True: one micro-batch ran more than one forward pass through the sharded model "
                f"({type(self.policy).__name__} splits a micro-batch of <= {self._fsdp_steps} steps); "
                "ranks would issue different numbers of gradient reduce-scatters"
            )

    def _new_micro_batch(self) -> None:
        self._forwards = 0

    def _zero_pass(self) -> None:
        """One forward/backward of a one-token input with zero weight: this rank's share of a
        micro-batch another rank has and it has not (the same collectives, no gradient)."""
        self._new_micro_batch()
        model = self.policy.model
        out = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.device), use_cache=False)
        logits = out.logits if hasattr(out, "logits") else out[0]  # third-party: a transformers output object, or a tuple
        (logits.float().sum() * 0.0).backward()

    def gather_weights(self) -> None:
        """Under FSDP, the full weights for rollouts and micro-batches (their forwards are local)."""
        if self.fsdp:
            unshard(self.policy)

    def shard_weights(self) -> None:
        """Under FSDP, the sharded parameters (and their gradients) again, after a backward."""
        if self.fsdp:
            reshard(self.policy)

    def clear_cache(self) -> None:
        """Under FSDP, drop the policy's prompt KV of the old weights."""
        if self.fsdp:
            self.policy.clear_cache()

    # ---- the batch's share and its gradient ----------------------------------------------
    def gradient(
        self,
        batch: Batch,
        micro_batch_tokens: int | None,
        max_grad_norm: float | None,
        parameters: Callable[[], list[torch.nn.Parameter]],
        compute_context: Callable[[], AbstractContextManager[Any]],
    ) -> tuple[float, float]:
        """The whole batch's gradient in every rank's ``.grad``, from this rank's trees:
        :meth:`backward` (inside ``compute_context()``, the Trainer's autocast), then
        :meth:`reduce` over ``parameters()`` (read after the backward: under FSDP the sharded
        parameters are registered again only then). Returns ``(loss, gradient norm before
        clipping)``, both the whole batch's."""
        self.gather_weights()  # (re)gathered after the previous epoch's step
        with compute_context():
            loss = self.backward(batch, micro_batch_tokens)
        self.shard_weights()
        return self.reduce(parameters(), loss, max_grad_norm)

    def backward(self, batch: Batch, micro_batch_tokens: int | None) -> float:
        """Accumulate this rank's share of the whole batch's gradient; returns its loss.

        Every micro-batch is divided by the global normaliser (the sum over ranks of
        :meth:`~bpo_algos.algorithm.Algorithm.loss_normaliser`), and under FSDP zero passes run
        up to the largest micro-batch count over ranks."""
        algorithm = self.algorithm
        z_local = algorithm.loss_normaliser(batch) if batch.steps else 0.0
        z, n_trees = all_reduce_sum([z_local, float(batch.n_trees)])
        if algorithm.shared.aggregation == "step-sum":
            z = n_trees
        if not self.fsdp:
            if not batch.steps:
                return 0.0
            return algorithm.backward(self.policy, batch, micro_batch_tokens=micro_batch_tokens, normaliser=z)
        groups = batch.micro_batches(micro_batch_tokens, self._fsdp_steps) if batch.steps else []
        most = all_reduce_max(len(groups))
        loss_value = 0.0
        self._counting = True
        try:
            if batch.steps:
                loss_value = algorithm.backward(
                    self.policy, batch, micro_batch_tokens=micro_batch_tokens, micro_batch_steps=self._fsdp_steps,
                    normaliser=z, before_micro_batch=self._new_micro_batch,
                )
            for _ in range(most - len(groups)):
                self._zero_pass()
        finally:
            self._counting = False
        return loss_value

    def reduce(self, params: Sequence[torch.nn.Parameter], loss_value: float, max_grad_norm: float | None) -> tuple[float, float]:
        """Sum gradients and loss over ranks, then the norm (before clipping) and clipping (under
        FSDP after :meth:`shard_weights`).

        Returns ``(loss, gradient norm)``; both are the whole batch's on every rank."""
        if self.fsdp:
            # sharded gradients are summed by FSDP; any other trainable tensor here
            all_reduce_gradients([p for p in params if not is_dtensor(p)])
            (loss_value,) = all_reduce_sum([loss_value])
            norm = sharded_gradient_norm(params)
            if max_grad_norm is not None:
                clip_gradients_(params, max_grad_norm, norm)
            return loss_value, norm
        check_same_parameters(params)
        all_reduce_gradients(params)
        (loss_value,) = all_reduce_sum([loss_value])
        norm = gradient_norm(params)
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        return loss_value, norm

    # ---- global meters -------------------------------------------------------------------
    def global_compute(self, meter: ComputeMeter) -> ComputeMeter:
        """The batch meter summed over ranks."""
        names = [f.name for f in dataclasses.fields(meter)]
        summed = all_reduce_sum([getattr(meter, n) for n in names])
        return type(meter)(**{n: (int(v) if isinstance(getattr(meter, n), int) else v) for n, v in zip(names, summed, strict=True)})

    @staticmethod
    def global_row(batch: Batch, compute: ComputeMeter) -> dict[str, Any]:
        """A logged row's batch statistics over every rank's trees (means over trees and steps)."""
        success = sum(t.success_rate() for t in batch.trees)
        returns = sum(t.mean_return() for t in batch.trees)
        neg_lp = sum(-e.action.logprob for e in batch.steps)
        ent = sum(batch.entropies)
        n_trees, n_steps, s, r, lp, e_sum, n_ent = all_reduce_sum(
            [batch.n_trees, len(batch.steps), success, returns, neg_lp, ent, len(batch.entropies)]
        )
        return {
            "success": s / max(n_trees, 1),
            "return": r / max(n_trees, 1),
            "entropy": lp / n_steps if n_steps else 0.0,
            "decision_entropy": e_sum / n_ent if n_ent else None,
            "n_trees": int(n_trees),
            "n_steps": int(n_steps),
            "compute": compute.to_dict(),
        }

    def global_entropies(self, per_tree: list[tuple[int, list[float]]]) -> list[float]:
        """Every rank's decision entropies, ordered by tree index (for adaptive state)."""
        per_tree = [item for part in all_gather_objects(per_tree) for item in part]
        return [e for _, es in sorted(per_tree, key=lambda t: t[0]) for e in es]

