"""The ``Policy`` base class: what the rollout engine, the losses and the trainer call on a policy.

A *context* is one decision point (history ``h``) as the engine sees it; an :class:`Action` is
one sample from the policy there, with the token ids and per-token log-probabilities of the
sampled text. Every policy (tabular, transformers, vLLM) subclasses :class:`Policy` and implements
the same three methods (every other hook has a default there):

* ``sample(contexts, n, rngs)`` — ``n`` i.i.d. samples per context (never deduplicated), each
  context's drawn from its own ``numpy.random.Generator`` in ``rngs`` (the engine's per-path
  streams), so a tree does not depend on what else was in the batch (:mod:`bpo_algos.rollout`);
* ``decision_entropy(contexts)`` — the entropy of the policy's distribution at each context,
  computed before the backbone's action is sampled (docs/unbiasedness.md, rule 1: exact over the
  admissible actions, or of the first action token; for a policy that reasons before it acts,
  the ``"probe"`` estimate of :meth:`Policy.probe_entropy`, docs/paper-setting.md);
* ``token_logprobs(steps)`` — differentiable per-token log-probs of recorded actions, a
  ``[n_steps, max_action_tokens]`` tensor padded with zeros past each action's length.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from bpo_algos.compute import ComputeMeter
from bpo_envs.prompting import Context, Turn  # noqa: F401  (re-exported: the decision point lives with the chat format)

DECISION_ENTROPY_MODES: tuple[str, ...] = ("exact", "probe")
"""How an LLM policy computes its decision entropy (docs/paper-setting.md):

* ``"exact"``: the entropy over the admissible answers ``<action>a</action>`` scored at ``h``
  directly (without reasoning). For a policy that answers at once this is the entropy of its
  decision; for one that reasons first it is a proxy (the distribution of an immediate answer,
  not of the answer after reasoning), still a function of ``h`` only, so branching on it keeps
  the estimator unbiased.
* ``"probe"``: ``M`` independent completions at ``h`` (reasoning included), parsed into actions,
  and the plug-in entropy of the parsed actions; the completions are then discarded (they are
  not the backbone's action nor siblings) and their tokens are metered as ``score_tokens``.
  It depends on ``h`` and independent randomness only (rule 1).
"""


def check_entropy_mode(mode: str, probe_samples: int) -> None:
    """Raise on an unknown decision-entropy mode or a probe of fewer than 2 completions."""
    if mode not in DECISION_ENTROPY_MODES:
        raise ValueError(f"decision_entropy must be one of {DECISION_ENTROPY_MODES}, got {mode!r}")
    if isinstance(probe_samples, bool) or not isinstance(probe_samples, int) or probe_samples < 2:
        raise ValueError(f"probe_samples must be an int >= 2 (an entropy needs several completions), got {probe_samples!r}")


def plugin_entropy(labels: Sequence[Hashable]) -> float:
    """``-sum_a p_hat(a) log p_hat(a)`` of the empirical distribution of ``labels`` (nats)."""
    if not labels:
        raise ValueError("plugin_entropy needs at least one label")
    n = len(labels)
    return float(-sum(c / n * math.log(c / n) for c in Counter(labels).values()))


def evaluation_sampling(policy: Policy) -> AbstractContextManager[None]:
    """A context manager that samples at the policy's :attr:`Policy.eval_temperature` (evaluation
    episodes; :meth:`Policy.sampling_temperature`)."""
    return policy.sampling_temperature(policy.eval_temperature)


def admissible_of(info: dict[str, Any]) -> tuple[str, ...] | None:
    """The env's admissible actions from a step's ``info`` (None where the env gives none)."""
    actions = info.get("admissible_actions")
    return tuple(actions) if actions is not None else None


def as_context(value: Any) -> Context:
    """A :class:`Context` from a Context, an ``(observation, admissible_actions)`` pair or a
    dict with those keys (handy in notebooks and tests)."""
    if isinstance(value, Context):
        return value
    if isinstance(value, dict):
        admissible = value.get("admissible_actions")
        return Context(
            task_id=value.get("task_id"),
            observation=value["observation"],
            admissible_actions=tuple(admissible) if admissible is not None else None,
            initial_observation=value.get("initial_observation", value["observation"]),
        )
    if isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], str):
        admissible = value[1]
        return Context(None, value[0], tuple(admissible) if admissible is not None else None, (), value[0])
    raise TypeError(f"cannot make a Context from {type(value).__name__}")


def as_steps(batch_or_steps: Any) -> Sequence[StepLike]:
    """The recorded steps of a :class:`~bpo_algos.algorithm.Batch`, or the sequence itself."""
    return batch_or_steps if isinstance(batch_or_steps, Sequence) else batch_or_steps.steps


@dataclass(frozen=True)
class Action:
    """One sampled action.

    Attributes:
        text: what the policy generated (the raw completion for an LLM).
        token_ids: ids of the generated tokens (a tabular action is one token: its index).
        logprobs: per-token log-probabilities under the sampling policy ("old" log-probs).
        env_action: the string sent to ``env.step``; defaults to ``text``. An LLM policy whose
            output does not parse sends the raw text, and the env answers with an invalid
            action observation (bad model output is an observation, never a crash).
        prompt_token_ids: the prompt the action was generated from.
        index: for a policy that chooses among the admissible actions, the action's position in
            the context's list (``text`` is the action there; the loss reads this index and
            checks the text against it); None for free text.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    env_action: str | None = None
    prompt_token_ids: tuple[int, ...] = field(default=(), repr=False)
    index: int | None = None

    @property
    def command(self) -> str:
        return self.text if self.env_action is None else self.env_action

    @property
    def logprob(self) -> float:
        """Log-probability of the whole action (sum over tokens)."""
        return float(sum(self.logprobs))


class StepLike(Protocol):
    """What ``token_logprobs`` reads of a recorded step (a tree edge satisfies it)."""

    context: Context
    action: Action


class Policy:
    """Base class of every policy: the three binding methods, and every other hook the engine,
    the loss and the trainer call, each with its default (docs/unbiasedness.md states the rules
    the three serve).

    Subclasses implement :meth:`sample`, :meth:`decision_entropy` and :meth:`token_logprobs`,
    and meter their own work in ``self.meter``: ``policy_calls``, ``gen_tokens`` and
    ``prefill_tokens`` (generation) and ``score_tokens`` (decision-entropy passes: the prompt
    and every candidate scored). The engine reads the difference around each call and charges
    it to the trees the call served; it counts no token itself. :meth:`train_tokens` and
    :meth:`flops_parameters` are the learner's side of the cost model (:mod:`bpo_algos.compute`).
    """

    meter: ComputeMeter
    eval_temperature: float | None = None
    """The temperature evaluation episodes sample at (:func:`evaluation_sampling`; 0: greedy;
    None: the policy's own)."""
    device: torch.device | None = None
    """Where the policy computes, when it says so (an LLM policy: its model's device); None:
    where its parameters are."""
    train_batch_size: int | None = None
    """Steps per forward pass of :meth:`token_logprobs` (None: all in one)."""
    restored_in_place: bool = False
    """Whether a comparison restores this policy's saved initial weights in place before each
    run (:class:`~bpo_algos.policy.weights.InitialWeights`) rather than deep-copying it: True
    for a policy whose parameters all exist from construction and whose copy is costly (a
    transformers model, a vLLM engine); a policy that adds parameters while collecting (a
    table) is copied."""

    def __init__(self) -> None:
        self.meter = ComputeMeter()
        self._reference: Any = None  # the frozen k3 KL reference, once set_reference made one

    # ---- the binding methods -------------------------------------------------------------
    def sample(self, contexts: Sequence[Context], n: int, rngs: Sequence[np.random.Generator] | None) -> list[list[Action]]:
        """``n`` i.i.d. samples per context, never deduplicated (docs/unbiasedness.md, rule 2).

        ``rngs``: one generator per context, which that context's samples are drawn from (the
        engine always passes its per-path streams, so a tree does not depend on what else was
        in the batch); None: the policy's own generator (direct calls)."""
        raise NotImplementedError(f"{type(self).__name__} implements no sample()")

    def decision_entropy(self, contexts: Sequence[Context]) -> list[float]:
        """The entropy of the policy's distribution at each context, before any action there is
        sampled (docs/unbiasedness.md, rule 1)."""
        raise NotImplementedError(f"{type(self).__name__} implements no decision_entropy()")

    def token_logprobs(self, steps: Sequence[StepLike]) -> torch.Tensor:
        """Differentiable per-token log-probs of recorded actions, ``[n_steps, max_action_tokens]``
        padded with zeros past each action's length."""
        raise NotImplementedError(f"{type(self).__name__} implements no token_logprobs()")

    # ---- hooks with defaults -------------------------------------------------------------
    def train_tokens(self, step: StepLike) -> int:
        """Tokens the learner's forward and backward pass over ``step`` covers: its prompt and
        its action tokens (what :meth:`token_logprobs` runs the model over)."""
        return len(step.action.prompt_token_ids) + len(step.action.token_ids)

    def flops_parameters(self) -> int:
        """``P`` of the cost model: the parameters a forward pass multiplies by (a frozen KL
        reference copy is not counted: it runs only when a KL term is on); 0 for a policy that
        is no module."""
        if not isinstance(self, torch.nn.Module):
            return 0
        return int(sum(p.numel() for name, p in self.named_parameters() if not name.startswith("_reference.")))

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates: those of the module that require a gradient."""
        if not isinstance(self, torch.nn.Module):
            return []
        return [p for p in self.parameters() if p.requires_grad]

    def prepare_parameters(self, steps: Sequence[StepLike]) -> None:
        """Create the parameters ``steps`` will train before an optimizer is built over
        :meth:`trainable_parameters` (a table policy whose entries appear on first sight); by
        default a policy's parameters are all there already and nothing runs."""

    def enable_gradient_checkpointing(self) -> None:
        """Recompute activations in the backward pass (``TrainerConfig.gradient_checkpointing``)."""
        raise TypeError(f"gradient_checkpointing=True but {type(self).__name__} has no enable_gradient_checkpointing()")

    def sampling_temperature(self, temperature: float | None) -> AbstractContextManager[None]:
        """A context in which :meth:`sample` draws at ``temperature`` (evaluation); by default
        the policy's distribution is left as it is."""
        return nullcontext()

    def clear_cache(self) -> None:
        """Drop state kept between calls that an update makes stale; by default none."""

    def inputs_kept(self) -> AbstractContextManager[None]:
        """A block inside which the policy may keep what it derives from each context object
        that does not depend on its weights (a text scorer's features) and reuse it when the
        same object is scored again, with the same numbers: behaviour cloning's epochs over one
        list of demos. By default nothing is kept."""
        return nullcontext()

    samples_from_rngs: bool = True
    """Whether :meth:`sample` draws each context's samples from its generator in ``rngs`` alone,
    so that an episode depends on its own streams and not on what else was in the batch (then
    evaluation runs all its episodes in one batch: :mod:`bpo_experiments.evaluation`). False
    for a policy that samples from a seed of its own (vLLM)."""

    def shared_pass(self, contexts: Sequence[Context]) -> AbstractContextManager[None]:
        """A context in which :meth:`decision_entropy`, :meth:`sample` and
        :meth:`sample_distinct` over any of ``contexts`` may read one forward pass made over
        all of them on entry (the engine opens one per engine step, over every path that decides
        there). The results and the meter are those of the separate calls: only the work is
        shared. By default nothing is shared (each call runs its own pass)."""
        return nullcontext()

    def shardable_model(self) -> torch.nn.Module | None:
        """The transformers model FSDP shards (``TrainerConfig.fsdp``); None: nothing to shard."""
        return None

    def sync_weights(self) -> None:
        """Push the trained weights to where samples are drawn (a vLLM engine); by default
        sampling reads them directly."""

    def set_reference(self) -> None:
        """Freeze the current policy as the k3 KL's reference."""
        raise NotImplementedError(f"{type(self).__name__} has no reference policy")

    # The sampling RNG: a numpy Generator in ``self._rng`` unless a subclass keeps another
    # (HFPolicy: a torch Generator) and overrides these three.
    def seed(self, seed: int) -> None:
        """Seed the policy's sampling randomness."""
        self._rng = np.random.default_rng(seed)

    @contextmanager
    def metered_as_scoring(self) -> Iterator[None]:
        """Count the generation (``gen_tokens``, ``prefill_tokens``) done inside as
        ``score_tokens``: a pass whose samples are discarded is scoring, not generation."""
        gen, prefill = self.meter.gen_tokens, self.meter.prefill_tokens
        try:
            yield
        finally:
            moved = (self.meter.gen_tokens - gen) + (self.meter.prefill_tokens - prefill)
            self.meter.gen_tokens, self.meter.prefill_tokens = gen, prefill
            self.meter.score_tokens += moved

    def probe_entropy(
        self,
        contexts: Sequence[Context],
        m: int,
        generate: Callable[[Sequence[Context], int], list[list[Action]]],
        parse: Callable[[str], Hashable],
    ) -> list[float]:
        """The ``"probe"`` decision entropy (:data:`DECISION_ENTROPY_MODES`): ``m`` completions
        per context from ``generate``, ``parse``d (an unreadable reply is one outcome, None),
        the plug-in entropy of the parsed actions; the completions are discarded and their
        tokens metered as ``score_tokens``."""
        if not contexts:
            return []
        with self.metered_as_scoring():
            rows = generate(contexts, m)
        return [plugin_entropy([parse(a.text) for a in row]) for row in rows]

    def sample_distinct(
        self, contexts: Sequence[Context], k: int, rngs: Sequence[np.random.Generator] | None = None
    ) -> list[list[Action]]:
        """``min(k, |A(h)|)`` distinct actions per context, without replacement, for
        ``siblings="distinct"`` (docs/unbiasedness.md, rule 7). Its weights need every action's
        probability, so only a policy over enumerable admissible actions
        (:class:`~bpo_algos.policy.choice.ChoicePolicy`) implements it."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot draw distinct siblings: siblings='distinct' needs a policy over "
            "enumerable admissible actions (a ChoicePolicy, e.g. TabularPolicy or ScorerPolicy); use siblings='iid'"
        )

    def reference_token_logprobs(self, steps: Sequence[StepLike]) -> torch.Tensor:
        """Per-token log-probs under the reference policy (for the k3 KL), no gradient."""
        raise NotImplementedError(f"{type(self).__name__} has no reference policy")

    def _prepare_reference_load(self, state_dict: Any) -> None:
        """Make the frozen reference before loading a checkpoint that holds one.

        A reference copy is a submodule, so a checkpoint saved after it was made holds its
        weights under ``_reference.``; a fresh policy has none yet and would refuse those keys.
        Making it first lets loading restore it, so the KL keeps its original anchor.
        """
        if self._reference is None and any(k.startswith("_reference.") for k in state_dict):
            self.set_reference()

    def rng_state(self) -> Any:
        """The sampling RNG state, for checkpoints."""
        return self._rng.bit_generator.state

    def set_rng_state(self, state: Any) -> None:
        self._rng.bit_generator.state = state


class TablePolicy(Policy):
    """Base of the policies whose parameters are table entries that appear the first time a
    context is seen (:class:`~bpo_algos.policy.choice.ChoicePolicy` and its tabular kin,
    :class:`~bpo_algos.policy.reasoning.ReasoningTabularPolicy`): the entries ``steps`` train
    are created by a forward pass over them without gradient, before the optimizer is built."""

    def prepare_parameters(self, steps: Sequence[StepLike]) -> None:
        with torch.no_grad():
            self.token_logprobs(steps)


def pad_token_rows(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack 1-D per-step tensors into ``[n, max_len]``, zero-padded (keeps gradients)."""
    if not rows:
        return torch.zeros(0, 0)
    width = max(int(r.shape[0]) for r in rows)
    return torch.stack([torch.nn.functional.pad(r, (0, width - int(r.shape[0]))) for r in rows])


def action_mask(steps: Sequence[StepLike], width: int | None = None) -> torch.Tensor:
    """``[n, max_len]`` float mask of real (non-padding) action tokens."""
    lengths = torch.tensor([len(s.action.token_ids) for s in steps], dtype=torch.long)
    width = int(lengths.max()) if width is None and len(steps) else (width or 0)
    return (torch.arange(width)[None, :] < lengths[:, None]).float()
