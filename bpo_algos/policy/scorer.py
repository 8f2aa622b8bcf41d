"""``TextScorerPolicy``: a small neural policy that scores each admissible action's text.

A DRRN-style model (He et al., 2016, "Deep Reinforcement Learning with a Natural Language
Action Space"): the context and every admissible action are encoded as bags of hashed word
unigrams and bigrams through one shared ``nn.EmbeddingBag``, and a two-layer network scores
each action from its vector, its interactions with the context, and four word-overlap
features. ``pi(a | h) = softmax(s(h, a) / T)`` over the admissible actions
(:class:`~bpo_algos.policy.choice.ChoicePolicy`).

Inputs for context ``h`` and action ``a``:

* ``t`` (task: the reset observation), ``o`` (current observation), ``r`` (the last
  ``history`` actions), ``a`` (the action's text) and ``m`` (its *mention*: the observation text
  that follows the action's argument, e.g. a product title after ``click[b0...]`` in a WebShop
  result list, cut where the next admissible argument is mentioned);
* ``s(h, a) = w2 . tanh(W1 [a, m, a*t, a*o, m*t, a*r, f] + b1)``, with ``f`` = the share of
  ``a``'s words in the task and in the observation, the share of ``m``'s words in the task, and
  whether ``a`` is one of the last ``history`` actions.

With ``memory="alfworld"`` the features ``f`` also hold what the episode has shown so far
(:mod:`bpo_algos.policy.episode_memory`: receptacles visited and opened, where the task's objects
were seen, what is held and whether it was heated / cooled / cleaned, what was placed, how often
the action was taken), read from the context's observations and actions only: the task,
the last observation and the last few actions alone cannot tell a searched receptacle from an
unsearched one.

It has no notion of tokens: an action is one token (its index), so ``gen_tokens`` counts
actions. With ~1M parameters a forward pass over a context costs well under a millisecond on a
CPU, which is what lets the CPU comparison train a model warm-started from the env experts.
Hashing uses CRC32, so features are the same in every process.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from functools import lru_cache

import torch
from torch import nn

from bpo_algos.policy.base import Context
from bpo_algos.policy.choice import ChoicePolicy
from bpo_algos.policy.episode_memory import MEMORY_FEATURES, context_features
from bpo_envs.validation import check_count

_WORD = re.compile(r"[a-z0-9]+")
_ARGUMENT = re.compile(r"^\s*[\w ]+\[(.+)\]\s*$", re.DOTALL)
N_FEATURES = 4
MEMORIES = (None, "alfworld")


@lru_cache(maxsize=1 << 16)
def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


@lru_cache(maxsize=1 << 16)
def hashed_ngrams(text: str, buckets: int) -> tuple[int, ...]:
    """Bucket ids of the lower-cased word unigrams and bigrams of ``text`` (CRC32 mod ``buckets``)."""
    words = _WORD.findall(text.lower())
    grams = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
    return tuple(zlib.crc32(g.encode()) % buckets for g in grams)


def _argument(action: str) -> str | None:
    match = _ARGUMENT.match(action)
    return match.group(1).strip().lower() if match else None


@lru_cache(maxsize=1 << 14)
def mentions(observation: str, actions: tuple[str, ...], max_chars: int) -> tuple[str, ...]:
    """For each action ``verb[arg]``, the observation text after ``arg`` up to the next mention
    of another action's argument (at most ``max_chars``); "" where there is none."""
    lowered = observation.lower()
    found: dict[int, int] = {}  # action index -> end of its argument in the observation
    starts = []
    for i, action in enumerate(actions):
        arg = _argument(action)
        if not arg:
            continue
        at = lowered.find(arg)
        if at >= 0:
            found[i] = at + len(arg)
            starts.append(at)
    starts.sort()
    out = []
    for i in range(len(actions)):
        if i not in found:
            out.append("")
            continue
        end = found[i]
        stop = next((s for s in starts if s >= end), len(observation))
        out.append(observation[end : min(stop, end + max_chars)])
    return tuple(out)


class TextScorerPolicy(ChoicePolicy):
    """A bag-of-n-grams action scorer (see the module docstring).

    Args:
        buckets: hashed n-gram vocabulary size.
        dim: embedding size.
        hidden: hidden units of the scoring network.
        history: how many past actions form the ``r`` input (and the repeat feature).
        max_chars: the task and observation are read up to this many characters.
        mention_chars: the longest mention of an action.
        temperature: sampling temperature (part of the policy's distribution).
        seed: seeds the initial weights and sampling.
        memory: ``None`` (default) or ``"alfworld"``: also score each action with
            :data:`~bpo_algos.policy.episode_memory.MEMORY_FEATURES` (see the module docstring).
    """

    def __init__(
        self,
        *,
        buckets: int = 1 << 15,
        dim: int = 32,
        hidden: int = 64,
        history: int = 3,
        max_chars: int = 4000,
        mention_chars: int = 200,
        temperature: float = 1.0,
        seed: int = 0,
        memory: str | None = None,
    ) -> None:
        super().__init__(temperature=temperature, seed=seed)
        if memory not in MEMORIES:
            raise ValueError(f"memory must be one of {MEMORIES}, got {memory!r}")
        self.memory = memory
        for name, value in (("buckets", buckets), ("dim", dim), ("hidden", hidden), ("max_chars", max_chars), ("mention_chars", mention_chars)):
            check_count(name, value)
        check_count("history", history, 0)
        self.buckets, self.history = buckets, history
        self.max_chars, self.mention_chars = max_chars, mention_chars
        generator = torch.Generator().manual_seed(seed)
        self.embedding = nn.EmbeddingBag(buckets, dim, mode="mean")
        self.n_features = N_FEATURES + (len(MEMORY_FEATURES) if memory else 0)
        self.hidden = nn.Linear(6 * dim + self.n_features, hidden)
        # no output bias: it adds the same constant to every action's score, which the softmax
        # cancels, so its gradient is zero and only float rounding would move it (and Adam
        # turns that rounding into full-size steps: runs on 1 and N ranks would then differ)
        self.out = nn.Linear(hidden, 1, bias=False)
        with torch.no_grad():
            self.embedding.weight.copy_(torch.randn(buckets, dim, generator=generator))
            for layer in (self.hidden, self.out):
                bound = layer.in_features**-0.5
                layer.weight.uniform_(-bound, bound, generator=generator)
            self.hidden.bias.zero_()

    def _bags(self, texts: Sequence[str]) -> torch.Tensor:
        """``[len(texts), dim]`` mean embeddings of the texts' n-grams (zeros for none)."""
        ids: list[int] = []
        offsets: list[int] = []
        for text in texts:
            offsets.append(len(ids))
            ids.extend(hashed_ngrams(text[: self.max_chars], self.buckets))
        return self.embedding(torch.tensor(ids, dtype=torch.long), torch.tensor(offsets, dtype=torch.long))

    def scores(self, contexts: Sequence[Context]) -> list[torch.Tensor]:
        if not contexts:
            return []
        state_texts: list[str] = []
        action_texts: list[str] = []
        features: list[list[float]] = []
        sizes: list[int] = []
        for c in contexts:
            actions = c.admissible_actions or ()
            task = c.initial_observation or c.observation
            recent = [turn.action for turn in c.history[len(c.history) - self.history :]] if self.history else []
            state_texts += [task, c.observation, "\n".join(recent)]
            task_words, obs_words = _words(task[: self.max_chars]), _words(c.observation[: self.max_chars])
            memory = context_features(c, actions) if self.memory else [[] for _ in actions]
            for action, mention, remembered in zip(actions, mentions(c.observation, actions, self.mention_chars), memory, strict=True):
                action_texts += [action, mention]
                a_words, m_words = _words(action), _words(mention)
                features.append([
                    len(a_words & task_words) / max(len(a_words), 1),
                    len(a_words & obs_words) / max(len(a_words), 1),
                    len(m_words & task_words) / max(len(m_words), 1),
                    float(action in recent),
                    *remembered,
                ])
            sizes.append(len(actions))
        states = self._bags(state_texts).view(len(contexts), 3, -1)
        pairs = self._bags(action_texts).view(len(features), 2, -1)
        per_action = torch.repeat_interleave(states, torch.tensor(sizes), dim=0)
        t, o, r = per_action[:, 0], per_action[:, 1], per_action[:, 2]
        a, m = pairs[:, 0], pairs[:, 1]
        x = torch.cat([a, m, a * t, a * o, m * t, a * r, torch.tensor(features)], dim=-1)
        flat = self.out(torch.tanh(self.hidden(x))).squeeze(-1)
        return list(torch.split(flat, sizes))
