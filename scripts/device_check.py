"""One BPO and one RLOO update on WebShop with the ``gpu-lora`` settings, at a real model shape.

Nothing can be downloaded on a lent GPU, so the models are built here with random weights from
the bundled configs (``bpo_algos/model_configs``: Qwen2.5-7B-Instruct and a Qwen2.5-1.5B shape),
with the tiny offline tokenizer (its ids are a subset of the model's vocabulary). The settings
are the ``gpu-lora`` preset's (docs/paper-setting.md): LoRA r=8 on every linear map over a
bf16 base, fp32 adapters (master weights), bf16 autocast, gradient checkpointing, micro-batched
backward, the k3 KL at 0.01 (the reference is the base with the adapter off), reasoning replies
(``<think>`` then ``<action>``) with the probe decision entropy, verl-agent's WebShop reward.
A random model never writes a stop token, so every reply runs to ``--max-new-tokens``: the
worst case of the memory plan's KV and activation terms.

Prints one JSON object: per shape and algorithm the peak GPU memory measured
(``torch.cuda.max_memory_allocated``) against ``bpo-memory-plan``'s prediction for the same
settings (rows decoded at once, longest sequence, micro-batch; the plan's reserve left out)
and their ratio, generated and trained tokens per second, seconds per update, and each phase's
share of it (generation, decision-entropy scoring, the KL reference pass, the rest of
collection = envs and engine, and the update = loss, backward, optimizer), plus the weight
change of the update. ``--device cpu`` (CI) runs the tiny offline Qwen2 the same way.

Run through ``scripts/device_check.sh`` (it checks what is installed first).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import gymnasium as gym
import torch

import bpo_envs  # noqa: F401
from baselines import RLOO
from bpo_algos import BPO, Trainer, TrainerConfig
from bpo_algos.advantages import as_batch
from bpo_algos.memory_plan import GB, load_config, plan
from bpo_algos.policy import HFPolicy, PromptConfig
from bpo_algos.policy.tiny import tiny_model_path
from bpo_envs.reward_settings import REWARD_SETTINGS

SHAPES = {"1.5b": "qwen2.5-1.5b-instruct", "7b": "qwen2.5-7b-instruct"}
LORA_RANK = 8
KL_COEF = 0.01


def force_advantages(algorithm: Any) -> None:
    """Advantages +-1 by step parity after the real estimator ran: an untrained model's rewards
    are all equal (zero advantages), and the check must see an update that moves weights."""
    estimate = algorithm.compute_advantages

    def signed(trees: Any) -> None:
        estimate(trees)
        for tree in as_batch(trees):
            for i, edge in enumerate(tree.edges()):
                edge.advantage = 1.0 if i % 2 else -1.0

    algorithm.compute_advantages = signed


def build_model(shape: str, device: str, model_path: str | None) -> tuple[Any, dict[str, Any]]:
    """A transformers model (random weights from a bundled config, or ``model_path`` / the tiny
    offline Qwen2 for ``shape="tiny"``) and its config as a dict (for the memory plan)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if shape == "tiny" or model_path:
        # the CPU check keeps an fp32 base (bf16 matmuls are slow on CPUs); adapters are fp32 either way
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_path or str(tiny_model_path()), dtype=dtype)
        return model, model.config.to_dict()
    config = load_config(SHAPES[shape])
    fields = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("architectures", "torch_dtype", "model_type")}
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **fields), dtype=torch.bfloat16)
    return model, config


class Phases:
    """Seconds spent in the policy's generation, scoring and reference passes (wrapped)."""

    def __init__(self, policy: HFPolicy) -> None:
        self.seconds = {"generation": 0.0, "scoring": 0.0, "reference": 0.0}
        self.decode_rows = 0
        self.longest_prompt = 0
        self._depth = 0
        for method, phase in (("generate", "generation"), ("decision_entropy", "scoring"), ("reference_token_logprobs", "reference")):
            self._wrap(policy, method, phase)
        generate = policy.generate

        def recording(contexts: Any, n: int, *a: Any, **k: Any) -> Any:
            self.decode_rows = max(self.decode_rows, len(contexts) * n)
            self.longest_prompt = max([self.longest_prompt, *(len(policy.prompt_ids(c)) for c in contexts)])
            return generate(contexts, n, *a, **k)

        policy.generate = recording  # type: ignore[method-assign]

    def _wrap(self, policy: HFPolicy, method: str, phase: str) -> None:
        inner = getattr(policy, method)

        def timed(*a: Any, **k: Any) -> Any:
            outer = self._depth == 0
            self._depth += 1
            start = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                self._depth -= 1
                if outer:  # a probe's completions count as scoring: its caller is timing them
                    self.seconds[phase] += time.perf_counter() - start

        setattr(policy, method, timed)


def one_update(name: str, algorithm: Any, args: argparse.Namespace, shape: str) -> dict[str, Any]:
    from transformers import AutoTokenizer

    device = args.device
    cuda = device.startswith("cuda")
    if not args.real_advantages:
        force_advantages(algorithm)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    built = time.perf_counter()
    model, config = build_model(shape, device, args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    policy = HFPolicy(
        model, tokenizer, lora={"r": LORA_RANK}, max_new_tokens=args.max_new_tokens, device=device, seed=0, decode_batch_size=64,
        prompt=PromptConfig(reasoning=True), decision_entropy="probe", probe_samples=args.probe_samples,
        max_model_len=4096 + 512, score_batch_size=64,
    )
    build_seconds = time.perf_counter() - built
    phases = Phases(policy)

    def make() -> gym.Env:
        return gym.make("BPO-WebShop-v0", max_episode_steps=args.max_steps, **REWARD_SETTINGS["verl-agent"])

    tasks = list(make().unwrapped.task_ids())[: args.trees]
    trainer = Trainer(algorithm, policy, [make] * 2, tasks, TrainerConfig(
        updates=1, tasks_per_update=args.trees, learning_rate=1e-5, optimizer="adamw", max_grad_norm=1.0, seed=0, device=device,
        precision="bf16", gradient_checkpointing=True, micro_batch_tokens=args.micro_batch_tokens,
    ))
    seen: dict[str, Any] = {}
    collect = algorithm.collect

    def recording_collect(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        seen["batch"] = collect(*a, **k)
        seen["collect_seconds"] = time.perf_counter() - start
        return seen["batch"]

    algorithm.collect = recording_collect  # type: ignore[method-assign]
    before = [p.detach().clone() for p in trainer._trainable()]
    if cuda:
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()
    start = time.perf_counter()
    row = trainer.step()
    if cuda:
        torch.cuda.synchronize()
    total = time.perf_counter() - start
    batch = seen["batch"]
    collect_s = seen["collect_seconds"]
    update_s = max(total - collect_s, 1e-9)
    trained = sum(len(s.action.prompt_token_ids) + len(s.action.token_ids) for s in batch.steps)
    delta_sq, moved, live = 0.0, 0, 0
    for p, b in zip(trainer._trainable(), before, strict=True):
        d = (p.detach() - b).float()
        delta_sq += float((d * d).sum())
        if p.grad is not None:
            g = p.grad.abs() > 0
            live += int(g.sum())
            moved += int(((d != 0) & g).sum())
    seconds = dict(phases.seconds)
    seconds["envs_and_engine"] = max(collect_s - sum(seconds.values()), 0.0)
    seconds["update"] = update_s
    predicted = plan(
        config, gpus=1, gpu_gb=141.0, lora=True, lora_rank=LORA_RANK, kl=True, micro_batch_tokens=args.micro_batch_tokens,
        decode_rows=max(phases.decode_rows, 1), seq_len=phases.longest_prompt + args.max_new_tokens, reserve_gb=0.0, name=shape,
    )
    peak = torch.cuda.max_memory_allocated() / GB if cuda else None
    out = {
        "shape": shape,
        "algorithm": name,
        "params_b": predicted.params_b,
        "trees": row["n_trees"],
        "steps": row["n_steps"],
        "gen_tokens": int(batch.compute.gen_tokens),
        "score_tokens": int(batch.compute.score_tokens),
        "generated_tokens_per_s": batch.compute.gen_tokens / max(seconds["generation"], 1e-9),
        "trained_tokens": trained,
        "trained_tokens_per_s": trained / update_s,
        "seconds_per_update": total,
        "phase_seconds": seconds,
        "phase_share": {k: v / total for k, v in seconds.items()},
        "build_seconds": build_seconds,
        "peak_gpu_memory_gb": peak,
        "resident_before_update_gb": resident / GB if cuda else None,
        "plan_gb": predicted.total,
        "plan": {k: getattr(predicted, k) for k in ("weights", "gradients", "optimizer", "reference", "activations", "kv_cache")},
        "plan_settings": predicted.settings,
        "peak_over_plan": peak / predicted.total if peak is not None else None,
        "weight_change_l2": delta_sq**0.5,
        "weights_moved_share": moved / live if live else None,
        "grad_norm": row["grad_norm"],
        "loss": row["loss"],
        "gradient_checkpointing": policy.gradient_checkpointing,
        "master_dtype": str(next(iter(trainer._trainable())).dtype),
        "advantages": "estimated" if args.real_advantages else "forced +-1 (an untrained model's rewards are equal)",
    }
    del trainer, policy, model
    if cuda:
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", nargs="+", choices=("tiny", *SHAPES), default=None,
                        help="model shapes (default: 1.5b 7b on CUDA, tiny on CPU)")
    parser.add_argument("--model", default=None, help="a model folder to use instead (weights loaded from it)")
    parser.add_argument("--quick", action="store_true", help="a shorter run (about 2 minutes on one H200): 1.5b and 7b "
                        "with 128-token replies, 2-step episodes, 2 trees")
    parser.add_argument("--trees", type=int, default=None, help="trees per update (default 4 on CUDA, 2 with --quick or on CPU)")
    parser.add_argument("--max-steps", type=int, default=None, help="WebShop step limit (default 3 on CUDA, 2 with --quick or on CPU)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="reply limit (default 512 on CUDA: verl-agent's; 128 with --quick; 16 on CPU)")
    parser.add_argument("--probe-samples", type=int, default=None, help="completions per probe entropy (default 4; 2 on CPU)")
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--real-advantages", action="store_true", help="keep the estimator's advantages (all zero for an untrained model)")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda but CUDA is not available; pass --device cpu")
    cuda = args.device.startswith("cuda")
    short = args.quick or not cuda
    args.shapes = args.shapes or (list(SHAPES) if cuda else ["tiny"])
    args.trees = args.trees or (2 if short else 4)
    args.max_steps = args.max_steps or (2 if short else 3)
    args.max_new_tokens = args.max_new_tokens or (512 if cuda and not args.quick else 128 if cuda else 16)
    args.probe_samples = args.probe_samples or (4 if cuda else 2)
    start = time.perf_counter()
    results = []
    for shape in args.shapes:
        results.append(one_update("bpo", BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, max_branch_points=1, kl_coef=KL_COEF), args, shape))
        results.append(one_update("rloo", RLOO(group_size=4, kl_coef=KL_COEF), args, shape))
    out = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "settings": {
            "preset": "gpu-lora", "lora_rank": LORA_RANK, "kl_coef": KL_COEF, "reasoning": True, "decision_entropy": "probe",
            "probe_samples": args.probe_samples, "max_new_tokens": args.max_new_tokens, "max_steps": args.max_steps,
            "trees": args.trees, "micro_batch_tokens": args.micro_batch_tokens, "precision": "bf16", "gradient_checkpointing": True,
        },
        "seconds": time.perf_counter() - start,
        "updates": results,
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
