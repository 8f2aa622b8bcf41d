"""``Algorithm``: collect rollout trees through the shared engine, then a shared loss.

An algorithm is a topology (where trees branch) plus an advantage estimator; collection,
compute metering, weights (rule 3) and the loss are the same code for BPO, GRPO and RLOO, so a
comparison at matched compute differs only in what the algorithms are meant to differ in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch

from bpo_algos.advantages import as_batch, estimate_advantages
from bpo_algos.compute import COMPUTE_UNITS, Budget, ComputeMeter
from bpo_algos.losses import AGGREGATIONS, loss_normaliser, policy_loss
from bpo_algos.policy.base import Policy, action_mask, pad_token_rows
from bpo_algos.rollout import (
    EngineResult,
    EngineRun,
    EnvFn,
    EnvPool,
    RolloutEngine,
    Topology,
    run_together,
)
from bpo_algos.tree import Edge, RolloutTree
from bpo_envs.validation import check_count


@dataclass
class Batch:
    """The trees of one collection, their compute, and the flattened steps for the loss."""

    algorithm: str
    trees: list[RolloutTree]
    compute: ComputeMeter
    entropies: list[float] = field(default_factory=list)
    """Decision entropies computed during collection (for adaptive thresholds and logs)."""
    steps: list[Edge] = field(default_factory=list)
    tree_index: list[int] = field(default_factory=list)
    ref_logprobs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not self.steps:
            for i, tree in enumerate(self.trees):
                for edge in tree.edges():
                    self.steps.append(edge)
                    self.tree_index.append(i)

    @property
    def n_trees(self) -> int:
        return len(self.trees)

    def success_rate(self) -> float:
        """Mean over trees of the weighted success (unbiased for the collecting policy)."""
        return float(np.mean([t.success_rate() for t in self.trees])) if self.trees else 0.0

    def mean_return(self) -> float:
        return float(np.mean([t.mean_return() for t in self.trees])) if self.trees else 0.0

    def weights(self) -> torch.Tensor:
        return torch.tensor([e.weight for e in self.steps], dtype=torch.float32)

    def advantages(self) -> torch.Tensor:
        return torch.tensor([e.advantage for e in self.steps], dtype=torch.float32)

    def old_logprobs(self) -> torch.Tensor:
        """``[n_steps, max_len]`` float32 sampling log-probs, zero-padded (:func:`pad_token_rows`)."""
        rows = [e.action.logprobs for e in self.steps]
        if rows and all(len(r) == len(rows[0]) for r in rows):
            # rows of one length (a choice policy's: one token each) in one conversion: the same
            # float32 values as a tensor per row, stacked
            return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), len(rows[0]))
        return pad_token_rows([torch.tensor(r, dtype=torch.float32) for r in rows])

    def mask(self) -> torch.Tensor:
        return action_mask(self.steps)

    def shape_stats(self) -> dict[str, float]:
        """How the batch branched, averaged over its trees.

        ``branch_points_per_tree`` (inner branch nodes, :attr:`RolloutTree.branch_points`),
        ``leaves_per_tree``, ``branch_depth_mean`` (mean depth of the inner branch nodes; None
        when there are none) and ``steps_scored`` (decision entropies computed in the batch).
        """
        n = max(len(self.trees), 1)
        depths = [node.depth for t in self.trees for node in t.branch_nodes() if node is not t.root]
        return {
            "branch_points_per_tree": sum(t.branch_points for t in self.trees) / n,
            "leaves_per_tree": sum(len(t.leaf_edges()) for t in self.trees) / n,
            "branch_depth_mean": float(np.mean(depths)) if depths else None,
            "steps_scored": len(self.entropies),
        }

    def subset(self, indices: Sequence[int]) -> Batch:
        """The steps at ``indices`` as a batch over the same trees (a micro-batch of this one)."""
        idx = list(indices)
        ref = None
        if self.ref_logprobs is not None:
            width = max((len(self.steps[i].action.token_ids) for i in idx), default=0)
            ref = self.ref_logprobs[idx, :width]
        return Batch(
            self.algorithm,
            self.trees,
            self.compute,
            self.entropies,
            steps=[self.steps[i] for i in idx],
            tree_index=[self.tree_index[i] for i in idx],
            ref_logprobs=ref,
        )

    def micro_batches(self, max_tokens: int | None, max_steps: int | None = None) -> list[list[int]]:
        """Consecutive step indices in groups of at most ``max_tokens`` tokens (prompt + action)
        and at most ``max_steps`` steps each; a step longer than ``max_tokens`` is a group of its
        own. Both None: one group of every step."""
        if max_tokens is None and max_steps is None:
            return [list(range(len(self.steps)))] if self.steps else []
        groups: list[list[int]] = []
        current: list[int] = []
        used = 0
        for i, step in enumerate(self.steps):
            cost = step_tokens(step)
            over_tokens = max_tokens is not None and used + cost > max_tokens
            over_steps = max_steps is not None and len(current) >= max_steps
            if current and (over_tokens or over_steps):
                groups.append(current)
                current, used = [], 0
            current.append(i)
            used += cost
        if current:
            groups.append(current)
        return groups

    def sampled_entropy(self) -> float:
        """Mean ``-log pi(a|h)`` of the sampled actions: a Monte Carlo estimate of the entropy."""
        if not self.steps:
            return 0.0
        return float(np.mean([-e.action.logprob for e in self.steps]))


def merge_batches(parts: Sequence[Batch]) -> Batch:
    """One batch of the trees of ``parts`` in order (compute added, ref log-probs stacked)."""
    if not parts:
        raise ValueError("nothing to merge")
    compute = ComputeMeter()
    trees: list[RolloutTree] = []
    entropies: list[float] = []
    for part in parts:
        compute.add(part.compute)
        trees.extend(part.trees)
        entropies.extend(part.entropies)
    merged = Batch(parts[0].algorithm, trees, compute, entropies)
    refs = [p.ref_logprobs for p in parts if p.ref_logprobs is not None]
    if refs:
        width = max(r.shape[1] for r in refs)
        merged.ref_logprobs = torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1])) for r in refs])
    return merged


def step_tokens(step: Edge) -> int:
    """Tokens a training forward pass of ``step`` runs: its prompt and its action."""
    return len(step.action.prompt_token_ids) + len(step.action.token_ids)


@dataclass
class Options:
    """Base of every algorithm's option dataclass: documented fields, ``to_dict`` = ``asdict``.

    A subclass declares its fields with defaults and a docstring under each (``bpo-compare``
    turns every field into a flag with that docstring as its help) and checks them in
    ``__post_init__``.
    """

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass
class AlgorithmConfig(Options):
    """The options every algorithm shares: the loss and how many trees are in flight."""

    clip_eps: float = 0.2
    """PPO clip range (the low side; also the high side unless ``clip_eps_high``)."""
    clip_eps_high: float | None = None
    """High side of the clip range (DAPO's clip-higher); None: ``clip_eps``."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the reference policy (0: no KL, no reference pass)."""
    aggregation: str = "token-mean"
    """How the loss sums over tokens: ``token-mean``, ``seq-mean-token-mean`` or ``step-sum``."""
    max_parallel_trees: int | None = None
    """Trees in flight at once (None: the env pool size)."""

    def __post_init__(self) -> None:
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.clip_eps_high is not None and not self.clip_eps_high > 0:
            raise ValueError(f"clip_eps_high must be > 0, got {self.clip_eps_high}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.max_parallel_trees is not None:
            check_count("max_parallel_trees", self.max_parallel_trees, 1)


@dataclass
class NoOptions(Options):
    """An algorithm with no options of its own."""


class Algorithm(Topology):
    """Base class: topology (:class:`~bpo_algos.rollout.Topology`) + advantage estimator;
    shared collection and loss.

    Every algorithm is built the same way: keyword options, which are the fields of the shared
    :class:`AlgorithmConfig` (``clip_eps``, ``clip_eps_high``, ``kl_coef``, ``aggregation``,
    ``max_parallel_trees``) and of the algorithm's own :attr:`Options` dataclass, or those
    dataclasses themselves (``options=``, ``shared=``), plus ``seed`` (the engine's reset seeds
    and the algorithm's own randomness). ``algorithm.options.backbones`` reads an option of
    its own, ``algorithm.shared.kl_coef`` a shared one; :meth:`config` is every option as a dict.
    """

    name = "algorithm"
    Options: type[Options] = NoOptions
    """The dataclass of this algorithm's own options."""
    unbiased: bool = True
    """Whether the expected gradient estimate is the policy gradient (docs/unbiasedness.md); the
    main job compares a biased estimator's mean gradient with an unbiased reference."""
    budget_multiple: float = 1.0
    """The multiple of the comparison's per-update budget this algorithm collects with (the main
    job's calibration control ``rloo-2x``: 2; every real algorithm: 1)."""
    threshold: float | None = None
    """The decision-entropy threshold the topology branches at now (logged per update); None:
    the algorithm has none."""
    zero_loss: bool = False
    """Whether the loss is exactly zero on every batch by construction, and so its gradient
    (the positive control ``frozen``: every advantage zero and no KL term). Where it is and a
    step at a zero gradient leaves the weights as they are, a trainer asked to may skip the
    collection of every update after one it has checked (``Trainer.train``'s
    ``skip_zero_loss_collection``); every learner: False."""

    def __init__(self, options: Options | None = None, *, shared: AlgorithmConfig | None = None, seed: int = 0, **kwargs: Any) -> None:
        if options is not None and not isinstance(options, self.Options):
            raise TypeError(f"{type(self).__name__} takes its options by name, or options={self.Options.__name__}(...); got {options!r}")
        own = {k: kwargs.pop(k) for k in self.Options.field_names() if k in kwargs}
        common = {k: kwargs.pop(k) for k in AlgorithmConfig.field_names() if k in kwargs}
        if kwargs:
            known = sorted({*self.Options.field_names(), *AlgorithmConfig.field_names(), "seed"})
            raise TypeError(f"{type(self).__name__} got unknown option(s) {sorted(kwargs)}; its options: {', '.join(known)}")
        self.options = replace(options, **own) if options is not None else self.Options(**own)
        self.shared = replace(shared, **common) if shared is not None else AlgorithmConfig(**common)
        self.seed = int(seed)
        self._rng = np.random.default_rng(seed)
        self.last_loss_stats: dict[str, float] = {}
        self._tree_costs: dict[str, list[float]] = {}
        """Per-tree cost of the last batch in every unit (the budget's estimate for the next)."""

    # ---- topology: the engine's hooks are those of Topology (defaults: no branching) --------
    def finish_trees(self, trees: list[RolloutTree]) -> None:
        """The topology's last step on the collected trees, before the advantages (Tree-GRPO
        keeps ``k`` leaves per tree); by default nothing."""

    # ---- estimator -----------------------------------------------------------------------
    def estimator(self, trees: Sequence[RolloutTree]) -> tuple[str, dict[str, Any]]:
        """``(name, options)``: the registered estimator (:mod:`bpo_algos.advantages`) that
        scores this batch of ``trees``, and its keyword options (state from earlier batches
        included). Every algorithm names its estimator here and only here."""
        raise NotImplementedError(f"{type(self).__name__} names no estimator")

    def compute_advantages(self, trees: RolloutTree | Sequence[RolloutTree]) -> None:
        """Write ``edge.advantage`` for every edge of the batch's finalized ``trees``."""
        trees = as_batch(trees)
        name, options = self.estimator(trees)
        estimate_advantages(name, trees, **options)

    def end_batch(self, batch: Batch) -> None:
        """Hook after a batch is collected (adaptive state uses only earlier batches)."""

    # ---- collect / loss ------------------------------------------------------------------
    def collect(
        self,
        policy: Policy,
        env_fns: Sequence[EnvFn] | EnvPool,
        tasks: Sequence[Any],
        budget: Budget | dict[str, Any] | tuple[str, float] | None = None,
        *,
        seed: int | None = None,
        tree_indices: Iterable[int] | None = None,
        finish: bool = True,
    ) -> Batch:
        """Build one tree per task (tasks cycled while ``budget`` remains) and score the steps.

        Tree ``i``'s randomness is its own stream keyed by ``(seed, i)`` (:mod:`bpo_algos.rollout`;
        ``seed`` None: drawn from the algorithm's generator). ``tree_indices`` names the trees
        to build (a data-parallel rank's share: tree ``i`` on ``tasks[i % len(tasks)]``);
        ``finish=False`` skips :meth:`end_batch` (the caller runs it once on the whole, possibly
        all-gathered, batch)."""
        budget = Budget.parse(budget)  # the one place a budget is read (a Budget passes as is)
        engine_seed = int(self._rng.integers(2**31 - 1)) if seed is None else int(seed)
        pool = env_fns if isinstance(env_fns, EnvPool) else EnvPool(env_fns)
        try:
            engine = RolloutEngine(
                pool,
                max_parallel_trees=self.shared.max_parallel_trees,
                seed=engine_seed,
            )
            prior = self._tree_costs.get(budget.unit) if budget is not None else None
            result = engine.run(policy, self, tasks, budget, prior_costs=prior, tree_indices=tree_indices)
        finally:
            if not isinstance(env_fns, EnvPool):
                pool.close()
        return self._batch_of(policy, result, finish)

    def collect_together(
        self,
        policy: Policy,
        pools: Sequence[EnvPool],
        tasks: Sequence[Any],
        budget: Budget | dict[str, Any] | tuple[str, float] | None = None,
        *,
        finish: bool = True,
    ) -> list[Batch]:
        """``len(pools)`` batches, batch ``k`` on ``pools[k]``, collected in lock step
        (:func:`~bpo_algos.rollout.run_together`: one policy pass per engine step over every
        batch's deciding paths). Batch ``k`` is the batch ``collect(policy, pools[k], tasks,
        budget)`` would build as the ``k``-th of as many calls from this algorithm's state at
        the call, with every adaptive setting the collection reads held at that state: the
        engine seeds are drawn in the same order, but each batch starts its trees on the
        tree costs of the batch before the call (not of batch ``k - 1``) and branches on the
        topology's state at the call (BPO's threshold). The batches are then scored and
        finished in order, as ``collect`` would (:meth:`end_batch` after each), so the state
        after the call is that of ``len(pools)`` collections of these very batches
        (``finish=False``: no :meth:`end_batch`; the caller runs it on each, in order). Not for
        a budget in seconds (the batches share the wall time)."""
        budget = Budget.parse(budget)
        if budget is not None and budget.unit == "seconds":
            raise ValueError("collect_together cannot hold a budget in seconds: the batches share the wall time")
        prior = self._tree_costs.get(budget.unit) if budget is not None else None
        runs = [
            EngineRun(RolloutEngine(pool, max_parallel_trees=self.shared.max_parallel_trees, seed=int(self._rng.integers(2**31 - 1))),
                      self, tasks, budget, prior)
            for pool in pools
        ]
        return [self._batch_of(policy, result, finish) for result in run_together(policy, runs)]

    def _batch_of(self, policy: Policy, result: EngineResult, finish: bool) -> Batch:
        """The batch of an engine run: the topology's last step, the advantages, the reference
        log-probs (a KL) and, with ``finish``, :meth:`end_batch`."""
        if result.trees:
            self._tree_costs = {u: [float(t.compute.get(u)) for t in result.trees] for u in COMPUTE_UNITS}
        for tree in result.trees:
            tree.algorithm = self.name
        # ALGO LOGIC: the topology's last step, then the advantages (the registered estimator)
        self.finish_trees(result.trees)
        self.compute_advantages(result.trees)
        # end ALGO LOGIC
        batch = Batch(self.name, result.trees, result.compute, result.entropies)
        if self.shared.kl_coef:
            with torch.no_grad():
                batch.ref_logprobs = policy.reference_token_logprobs(batch.steps)
        if finish:
            self.end_batch(batch)
        return batch

    def loss_normaliser(self, batch: Batch) -> float:
        """This batch's share of the loss denominator (``losses.loss_normaliser``); the sum over
        micro-batches and data-parallel ranks is the whole batch's."""
        return loss_normaliser(batch.mask(), batch.weights(), self.shared.aggregation, batch.n_trees)

    def loss(self, policy: Policy, batch: Batch, *, normaliser: float | None = None) -> torch.Tensor:
        """Clipped surrogate (+ k3 KL) over ``batch``, aggregated as configured.

        Every tensor of the batch is moved to the device of the policy's log-probs.
        ``normaliser`` is the whole batch's denominator when ``batch`` is one micro-batch
        (:meth:`backward`); the statistics in ``last_loss_stats`` are those of these steps."""
        if not batch.steps:
            raise ValueError("empty batch: nothing to learn from")
        logp = policy.token_logprobs(batch.steps)
        device = logp.device
        old = batch.old_logprobs().to(device)
        mask = batch.mask().to(device)
        width = max(logp.shape[1], old.shape[1], mask.shape[1])
        logp, old, mask = (torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in (logp, old, mask))
        ref = batch.ref_logprobs
        if ref is not None:
            ref = torch.nn.functional.pad(ref.to(device), (0, width - ref.shape[1]))
        loss, stats = policy_loss(
            logp,
            old,
            batch.advantages().to(device),
            batch.weights().to(device),
            mask,
            n_trees=batch.n_trees,
            aggregation=self.shared.aggregation,
            clip_low=self.shared.clip_eps,
            clip_high=self.shared.clip_eps_high,
            ref_logp=ref,
            kl_coef=self.shared.kl_coef,
            normaliser=normaliser,
        )
        self.last_loss_stats = stats
        return loss

    def backward(
        self,
        policy: Policy,
        batch: Batch,
        *,
        micro_batch_tokens: int | None = None,
        normaliser: float | None = None,
        scale: float = 1.0,
        micro_batch_steps: int | None = None,
        before_micro_batch: Callable[[], None] | None = None,
    ) -> float:
        """Accumulate ``scale x d loss / d theta`` into ``.grad``, one micro-batch at a time.

        Each micro-batch (at most ``micro_batch_tokens`` prompt + action tokens, see
        :meth:`Batch.micro_batches`; at most ``micro_batch_steps`` steps) is scored and
        back-propagated before the next, so only one
        micro-batch's activations are alive; all are divided by one denominator ``normaliser``
        (default: this batch's, :meth:`loss_normaliser`), so the accumulated gradient is the
        one-batch gradient. ``before_micro_batch`` is called before each micro-batch is scored.
        Returns the loss value; ``last_loss_stats`` are token-weighted means over the
        micro-batches."""
        if not batch.steps:
            raise ValueError("empty batch: nothing to learn from")
        shared = type(self).loss is Algorithm.loss
        if not shared and (micro_batch_tokens is not None or micro_batch_steps is not None or normaliser is not None):
            raise TypeError(
                f"{type(self).__name__} overrides loss(); micro-batching and data-parallel "
                "normalisation need the shared loss (accept and apply normaliser=)"
            )
        z = self.loss_normaliser(batch) if normaliser is None else normaliser
        groups = batch.micro_batches(micro_batch_tokens, micro_batch_steps)
        total = 0.0
        sums: dict[str, float] = {}
        tokens = 0.0
        for group in groups:
            if before_micro_batch is not None:
                before_micro_batch()
            part = batch if len(groups) == 1 else batch.subset(group)
            loss = self.loss(policy, part, normaliser=z) if shared else self.loss(policy, part)
            (loss * scale).backward()
            total += float("nan") if loss.is_meta else float(loss.detach())
            n_tok = float(sum(len(s.action.token_ids) for s in part.steps))
            tokens += n_tok
            for key, value in self.last_loss_stats.items():
                sums[key] = sums.get(key, 0.0) + value * n_tok
        self.last_loss_stats = {k: v / max(tokens, 1.0) for k, v in sums.items()}
        return total

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.bit_generator.state, "tree_costs": self._tree_costs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state["rng"]
        self._tree_costs = dict(state.get("tree_costs", {}))

    def config(self) -> dict[str, Any]:
        """Every option (shared and own) and the seed, for logs."""
        return {**self.shared.to_dict(), **self.options.to_dict(), "seed": self.seed}
