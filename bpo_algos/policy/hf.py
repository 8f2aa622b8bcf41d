"""``HFPolicy``: any ``transformers`` causal LM as a :class:`~bpo_algos.policy.base.Policy`.

The policy's distribution at a context is the model's distribution over answers (completions
ending with the stop token) at temperature ``T``: ``pi(y | h) = prod_t softmax(z_t / T)[y_t]``.
Sampling, ``token_logprobs`` (the loss), the reference log-probs (k3 KL) and the decision
entropy all use that same distribution, so PPO ratios are exactly 1 on fresh samples. No
top-k/top-p: they would make the sampled distribution differ from the scored one.

Mechanics:

* **Prefix sharing.** A prompt is prefilled once; its KV cache is expanded to the ``n``
  samples of that context (``share_prefix=True``), instead of prefilling ``n`` copies.
  Prompts of one call are batched with left padding (explicit position ids, so padding changes
  nothing but float rounding).
* **Prompt KV store** (``reuse_prefill=True``). Prefilled prompts are kept in a
  :class:`~bpo_algos.policy.prefix_store.PrefixStore` of at most ``prefix_store_tokens`` tokens
  (least recently used evicted first). A prompt is prefilled from the kept prompt sharing the
  most leading tokens with it: only the tokens after that common prefix run through the model
  (the KV at position ``j`` depends on tokens ``0..j`` only). So the ``sample`` after a
  ``decision_entropy`` at the same context prefills nothing, the same episode's next step
  prefills only what its prompt does not share with the last, and prompts of one call that share
  a stem beyond the store (a fork's siblings, up to their own action) prefill it once
  (``STEM_MIN_TOKENS``). ``prefix_store_tokens=0``: the store holds one decision's prompts, cleared at the next
  ``decision_entropy`` and after the ``sample`` (exact matches only: every decision prefills its
  whole prompt). The store is cleared by ``token_logprobs`` (a weight update follows the loss),
  whenever a trainable parameter was modified in place since (:meth:`HFPolicy.weights_version`),
  and by :meth:`HFPolicy.clear_cache`.
* **Decision entropy** (docs/unbiasedness.md, rule 1), ``decision_entropy="exact"`` (default):
  with admissible actions, the exact entropy of ``pi`` restricted to the admissible answers
  ``<action>a</action><eos>`` and renormalised, every answer scored in one pass that shares the
  prompt's KV; without, the entropy of the first token after the opening action tag (the first
  action token). For a policy that reasons first (``PromptConfig(reasoning=True)``) this is a
  proxy: the distribution of an immediate answer at ``h``. ``decision_entropy="probe"``:
  ``probe_samples`` independent completions at ``h`` (reasoning included), parsed, the plug-in
  entropy of the parsed actions; the completions are discarded and metered as
  ``score_tokens`` (:data:`~bpo_algos.policy.base.DECISION_ENTROPY_MODES`,
  docs/paper-setting.md). Both depend on ``h`` and independent randomness only.
* **Reasoning replies** (``PromptConfig(reasoning=True)``): the model reasons in
  ``<think>...</think>`` and then states ``<action>...</action>``; a reply without an action
  after its reasoning reaches the env as raw text (an invalid-action observation). Give it
  room: ``max_new_tokens`` 512 (verl-agent's response limit; the gpu presets' ``EnvSetup``).
* **LoRA** (``lora=True``, a dict of ``peft.LoraConfig`` fields or a ``LoraConfig``): only
  the adapters train; reference log-probs come from the same weights with the adapter disabled.
  Without LoRA the reference is a frozen copy made on first use (:meth:`set_reference`); with
  ``reference_offload=True`` (verl's ``ref.fsdp_config.param_offload``) that copy lives in host
  memory (pinned when CUDA is there, in ``reference_dtype``) and each of its modules is copied to
  the policy's device just before it runs and dropped right after, so the device holds at most
  one module of it (``bpo-memory-plan --reference-offload``).
* **Scale** (the README's GPU section). Dropout is switched off in the model itself (every
  ``nn.Dropout`` and the config's dropout fields set to 0), so ``train()`` really puts the model in
  training mode and :meth:`HFPolicy.enable_gradient_checkpointing` takes effect (transformers
  checkpoints only in training mode). Entropy scoring runs at most ``score_batch_size``
  (context x answer) rows per forward, decoding at most ``decode_batch_size`` rows; prompts
  longer than ``max_model_len - max_new_tokens`` (``max_model_len`` from the model config by
  default) lose their oldest turns, then the head of their observation, with a logged warning
  (:meth:`HFPolicy.prompt_ids`): never an exception mid-batch. ``policy.to(device)`` moves the
  model, the reference and the sampling generator.
* **Meter.** ``policy_calls`` (one per ``sample``/``decision_entropy``), ``prefill_tokens``
  (prompt tokens run through the model to generate, once per prompt when shared, and only those
  after the kept common prefix), ``score_tokens`` (tokens of a decision-entropy pass: the
  prompt's tokens not already kept, whose KV ``sample`` then reuses, and every candidate answer
  scored), ``gen_tokens`` (sampled tokens).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from bpo_algos.policy.base import (
    Action,
    Context,
    Policy,
    StepLike,
    as_steps,
    check_entropy_mode,
    pad_token_rows,
)
from bpo_algos.policy.prefix_store import PrefixStore, common_prefix_length
from bpo_algos.policy.prompt_builder import PromptBuilder
from bpo_envs.prompting import PromptConfig, env_action, format_action, parse_action
from bpo_envs.validation import check_count

DEFAULT_LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"}
DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "summary_first_dropout")
PAD_SLACK = 1.25  # the most padded tokens a prefill batch computes, per real token
STEM_MIN_TOKENS = 16  # a shared stem shorter than this is not worth a forward pass of its own
log = logging.getLogger(__name__)

def disable_dropout(model: nn.Module) -> int:
    """Set every dropout probability of ``model`` to 0: its ``nn.Dropout`` modules and the dropout
    fields of its config (models that call ``F.dropout(p=config.x)`` read those). Returns the
    number of modules changed. Sampling and scoring then see the same function in train mode."""
    changed = 0
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p:
            module.p = 0.0
            changed += 1
        for name in ("attention_dropout", "dropout"):
            value = getattr(module, name, None)  # third-party: torch/transformers modules name their dropout fields differently
            if isinstance(value, float) and value:
                setattr(module, name, 0.0)
    config = getattr(model, "config", None)  # third-party: a plain torch module has no transformers config
    for name in DROPOUT_FIELDS:
        if isinstance(getattr(config, name, None), float):  # third-party: each transformers config has its own dropout fields
            setattr(config, name, 0.0)
    return changed


def model_max_len(config: Any) -> int | None:
    """The longest sequence the model's config allows (``max_position_embeddings`` and kin)."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)  # third-party: transformers configs name the length limit differently
        if isinstance(value, int) and value > 0:
            return value
    return None


def offloaded_copy(model: nn.Module, device: Any, dtype: torch.dtype | None = None) -> nn.Module:
    """A frozen copy of ``model`` in host memory whose modules run on ``device()``.

    The copy is built without a second device copy (an empty ``type(model)(model.config)`` on the
    meta device, then the weights assigned from host tensors). A forward pre-hook on every
    module that owns parameters or buffers points them at device copies of the host tensors; a
    forward hook points them back, so the device copy is freed as soon as the module has run.
    """
    def host(t: torch.Tensor) -> torch.Tensor:
        out = t.detach().to("cpu", dtype=dtype if dtype is not None and t.is_floating_point() else None, copy=True)
        return out.pin_memory() if torch.cuda.is_available() else out

    try:
        with torch.device("meta"):
            ref = type(model)(model.config)
        ref.load_state_dict({k: host(v) for k, v in model.state_dict().items()}, assign=True, strict=True)
        for name, buf in model.named_buffers():  # non-persistent buffers (rotary frequencies)
            owner, _, leaf = name.rpartition(".")
            ref.get_submodule(owner)._buffers[leaf] = host(buf)
        # third-party: transformers models and configs differ in whether they tie embeddings
        if getattr(model.config, "tie_word_embeddings", False) and hasattr(ref, "tie_weights"):
            ref.tie_weights()
    except (TypeError, AttributeError):  # not a config-constructed model: copy, then move
        ref = copy.deepcopy(model).to("cpu")
        if dtype is not None:
            ref.to(dtype=dtype)
    ref.requires_grad_(False).eval()
    disable_dropout(ref)
    for module in ref.modules():
        tensors = [*module._parameters.values(), *module._buffers.values()]
        if not any(t is not None for t in tensors):
            continue
        homes = {name: t.data for name, t in module._parameters.items() if t is not None}
        buffers = {name: t for name, t in module._buffers.items() if t is not None}

        def load(mod: nn.Module, args: Any, homes: dict = homes, buffers: dict = buffers) -> None:
            target = device()
            for name, t in homes.items():
                mod._parameters[name].data = t.to(target, non_blocking=True)
            for name, t in buffers.items():
                mod._buffers[name] = t.to(target, non_blocking=True)

        def unload(mod: nn.Module, args: Any, output: Any, homes: dict = homes, buffers: dict = buffers) -> None:
            for name, t in homes.items():
                mod._parameters[name].data = t
            for name, t in buffers.items():
                mod._buffers[name] = t

        module.register_forward_pre_hook(load)
        module.register_forward_hook(unload)
    ref._bpo_offloaded = True
    return ref


@dataclass
class _Prefix:
    """A prefilled prompt: its per-layer KV (``[1, kv_heads, L, head_dim]``) and next-token logits."""

    ids: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    logits: torch.Tensor


@dataclass
class _Batch:
    """Prefixes assembled for decoding: left-padded KV cache, mask, lengths, next logits."""

    cache: Any
    mask: torch.Tensor
    lengths: torch.Tensor
    logits: torch.Tensor


class HFPolicy(Policy, nn.Module):
    """A ``transformers`` causal LM policy (see the module docstring).

    Args:
        model: a model name or folder (``AutoModelForCausalLM.from_pretrained``) or a loaded
            ``PreTrainedModel``.
        tokenizer: a tokenizer, a name/folder, or None (loaded from ``model`` when it is a path).
        temperature: sampling temperature (> 0); part of the policy's distribution.
        max_new_tokens: the longest answer; an answer cut there has no stop token and usually
            does not parse (the env then answers "invalid action").
        prompt: the prompt format (:class:`~bpo_envs.prompting.PromptConfig`).
        lora: None/False (train all weights), True (default LoRA), a dict of ``LoraConfig``
            fields, or a ``peft.LoraConfig``.
        share_prefix: prefill each prompt once and expand its KV to the ``n`` samples.
        reuse_prefill: keep prefilled prompts' KV for later calls (module docstring).
        prefix_store_tokens: the most prompt tokens whose KV is kept across decisions (0, the
            default: only within one decision, as an entropy pass's prompt for the ``sample``
            after it). Opt in with e.g. 16384: the meter then charges only the tokens that ran,
            which depend on what this process has seen, so under data parallelism (each rank
            holds its own trees) ``prefill_tokens`` and a budget in ``policy_tokens``/``flops``
            differ from one process's (docs/training.md, "Prompt KV cache").
        batch_size: prompts prefilled per forward pass.
        train_batch_size: sequences per forward pass in ``token_logprobs``.
        device / dtype: where and in which precision to load the model (default: CUDA when
            available, else CPU; the checkpoint's dtype).
        seed: seeds sampling.
        max_model_len: the longest prompt + answer (default: the model config's
            ``max_position_embeddings``); longer prompts are shortened (module docstring).
        score_batch_size: (context x answer) rows per entropy-scoring forward.
        decode_batch_size: rows decoded together (None: all the rows of a call).
        decision_entropy: ``"exact"`` or ``"probe"`` (module docstring).
        probe_samples: completions per context of a ``"probe"`` entropy (>= 2).
        reference_offload: keep the frozen KL reference in host memory (module docstring).
        reference_dtype: the reference copy's dtype (None: the model's).
        eval_temperature: the temperature evaluation episodes sample at (0: greedy; None: the
            policy's own; :meth:`sampling_temperature`).
    """

    restored_in_place = True  # its parameters exist from construction; a copy costs a model
    _generator: torch.Generator | None = None
    """The sampling generator (made in ``__init__``; None while the module is being built)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        temperature: float = 1.0,
        max_new_tokens: int = 64,
        prompt: PromptConfig | None = None,
        lora: Any = None,
        share_prefix: bool = True,
        reuse_prefill: bool = True,
        prefix_store_tokens: int = 0,
        batch_size: int = 16,
        train_batch_size: int = 8,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        seed: int = 0,
        max_model_len: int | None = None,
        score_batch_size: int = 64,
        decode_batch_size: int | None = None,
        decision_entropy: str = "exact",
        probe_samples: int = 8,
        reference_offload: bool = False,
        reference_dtype: torch.dtype | None = None,
        eval_temperature: float | None = None,
    ) -> None:
        Policy.__init__(self)
        if eval_temperature is not None and not eval_temperature >= 0:
            raise ValueError(f"eval_temperature must be >= 0 (0: greedy) or None, got {eval_temperature}")
        self.eval_temperature = eval_temperature
        check_entropy_mode(decision_entropy, probe_samples)
        self.decision_entropy_mode = decision_entropy
        self.probe_samples = int(probe_samples)
        self.reference_offload = bool(reference_offload)
        self.reference_dtype = reference_dtype
        nn.Module.__init__(self)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 (the policy's distribution), got {temperature}")
        for name, value in (("max_new_tokens", max_new_tokens), ("batch_size", batch_size), ("train_batch_size", train_batch_size), ("score_batch_size", score_batch_size)):
            check_count(name, value)
        if decode_batch_size is not None:
            check_count("decode_batch_size", decode_batch_size)
        if not prefix_store_tokens >= 0:
            raise ValueError(f"prefix_store_tokens must be >= 0, got {prefix_store_tokens}")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model_name = str(model) if isinstance(model, str | os.PathLike) else type(model).__name__
        if isinstance(model, str | os.PathLike):
            kwargs = {} if dtype is None else {"dtype": dtype}
            model = AutoModelForCausalLM.from_pretrained(model, **kwargs)
            if tokenizer is None:
                tokenizer = self.model_name
        elif dtype is not None:
            model = model.to(dtype=dtype)
        if tokenizer is None:
            raise ValueError("pass a tokenizer when the model is an already-loaded object")
        if isinstance(tokenizer, str | os.PathLike):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.tokenizer = tokenizer
        self.prompts = PromptBuilder(tokenizer, prompt or PromptConfig())
        self.temperature = float(temperature)
        self.max_new_tokens = int(max_new_tokens)
        self.share_prefix = bool(share_prefix)
        self.reuse_prefill = bool(reuse_prefill)
        self.batch_size = int(batch_size)
        self.train_batch_size = int(train_batch_size)
        self.device = device

        self.lora = bool(lora)
        if lora:
            from peft import LoraConfig, get_peft_model

            if not isinstance(lora, LoraConfig):
                lora = LoraConfig(**{**DEFAULT_LORA, **(lora if isinstance(lora, dict) else {})})
            model = get_peft_model(model, lora)
        self.model = model.to(device)
        disable_dropout(self.model)  # sampling and scoring must see the same function
        self.model.eval()
        self.max_model_len = int(max_model_len or model_max_len(self.model.config) or 1 << 30)
        if self.max_model_len <= self.max_new_tokens:
            raise ValueError(f"max_model_len ({self.max_model_len}) must exceed max_new_tokens ({self.max_new_tokens})")
        self.score_batch_size = int(score_batch_size)
        self.decode_batch_size = decode_batch_size
        self.truncated_prompts = 0
        self._reference: nn.Module | None = None

        stops = {self.prompts.eos_token_id}
        # third-party: a transformers model may have no generation config, or one without an eos
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        stops.update([gen_eos] if isinstance(gen_eos, int) else (gen_eos or []))
        self.stop_token_ids = frozenset(int(s) for s in stops)
        pad = getattr(tokenizer, "pad_token_id", None)  # third-party: not every tokenizer object defines a pad token
        self.pad_token_id = int(pad if pad is not None else self.prompts.eos_token_id)
        self._generator = torch.Generator(device=device)
        self._generator.manual_seed(seed)
        self.prefix_store_tokens = int(prefix_store_tokens)
        self._store = PrefixStore(self.prefix_store_tokens or None)
        self._store_version = self.weights_version()
        self._sample_temperature: float | None = None

    # ---- Policy ----------------------------------------------------------------------
    @property
    def config(self) -> PromptConfig:
        return self.prompts.config

    def seed(self, seed: int) -> None:
        self._generator.manual_seed(int(seed))

    def rng_state(self) -> Any:
        return self._generator.get_state()

    def set_rng_state(self, state: Any) -> None:
        self._generator.set_state(state)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters an optimizer should update (the adapters only, with LoRA)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def weights_version(self) -> int:
        """Changes whenever a trainable parameter is modified in place (an optimizer step)."""
        return sum(p._version for p in self.model.parameters() if p.requires_grad)

    @contextlib.contextmanager
    def sampling_temperature(self, temperature: float | None) -> Iterator[None]:
        """Sample at ``temperature`` inside (0: greedy; None: the policy's own) — for evaluation
        (verl-agent evaluates at 0.4; SWE-bench at 0). Answers sampled inside record the
        log-probs of the distribution they were drawn from, so they are not for training."""
        if temperature is not None and not temperature >= 0:
            raise ValueError(f"an evaluation temperature must be >= 0 or None, got {temperature}")
        previous = self._sample_temperature
        self._sample_temperature = None if temperature is None or temperature == self.temperature else float(temperature)
        try:
            yield
        finally:
            self._sample_temperature = previous

    def shardable_model(self) -> nn.Module:
        """The transformers model, which FSDP shards."""
        return self.model

    @property
    def across_decisions(self) -> bool:
        """Whether prompt KV is kept from one decision to the next (module docstring)."""
        return self.reuse_prefill and self.prefix_store_tokens > 0

    def clear_cache(self) -> None:
        """Drop the kept prompt KV (stale after an update)."""
        self._store.clear()

    def enable_gradient_checkpointing(self) -> None:
        """Recompute each layer's activations in the backward pass (non-reentrant); takes effect
        in training mode, which is safe because dropout is off in the model."""
        kwargs = {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
        model = self.model.get_base_model() if self.lora else self.model
        model.gradient_checkpointing_enable(**kwargs)
        if self.lora and hasattr(model, "enable_input_require_grads"):  # third-party: older transformers models lack it
            model.enable_input_require_grads()

    @property
    def gradient_checkpointing(self) -> bool:
        model = self.model.get_base_model() if self.lora else self.model
        return bool(getattr(model, "is_gradient_checkpointing", False))  # third-party: a model without checkpointing support lacks it

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> HFPolicy:
        """``policy.to(device)``: also move the inputs' device and the sampling generator (an
        offloaded reference stays in host memory)."""
        offloaded = self._modules.get("_reference")
        if offloaded is not None and self.reference_offload:
            del self._modules["_reference"]
            try:
                super()._apply(fn, *args, **kwargs)
            finally:
                self._modules["_reference"] = offloaded
        else:
            super()._apply(fn, *args, **kwargs)
        device = next(self.model.parameters()).device
        if self._generator is not None and device != self.device:
            seed = int(torch.randint(2**62, (1,), generator=self._generator))
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(seed)
            self._store.clear()
        self.device = device
        return self

    def save_pretrained(self, path: str | os.PathLike[str]) -> None:
        """Save the model (or its adapter) and the tokenizer."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    # ---- forward passes ------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any = None, **kw: Any) -> Any:
        return self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=cache,
            use_cache=cache is not None or kw.pop("use_cache", False),
            **kw,
        )

    def _left_pad(self, seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            if s:
                ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
                mask[i, width - len(s) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        return ids, mask, positions

    @torch.no_grad()
    def _prefill(self, prompts: Sequence[tuple[int, ...]], counter: str = "prefill_tokens") -> list[_Prefix]:
        """Run ``prompts`` through the model; each keeps its own unpadded KV slice.

        ``counter``: the meter field the prompt tokens are counted in (``score_tokens`` for a
        decision-entropy pass)."""
        out: list[_Prefix | None] = [None] * len(prompts)
        for rows in self._batches([len(p) for p in prompts]):
            chunk = [prompts[i] for i in rows]
            if any(not p for p in chunk):
                raise ValueError("a prompt must have at least one token")
            ids, mask, positions = self._left_pad(chunk)
            result = self._forward(ids, mask, positions, use_cache=True, logits_to_keep=1)
            layers = [(layer.keys, layer.values) for layer in result.past_key_values.layers]
            width = ids.shape[1]
            for i, p in enumerate(chunk):
                pad = width - len(p)
                kv = [(k[i : i + 1, :, pad:].clone(), v[i : i + 1, :, pad:].clone()) for k, v in layers]
                out[rows[i]] = _Prefix(p, kv, result.logits[i, -1].float())
            setattr(self.meter, counter, getattr(self.meter, counter) + sum(len(p) for p in chunk))
        return out  # type: ignore[return-value]

    def _batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Indices of rows run together, in order: at most ``batch_size`` a batch, and a new batch
        where padding to the longest would compute over ``PAD_SLACK`` times the real tokens
        (padded positions cost as much as real ones; on a CPU a batch gains little else)."""
        batches: list[list[int]] = []
        rows: list[int] = []
        longest = total = 0
        for i, n in enumerate(lengths):
            wider = max(longest, n)
            if rows and (len(rows) == self.batch_size or wider * (len(rows) + 1) > PAD_SLACK * (total + n)):
                batches.append(rows)
                rows, wider, total = [], n, 0
            rows.append(i)
            longest, total = wider, total + n
        if rows:
            batches.append(rows)
        return batches

    @torch.no_grad()
    def _prefill_after(
        self, bases: Sequence[tuple[_Prefix, int]], prompts: Sequence[tuple[int, ...]], counter: str = "prefill_tokens"
    ) -> list[_Prefix]:
        """Prefill ``prompts[i]`` from the first ``k`` positions of a kept prefix ``bases[i] =
        (prefix, k)`` (``0 < k < len(prompts[i])``, the two sharing those ``k`` tokens): only the
        tokens after ``k`` run through the model, and only those are metered in ``counter``.

        Layout of a batch row: the kept KV left-padded to the widest, then the new tokens
        right-padded (pads are masked; positions are explicit), logits read at each row's last
        new token."""
        from transformers import DynamicCache

        out: list[_Prefix | None] = [None] * len(prompts)
        for rows in self._batches([len(p) - k for (_, k), p in zip(bases, prompts, strict=True)]):
            chunk = [(bases[i], prompts[i]) for i in rows]
            kept = [k for (_, k), _ in chunk]
            news = [p[k:] for (_, k), p in chunk]
            width, new_width = max(kept), max(len(t) for t in news)
            data = []
            for layer in range(len(chunk[0][0][0].kv)):
                keys, values = [], []
                for (base, k), _ in chunk:
                    key, value = base.kv[layer]
                    keys.append(nn.functional.pad(key[:, :, :k], (0, 0, width - k, 0)))
                    values.append(nn.functional.pad(value[:, :, :k], (0, 0, width - k, 0)))
                data.append((torch.cat(keys, 0), torch.cat(values, 0)))
            cache = DynamicCache(data, config=self.model.config)
            lengths = torch.tensor(kept)
            ids = torch.full((len(chunk), new_width), self.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width + new_width), dtype=torch.long)
            mask[:, :width] = (torch.arange(width)[None, :] >= (width - lengths)[:, None]).long()
            for r, t in enumerate(news):
                ids[r, : len(t)] = torch.tensor(t, dtype=torch.long)
                mask[r, width : width + len(t)] = 1
            positions = lengths[:, None] + torch.arange(new_width)[None, :]
            last = sorted({len(t) - 1 for t in news})
            result = self._forward(ids, mask, positions, cache, logits_to_keep=torch.tensor(last, device=self.device))
            column = {c: j for j, c in enumerate(last)}
            layers = [(layer.keys, layer.values) for layer in result.past_key_values.layers]
            for r, (((_, k), prompt), t) in enumerate(zip(chunk, news, strict=True)):
                kv = [
                    (torch.cat([key[r : r + 1, :, width - k : width], key[r : r + 1, :, width : width + len(t)]], 2),
                     torch.cat([value[r : r + 1, :, width - k : width], value[r : r + 1, :, width : width + len(t)]], 2))
                    for key, value in layers
                ]
                out[rows[r]] = _Prefix(prompt, kv, result.logits[r, column[len(t) - 1]].float())
            setattr(self.meter, counter, getattr(self.meter, counter) + sum(len(t) for t in news))
        return out  # type: ignore[return-value]

    def _shared_stems(self, prompts: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Common prefixes that several of ``prompts`` share beyond what the store holds (the
        siblings after a fork share everything up to their own action): for each pair adjacent in
        sorted order, their common prefix (less the last token of either), when the store holds
        at least ``STEM_MIN_TOKENS`` fewer of it and it is not itself one of the prompts. Prefilled once, each
        stem's KV then serves every prompt that starts with it; stems of stems are found by the
        same rule when the stems are prefilled (strictly shorter each time, so it ends)."""
        ordered = sorted(prompts)
        given = set(prompts)
        stems: dict[tuple[int, ...], None] = {}
        for a, b in zip(ordered, ordered[1:], strict=False):
            shared = min(common_prefix_length(a, b), len(a) - 1, len(b) - 1)
            if shared < STEM_MIN_TOKENS or a[:shared] in given:
                continue
            _, kept = self._store.longest_prefix(a[:shared])
            if shared - kept >= STEM_MIN_TOKENS:
                stems[a[:shared]] = None
        return list(stems)

    def _prefixes(self, prompts: Sequence[tuple[int, ...]], keep: bool, counter: str = "prefill_tokens") -> list[_Prefix]:
        """Prefixes for ``prompts`` (duplicates prefilled once): kept ones from the store, the
        others prefilled after their longest kept common prefix (across decisions) or whole."""
        version = self.weights_version()
        if version != self._store_version:  # weights changed since the KV was computed
            self._store.clear()
            self._store_version = version
        found: dict[tuple[int, ...], _Prefix] = {}
        for p in dict.fromkeys(prompts):
            hit = self._store.get(p)
            if hit is not None:
                found[p] = hit
        missing = [p for p in dict.fromkeys(prompts) if p not in found]
        if self.across_decisions and len(missing) > 1:
            stems = self._shared_stems(missing)
            if stems:  # kept first, so each prompt below runs only its own tail
                self._prefixes(stems, keep=True, counter=counter)
        whole, after, bases = [], [], []
        for p in missing:
            base, k = self._store.longest_prefix(p) if self.across_decisions else (None, 0)
            k = min(k, len(p) - 1)  # at least the last token runs: its logits are the next-token ones
            if base is not None and k > 0:
                after.append(p)
                bases.append((base, k))
            else:
                whole.append(p)
        # batches of similar lengths pad least (the results are matched back by prompt)
        whole.sort(key=len)
        order = sorted(range(len(after)), key=lambda i: len(after[i]) - bases[i][1])
        after, bases = [after[i] for i in order], [bases[i] for i in order]
        fresh = dict(zip(whole, self._prefill(whole, counter), strict=True))
        if after:
            fresh.update(zip(after, self._prefill_after(bases, after, counter), strict=True))
        if (keep or self.across_decisions) and self.reuse_prefill:
            for p in missing:
                self._store.put(fresh[p])
        found.update(fresh)
        return [found[p] for p in prompts]

    def _assemble(self, prefixes: Sequence[_Prefix], repeats: Sequence[int]) -> _Batch:
        """One left-padded batch with prefix ``i`` repeated ``repeats[i]`` times."""
        from transformers import DynamicCache

        width = max(len(p.ids) for p in prefixes)
        index = torch.repeat_interleave(torch.arange(len(prefixes)), torch.tensor(list(repeats))).to(self.device)

        def stack(tensors: list[torch.Tensor]) -> torch.Tensor:
            padded = [nn.functional.pad(t, (0, 0, width - t.shape[2], 0)) for t in tensors]
            return torch.cat(padded, 0).index_select(0, index)

        n_layers = len(prefixes[0].kv)
        data = [
            (stack([p.kv[layer][0] for p in prefixes]), stack([p.kv[layer][1] for p in prefixes]))
            for layer in range(n_layers)
        ]
        cache = DynamicCache(data, config=self.model.config)
        lengths = torch.tensor([len(p.ids) for p in prefixes]).index_select(0, index.cpu())
        mask = (torch.arange(width)[None, :] >= (width - lengths)[:, None]).long()
        logits = torch.stack([p.logits for p in prefixes]).index_select(0, index)
        return _Batch(cache, mask, lengths, logits)

    def _logp(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float() / self.temperature, dim=-1)

    @torch.no_grad()
    def _decode(self, batch: _Batch, greedy: bool, rngs: Sequence[np.random.Generator] | None = None) -> list[tuple[list[int], list[float]]]:
        """Sample (or greedily decode) one answer per row of ``batch`` until a stop token.

        ``rngs``: one generator per row; row ``r``'s token is the first whose cumulative
        probability exceeds a uniform drawn from ``rngs[r]`` (else the policy's generator)."""
        rows = batch.logits.shape[0]
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        active = torch.arange(rows)  # batch row -> output row
        logits, mask, positions, cache = batch.logits, batch.mask, batch.lengths.clone(), batch.cache
        stops = torch.tensor(sorted(self.stop_token_ids), device=self.device)
        override = self._sample_temperature
        greedy = greedy or override == 0.0
        for step in range(self.max_new_tokens):
            logp = self._logp(logits) if override is None or greedy else torch.log_softmax(logits.float() / override, dim=-1)
            if greedy:
                picked = logp.argmax(-1)
            elif rngs is not None:
                u = torch.tensor([rngs[r].random() for r in active.tolist()], dtype=torch.float64, device=logp.device)
                cdf = logp.double().exp().cumsum(-1)
                picked = (cdf < u[:, None] * cdf[:, -1:]).sum(-1).clamp(max=logp.shape[-1] - 1)
            else:
                picked = torch.multinomial(logp.exp(), 1, generator=self._generator).squeeze(-1)
            picked_lp = logp.gather(-1, picked[:, None]).squeeze(-1)
            for row, tok, lp in zip(active.tolist(), picked.tolist(), picked_lp.tolist(), strict=True):
                tokens[row].append(tok)
                logprobs[row].append(lp)
            self.meter.gen_tokens += int(active.numel())
            alive = ~torch.isin(picked, stops)
            if step == self.max_new_tokens - 1 or not bool(alive.any()):
                break
            if not bool(alive.all()):
                keep = alive.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                active, picked, mask, positions = active[keep.cpu()], picked[keep], mask[keep.cpu()], positions[keep.cpu()]
            mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype)], dim=1)
            out = self._forward(picked[:, None], mask, positions[:, None], cache)
            positions = positions + 1
            logits = out.logits[:, -1]
        return list(zip(tokens, logprobs, strict=True))

    @torch.no_grad()
    def _extend(
        self, prefixes: Sequence[_Prefix], continuations: Sequence[Sequence[Sequence[int]]], counter: str = "prefill_tokens"
    ) -> list[list[torch.Tensor]]:
        """Next-token logits along continuations of each prefix, sharing the prefix KV.

        ``continuations[i]`` is a list of token sequences after ``prefixes[i]``; the result
        ``[i][j]`` is a ``[len(c) + 1, vocab]`` tensor: row ``t`` is the logits after the first
        ``t`` tokens of continuation ``j`` (row 0 = the prefix's own next-token logits).
        """
        rows = [(i, tuple(c)) for i, cs in enumerate(continuations) for c in cs]
        if len(rows) > self.score_batch_size:  # bound the KV copies and activations of one pass
            out: list[list[torch.Tensor]] = [[] for _ in continuations]
            for start in range(0, len(rows), self.score_batch_size):
                chunk = rows[start : start + self.score_batch_size]
                owners = list(dict.fromkeys(i for i, _ in chunk))
                part = self._extend([prefixes[i] for i in owners], [[c for j, c in chunk if j == i] for i in owners])
                for i, logits in zip(owners, part, strict=True):
                    out[i].extend(logits)
            return out
        flat = [c for _, c in rows]
        batch = self._assemble(prefixes, [len(cs) for cs in continuations])
        width = max((len(c) for c in flat), default=0)
        if width:
            ids = torch.full((len(flat), width), self.pad_token_id, dtype=torch.long)
            extra = torch.zeros((len(flat), width), dtype=torch.long)
            for r, c in enumerate(flat):
                if c:
                    ids[r, : len(c)] = torch.tensor(c)
                    extra[r, : len(c)] = 1
            positions = batch.lengths[:, None] + torch.arange(width)[None, :]
            out = self._forward(ids, torch.cat([batch.mask, extra], 1), positions, batch.cache)
            logits = torch.cat([batch.logits[:, None], out.logits.float()], 1)
            setattr(self.meter, counter, getattr(self.meter, counter) + int(extra.sum()))
        else:
            logits = batch.logits[:, None]
        result: list[list[torch.Tensor]] = []
        r = 0
        for cs in continuations:
            result.append([logits[r + j, : len(c) + 1] for j, c in enumerate(cs)])
            r += len(cs)
        return result

    # ---- Policy --------------------------------------------------------------------------
    def recorded_action(self, context: Context, command: str) -> Action:
        """The :class:`Action` whose answer states ``command`` at ``context`` (behaviour cloning)."""
        text = format_action(command, self.prompts.config)
        return Action(text, self.prompts.action_ids(command), (), command, self.prompt_ids(context))

    def prompt_ids(self, context: Context) -> tuple[int, ...]:
        """The prompt's token ids, shortened to fit ``max_model_len - max_new_tokens``: the oldest
        turns go first, then the head of the current observation (a warning is logged)."""
        limit = self.max_model_len - self.max_new_tokens
        ids = self.prompts.prompt_ids(context)
        if len(ids) <= limit:
            return ids
        original = len(ids)
        shortened = context
        while len(ids) > limit and shortened.history:
            shortened = dataclasses.replace(shortened, history=shortened.history[1:])
            ids = self.prompts.prompt_ids(shortened)
        observation = shortened.observation
        while len(ids) > limit and observation:
            observation = observation[len(observation) // 4 + 1 :]
            ids = self.prompts.prompt_ids(dataclasses.replace(shortened, observation="[...] " + observation))
        if len(ids) > limit:  # the fixed parts alone are too long: keep the prompt's tail
            ids = ids[-limit:]
        self.truncated_prompts += 1
        log.warning(
            "prompt of %d tokens over max_model_len - max_new_tokens = %d: dropped %d oldest turn(s)%s -> %d tokens",
            original, limit, len(context.history) - len(shortened.history),
            " and the observation's head" if observation != shortened.observation else "", len(ids),
        )
        return ids

    def generate(
        self, contexts: Sequence[Context], n: int, *, share_prefix: bool | None = None, greedy: bool = False,
        keep_prefix: bool = False, rngs: Sequence[np.random.Generator] | None = None,
    ) -> list[list[Action]]:
        """``n`` answers per context: sampled at the policy temperature, or greedy.

        ``share_prefix`` overrides the policy's setting (False: each of the ``n`` rows
        prefills its own copy of the prompt, the baseline prefix sharing is measured against).
        ``keep_prefix``: keep the prompts' KV for the next call (a probe, then the backbone's
        sample at the same context). ``rngs``: one generator per context; each of its ``n``
        answers gets a stream of its own drawn from it, so an answer does not depend on how the
        rows are batched.
        """
        check_count("n", n)
        if not contexts:
            return []
        rows: list[np.random.Generator] | None = None
        if rngs is not None and not greedy:
            if len(rngs) != len(contexts):
                raise ValueError(f"{len(rngs)} generators for {len(contexts)} contexts")
            rows = [np.random.default_rng(int(s)) for g in rngs for s in g.integers(2**63, size=n)]
        share = self.share_prefix if share_prefix is None else share_prefix
        prompts = [self.prompt_ids(c) for c in contexts]
        if share:
            prefixes = self._prefixes(prompts, keep=keep_prefix)
            answers: list[tuple[list[int], list[float]]] = []
            for group, counts in self._decode_groups(len(prompts), n):
                part = None if rows is None else rows[len(answers) : len(answers) + sum(counts)]
                answers += self._decode(self._assemble([prefixes[i] for i in group], counts), greedy, part)
        else:
            copies = [p for p in prompts for _ in range(n)]
            step = self.decode_batch_size or len(copies)
            answers = []
            for start in range(0, len(copies), step):
                part = copies[start : start + step]
                streams = None if rows is None else rows[start : start + step]
                answers += self._decode(self._assemble(self._prefill(part), [1] * len(part)), greedy, streams)
        if not keep_prefix and not self.across_decisions:
            for p in prompts:
                self._store.pop(p)
        out: list[list[Action]] = []
        for i, prompt in enumerate(prompts):
            row: list[Action] = []
            for ids, lps in answers[i * n : (i + 1) * n]:
                text = self.prompts.decode(ids)
                row.append(Action(text, tuple(ids), tuple(lps), env_action(text, self.config), prompt))
            out.append(row)
        return out

    def _decode_groups(self, n_prompts: int, n: int) -> list[tuple[list[int], list[int]]]:
        """(prompt indices, samples of each) per decoding pass, in output order, with at most
        ``decode_batch_size`` rows a pass (a prompt's ``n`` samples split when ``n`` exceeds it)."""
        cap = self.decode_batch_size or n_prompts * n
        groups: list[tuple[list[int], list[int]]] = []
        group: list[int] = []
        counts: list[int] = []
        for i in range(n_prompts):
            left = n
            while left:
                take = min(left, cap - sum(counts))
                if take == 0:
                    groups.append((group, counts))
                    group, counts = [], []
                    continue
                group.append(i)
                counts.append(take)
                left -= take
        if group:
            groups.append((group, counts))
        return groups

    def sample(self, contexts: Sequence[Context], n: int, rngs: Sequence[np.random.Generator] | None) -> list[list[Action]]:
        """``n`` i.i.d. answers per context (never deduplicated), parsed into env actions;
        ``rngs``: one generator per context (the engine's per-path streams)."""
        out = self.generate(contexts, n, rngs=rngs)
        self.meter.policy_calls += 1
        return out

    def decision_entropy(self, contexts: Sequence[Context]) -> list[float]:
        """Entropy of the policy at each context, before sampling (see the module docstring)."""
        if not self.across_decisions:
            self._store.clear()
        if not contexts:
            return []
        if self.decision_entropy_mode == "probe":
            out = self.probe_entropy(contexts, self.probe_samples, self._probe_generate, lambda text: parse_action(text, self.config))
            self.meter.policy_calls += 1
            return out
        prompts = [self.prompt_ids(c) for c in contexts]
        prefixes = self._prefixes(prompts, keep=True, counter="score_tokens")
        open_ids = tuple(self.prompts.encode(self.config.action_open))
        continuations: list[list[tuple[int, ...]]] = []
        for c in contexts:
            if c.admissible_actions:
                # the answer's last token needs no input: it is scored from the one before
                continuations.append([self.prompts.action_ids(a)[:-1] for a in c.admissible_actions])
            else:
                continuations.append([open_ids])
        logits = self._extend(prefixes, continuations, counter="score_tokens")
        out: list[float] = []
        for c, rows in zip(contexts, logits, strict=True):
            if c.admissible_actions:
                seq = torch.stack([self._sequence_logprob(lg, self.prompts.action_ids(a)) for lg, a in zip(rows, c.admissible_actions, strict=True)])
                logp = seq - torch.logsumexp(seq, 0)
            else:
                logp = self._logp(rows[0][-1])
            out.append(float(-(logp.exp() * logp).sum()))
        self.meter.policy_calls += 1
        return out

    def _probe_generate(self, contexts: Sequence[Context], m: int) -> list[list[Action]]:
        """The probe's completions (the prompts' KV is kept for the backbone's sample)."""
        return self.generate(contexts, m, keep_prefix=True)

    def _sequence_logprob(self, logits: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
        target = torch.tensor(list(ids), device=logits.device)
        return self._logp(logits[: len(ids)]).gather(-1, target[:, None]).sum().double()

    def action_distribution(self, context: Context) -> dict[str, float]:
        """``pi(a | h)`` renormalised over the admissible actions (what the entropy is of)."""
        if not context.admissible_actions:
            raise ValueError("action_distribution needs admissible actions")
        prefix = self._prefixes([self.prompt_ids(context)], keep=False)
        answers = [self.prompts.action_ids(a) for a in context.admissible_actions]
        rows = self._extend(prefix, [[a[:-1] for a in answers]])[0]
        seq = torch.stack([self._sequence_logprob(lg, a) for lg, a in zip(rows, answers, strict=True)])
        return dict(zip(context.admissible_actions, (seq - torch.logsumexp(seq, 0)).exp().tolist(), strict=True))

    def _token_logprobs(self, model: nn.Module, steps: Sequence[StepLike]) -> torch.Tensor:
        rows: list[torch.Tensor] = []
        for start in range(0, len(steps), self.train_batch_size):
            chunk = steps[start : start + self.train_batch_size]
            prompts = [s.action.prompt_token_ids or self.prompt_ids(s.context) for s in chunk]
            answers = [tuple(s.action.token_ids) for s in chunk]
            if any(not a for a in answers):
                raise ValueError("a recorded action has no token ids")
            ids, mask, positions = self._left_pad([(*p, *a) for p, a in zip(prompts, answers, strict=True)])
            keep = max(len(a) for a in answers) + 1
            logits = model(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                position_ids=positions.to(self.device),
                use_cache=False,
                logits_to_keep=keep,
            ).logits
            logp = self._logp(logits)
            for i, a in enumerate(answers):
                # answer token t sits at -len(a)+t; it is predicted by the logits one earlier
                pred = logp[i, keep - 1 - len(a) : keep - 1]
                rows.append(pred.gather(-1, torch.tensor(a, device=pred.device)[:, None]).squeeze(-1))
        return pad_token_rows(rows) if rows else torch.zeros(0, 0)

    def token_logprobs(self, steps: Sequence[StepLike]) -> torch.Tensor:
        """Differentiable ``[n_steps, max_action_tokens]`` log-probs, zero-padded (steps or a Batch)."""
        self._store.clear()
        return self._token_logprobs(self.model, as_steps(steps))

    # ---- reference policy (k3 KL) --------------------------------------------------------
    def set_reference(self) -> None:
        """Freeze the current weights as the reference (LoRA: the base model is the reference)."""
        if self.lora:
            return
        if self.reference_offload:
            self._reference = offloaded_copy(self.model, lambda: self.device, self.reference_dtype)
            return
        self._reference = copy.deepcopy(self.model).requires_grad_(False).eval()
        if self.reference_dtype is not None:
            self._reference.to(dtype=self.reference_dtype)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False):  # type: ignore[override]
        self._prepare_reference_load(state_dict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @torch.no_grad()
    def reference_token_logprobs(self, steps: Sequence[StepLike]) -> torch.Tensor:
        """Per-token log-probs under the reference policy (no gradient)."""
        steps = as_steps(steps)
        if self.lora:
            with self.model.disable_adapter():
                return self._token_logprobs(self.model, steps)
        if self._reference is None:
            self.set_reference()
        assert self._reference is not None
        return self._token_logprobs(self._reference, steps)
