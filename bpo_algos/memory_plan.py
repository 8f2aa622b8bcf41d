"""``bpo-memory-plan``: GPU memory of a training configuration, from a model's config.json only.

Per GPU, in bytes (``P`` parameters, ``A`` LoRA adapter parameters, ``N`` GPUs, ``L`` layers,
``h`` hidden size, ``i`` MLP size, ``V`` vocabulary, ``kv`` = key/value heads x head size):

* **weights**: full fine-tune: fp32 master weights ``4P`` (FSDP: ``4P / N`` plus the full model
  gathered in bf16, ``2P``: ``TrainerConfig(fsdp=True)`` holds it from collection to the end of
  the update); LoRA: the frozen base in bf16 ``2P`` (every GPU holds it) + ``4A``.
* **gradients**: ``4P`` (FSDP: ``/ N``) or ``4A``.
* **optimizer**: AdamW's two fp32 moments, ``8P`` (FSDP: ``/ N``) or ``8A``.
* **reference** (``--kl``): a frozen bf16 copy ``2P`` (not sharded by FSDP), or, offloaded
  (``--reference-offload``, ``HFPolicy(reference_offload=True)``, as verl-agent's recipes set
  ``ref.fsdp_config.param_offload=True``), held in host memory and streamed to the GPU one
  module at a time for the reference pass: the GPU holds at most the two largest modules,
  ``2 x 2 max(V h, layer)`` bytes (an embedding or ``lm_head`` for a large vocabulary; host
  memory ``2P`` per process). LoRA needs none (the reference is the base with the adapter off).
* **activations** of one micro-batch of ``T`` tokens with gradient checkpointing: the layer
  inputs ``2 L T h`` plus one layer recomputed, ``T (34 h + 6 i)`` bytes (bf16; flash
  attention, no ``s^2`` term), plus fp32 log-softmax over the answer tokens ``8 T_a V``.
* **KV cache** of decoding ``R`` rows of ``S`` tokens: ``R S (2 L kv) 2`` bytes (bf16).
* **generation weights** (``--vllm``): vLLM's own bf16 copy ``2P`` of the model.

``fits`` when the total is under ``gpu_gb`` minus a reserve (CUDA context, allocator
fragmentation; default 6 GB). The estimate is meant for choosing a configuration, not for
billing bytes: measured peaks (``scripts/device_check.sh``) should stay within ~15% of it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from bpo_envs.console import ends_on_ctrl_c

GB = 1e9
BUNDLED = {
    "qwen2.5-7b-instruct": "qwen2.5-7b-instruct.json",
    "qwen2.5-1.5b-instruct": "qwen2.5-1.5b-instruct.json",
    "llama-3.1-8b-instruct": "llama-3.1-8b-instruct.json",
}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that decide its memory."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = False
    attention_bias: bool = False
    max_len: int = 4096

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in config]
        if missing:
            raise ValueError(f"model config lacks {missing} (a decoder-only transformers config.json is needed)")
        return cls(
            hidden=int(config["hidden_size"]),
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=int(config["num_attention_heads"]),
            kv_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
            vocab=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
            max_len=int(config.get("max_position_embeddings", 4096)),
        )

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    def layer_linears(self) -> list[tuple[int, int]]:
        """(in, out) of each linear map of one decoder layer (q, k, v, o, gate, up, down)."""
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        return [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]

    def layer_params(self) -> int:
        bias = (self.hidden + 2 * self.kv_dim) if self.attention_bias else 0
        return sum(a * b for a, b in self.layer_linears()) + bias + 2 * self.hidden

    def params(self) -> int:
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.layer_params() + embed + self.hidden

    def lora_params(self, rank: int) -> int:
        """Adapters of rank ``rank`` on every linear map of every layer ("all-linear")."""
        return self.layers * sum(rank * (a + b) for a, b in self.layer_linears())

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_dim * 2


def load_config(model: str | Path) -> dict[str, Any]:
    """A config.json path, a folder holding one, or a bundled name (:data:`BUNDLED`)."""
    key = str(model).lower()
    if key in BUNDLED:
        text = resources.files("bpo_algos.model_configs").joinpath(BUNDLED[key]).read_text()
        return json.loads(text)
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model}: not a config.json, a folder with one, or one of {sorted(BUNDLED)}")
    return json.loads(path.read_text())


def model_name(model: str | Path) -> str:
    """A short label: the bundled name, the folder's name, or the config file's folder's name."""
    if str(model).lower() in BUNDLED:
        return str(model).lower()
    path = Path(model)
    return path.parent.name if path.name == "config.json" else path.name


@dataclass
class MemoryPlan:
    """Per-GPU memory (GB) of one configuration, and whether it fits."""

    model: str
    params_b: float
    gpus: int
    gpu_gb: float
    mode: str
    weights: float
    gradients: float
    optimizer: float
    reference: float
    activations: float
    kv_cache: float
    generation_weights: float
    total: float
    fits: bool
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(
    config: dict[str, Any],
    *,
    gpus: int = 1,
    gpu_gb: float = 80.0,
    lora: bool = False,
    lora_rank: int = 8,
    fsdp: bool | None = None,
    kl: bool = False,
    micro_batch_tokens: int = 8192,
    answer_share: float = 0.1,
    decode_rows: int = 64,
    seq_len: int = 4096,
    reserve_gb: float = 6.0,
    vllm: bool = False,
    reference_offload: bool = False,
    name: str = "model",
) -> MemoryPlan:
    """The memory plan (module docstring). ``fsdp`` None: shard a full fine-tune when ``gpus > 1``."""
    if gpus < 1 or gpu_gb <= 0:
        raise ValueError(f"need gpus >= 1 and gpu_gb > 0, got {gpus}, {gpu_gb}")
    m = ModelShape.from_config(config)
    p = m.params()
    shard = (gpus > 1) if fsdp is None else fsdp
    if lora:
        shard = False  # the bf16 base is replicated; the adapters are small
        a = m.lora_params(lora_rank)
        weights, grads, optim, ref = 2 * p + 4 * a, 4 * a, 8 * a, 0
        mode = f"LoRA r={lora_rank}, bf16 base"
    else:
        div = gpus if shard else 1
        gathered = 2 * p if shard else 0
        weights, grads, optim = 4 * p / div + gathered, 4 * p / div, 8 * p / div
        largest = max(m.vocab * m.hidden, m.layer_params())
        ref = (2 * 2 * largest if reference_offload else 2 * p) if kl else 0
        mode = "full, fp32 master" + (f", FSDP over {gpus}" if shard else "") + ((", KL ref offloaded" if reference_offload else ", KL ref") if kl else "")
    t = micro_batch_tokens
    acts = 2 * m.layers * t * m.hidden + t * (34 * m.hidden + 6 * m.intermediate) + 8 * int(t * answer_share) * m.vocab
    kv = decode_rows * seq_len * m.kv_bytes_per_token()
    gen = 2 * p if vllm else 0
    total = weights + grads + optim + ref + acts + kv + gen
    return MemoryPlan(
        model=name,
        params_b=p / 1e9,
        gpus=gpus,
        gpu_gb=gpu_gb,
        mode=mode,
        weights=weights / GB,
        gradients=grads / GB,
        optimizer=optim / GB,
        reference=ref / GB,
        activations=acts / GB,
        kv_cache=kv / GB,
        generation_weights=gen / GB,
        total=total / GB,
        fits=total / GB <= gpu_gb - reserve_gb,
        settings={
            "micro_batch_tokens": t, "decode_rows": decode_rows, "seq_len": seq_len, "kl": kl, "vllm": vllm, "reserve_gb": reserve_gb,
            "reference_offload": bool(reference_offload and kl and not lora),
        },
    )


def markdown(plans: list[MemoryPlan]) -> str:
    """A Markdown table of ``plans`` (GB per GPU)."""
    head = "| model | GPUs | mode | weights | grads | optim | ref | activ. | KV | vLLM copy | total / GPU | fits |\n"
    head += "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    rows = [
        f"| {x.model} ({x.params_b:.2f}B) | {x.gpus}x{x.gpu_gb:g} GB | {x.mode} | {x.weights:.1f} | {x.gradients:.1f} | "
        f"{x.optimizer:.1f} | {x.reference:.1f} | {x.activations:.1f} | {x.kv_cache:.1f} | {x.generation_weights:.1f} | {x.total:.1f} | {'yes' if x.fits else 'no'} |"
        for x in plans
    ]
    return head + "\n".join(rows) + "\n"


def preset_config(policy: str) -> dict[str, Any] | None:
    """The model config of a preset's policy: a bundled config by the model's name
    (``Qwen/Qwen2.5-7B-Instruct`` -> ``qwen2.5-7b-instruct``), a folder's config.json, or None."""
    key = str(policy).rsplit("/", 1)[-1].lower()
    if key in BUNDLED:
        return load_config(key)
    path = Path(policy)
    if (path / "config.json").is_file() or (path.name == "config.json" and path.is_file()):
        return load_config(path)
    return None


def preset_plans(preset: Any) -> dict[str, MemoryPlan]:
    """The memory plan of every env of a GPU comparison (``preset``: its resolved settings,
    ``bpo_experiments.run_config.ComparisonConfig``, with ``gpus`` set), from each env's settings:
    ``gpus x gpu_gb``, LoRA or a full fine-tune (FSDP when ``trainer.fsdp``), the KL reference
    (``shared.kl_coef > 0``; offloaded with ``reference_offload``), vLLM's copy, ``trainer.micro_batch_tokens``,
    ``pool_size`` decoding rows of ``max_model_len`` tokens. Empty for a CPU preset or a model
    whose config is not known here."""
    if not preset.gpus:
        return {}
    out = {}
    for name, env in preset.envs.items():
        policy, trainer = env.policy, env.trainer
        config = preset_config(policy.policy)
        if config is None:
            continue
        seq_len = policy.max_model_len or ModelShape.from_config(config).max_len
        out[name] = plan(
            config, gpus=preset.gpus, gpu_gb=preset.gpu_gb, lora=policy.lora, fsdp=trainer.fsdp if preset.gpus > 1 else False,
            kl=preset.shared.kl_coef > 0, micro_batch_tokens=trainer.micro_batch_tokens or 8192, decode_rows=env.pool_size,
            seq_len=seq_len, vllm=policy.vllm, reference_offload=policy.reference_offload,
            name=model_name(policy.policy.rsplit("/", 1)[-1].lower()),
        )
    return out


def check_preset_fits(preset: Any, name: str = "preset") -> dict[str, MemoryPlan]:
    """Raise ``ValueError`` (with the plan's table) when a GPU preset does not fit its GPUs."""
    plans = preset_plans(preset)
    bad = {env: p for env, p in plans.items() if not p.fits}
    if bad:
        raise ValueError(
            f"the {name} preset does not fit {preset.gpus} x {preset.gpu_gb:g} GB on {sorted(bad)} (bpo-memory-plan):\n"
            + markdown(list(bad.values()))
            + "give more GPUs (--gpus / --gpu-gb), LoRA, a smaller --micro-batch-tokens or --pool-size"
        )
    return plans


@ends_on_ctrl_c("bpo-memory-plan")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bpo-memory-plan", description="GPU memory of a training configuration from a model config.json (no weights downloaded).")
    parser.add_argument("--model", required=True, help=f"config.json, a model folder, or one of {sorted(BUNDLED)}")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--gpu-gb", type=float, default=80.0)
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--lora-rank", type=int, default=8, help="adapter rank (HFPolicy default 8)")
    parser.add_argument("--no-fsdp", action="store_true", help="do not shard a full fine-tune over the GPUs")
    parser.add_argument("--kl", action="store_true", help="a frozen reference copy for the k3 KL")
    parser.add_argument("--reference-offload", action="store_true", help="the KL reference in host memory, streamed a module at a time")
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--decode-rows", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--vllm", action="store_true", help="count vLLM's bf16 copy of the model (colocated generation)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    result = plan(
        load_config(args.model), gpus=args.gpus, gpu_gb=args.gpu_gb, lora=args.lora, lora_rank=args.lora_rank,
        fsdp=False if args.no_fsdp else None, kl=args.kl, micro_batch_tokens=args.micro_batch_tokens,
        decode_rows=args.decode_rows, seq_len=args.seq_len, vllm=args.vllm, reference_offload=args.reference_offload,
        name=model_name(args.model),
    )
    print(json.dumps(result.to_dict(), indent=1) if args.json else markdown([result]), end="")
    if not result.fits:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
