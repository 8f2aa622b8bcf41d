"""Token ids of the prompts every LLM policy (HF, vLLM, SFT) sends: :class:`PromptBuilder`.

The chat format itself (:class:`~bpo_envs.prompting.PromptConfig`, ``build_messages``,
``parse_action``, ``env_action``, ``format_action``, ``render_chat``) lives in
:mod:`bpo_envs.prompting`, so the trainer integrations in ``bpo_envs.integrations`` show the
same prompts. A prompt is a system + user chat rendered with the tokenizer's chat template; the
model answers with one action between configurable tags, ``<action>...</action>`` by default.

Nothing here imports ``transformers``: a tokenizer is any object with ``apply_chat_template``
(optional), ``__call__``/``encode`` and ``eos_token_id``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from bpo_algos.policy.base import Context
from bpo_envs.prompting import PromptConfig, build_messages, format_action, render_chat


class PromptBuilder:
    """Token ids of prompts and of formatted actions for one tokenizer (with a small LRU cache).

    Args:
        tokenizer: a ``transformers`` tokenizer (or anything with the same calls).
        config: the prompt format.
        cache_size: prompts remembered (paths revisit the same contexts: entropy, then sampling,
            then the loss).
    """

    def __init__(self, tokenizer: Any, config: PromptConfig = PromptConfig(), cache_size: int = 4096) -> None:  # noqa: B008  (frozen)
        self.tokenizer = tokenizer
        self.config = config
        self._cache: OrderedDict[Context, tuple[int, ...]] = OrderedDict()
        self._cache_size = cache_size
        eos = getattr(tokenizer, "eos_token_id", None)  # third-party: any tokenizer-like object; a clear error below if it has none
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id: a policy needs a stop token")
        self.eos_token_id = int(eos)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_text(self, context: Context) -> str:
        return render_chat(self.tokenizer, build_messages(context, self.config))

    def prompt_ids(self, context: Context) -> tuple[int, ...]:
        """Token ids of the prompt for ``context`` (chat template, generation prompt included)."""
        try:
            ids = self._cache.get(context)
        except TypeError:  # an unhashable task id: no caching
            return tuple(self.encode(self.prompt_text(context)))
        if ids is None:
            ids = tuple(self.encode(self.prompt_text(context)))
            self._cache[context] = ids
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(context)
        return ids

    def action_ids(self, action: str) -> tuple[int, ...]:
        """Token ids of the answer stating ``action``, ending with the stop token."""
        return (*self.encode(format_action(action, self.config)), self.eos_token_id)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
