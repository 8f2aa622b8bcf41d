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
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
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
    return tuple(_ngram_ids(text, buckets).tolist())


def _ngram_ids(text: str, buckets: int) -> np.ndarray:
    """:func:`hashed_ngrams` as an int64 array, hashed through ``map`` (no Python loop)."""
    words = _WORD.findall(text.lower())
    grams = words + list(map(" ".join, zip(words, words[1:], strict=False)))
    crc = np.fromiter(map(zlib.crc32, map(str.encode, grams)), dtype=np.int64, count=len(grams))
    return crc % buckets


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
        after = bisect_left(starts, end)  # the first mention that starts at or after ``end``
        stop = starts[after] if after < len(starts) else len(observation)
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

    _kept_inputs: dict[int, tuple[Context, _Inputs]] | None = None
    """Inside :meth:`inputs_kept`: each scored context's inputs, by the context object."""

    @contextmanager
    def inputs_kept(self) -> Iterator[None]:
        """Within the block, what :meth:`scores` derives from a context object (its bags, its
        word-overlap, repeat and memory features) is kept and reused whenever the same object
        is scored again: behaviour cloning's epochs over the same demos derive them once. The
        inputs depend on the context's text alone, never on the weights, so the scores are the
        same numbers; outside the block nothing is kept."""
        outer, self._kept_inputs = self._kept_inputs, {} if self._kept_inputs is None else self._kept_inputs
        try:
            yield
        finally:
            self._kept_inputs = outer

    def _inputs(self, c: Context) -> _Inputs:
        """What the scoring pass reads from context ``c`` (kept by id inside :meth:`inputs_kept`)."""
        kept = self._kept_inputs
        if kept is not None:
            hit = kept.get(id(c))
            if hit is not None and hit[0] is c:
                return hit[1]
        actions = c.admissible_actions or ()
        task = c.initial_observation or c.observation
        recent = tuple(turn.action for turn in c.history[len(c.history) - self.history :]) if self.history else ()
        if self.memory:
            memory = np.asarray(context_features(c, actions), dtype=np.float64).reshape(len(actions), -1)
            inputs = _derive_inputs(task, c.observation, actions, recent, self.max_chars, self.mention_chars, self.buckets, memory)
        else:  # a pure function of these texts: shared by every context that has them (and by a context scored again)
            inputs = _plain_inputs(task, c.observation, actions, recent, self.max_chars, self.mention_chars, self.buckets)
        if kept is not None:
            kept[id(c)] = (c, inputs)
        return inputs

    def scores(self, contexts: Sequence[Context]) -> list[torch.Tensor]:
        """One batched forward over every context and candidate: the bags of all texts go
        through the embedding in one call, the features are gathered per context (cached per
        task, observation and admissible list), never per candidate."""
        if not contexts:
            return []
        inputs = [self._inputs(c) for c in contexts]
        sizes = [x.n_actions for x in inputs]
        # every context's three state bags, then every context's candidate bags
        lengths = np.concatenate([*(x.state_lengths for x in inputs), *(x.pair_lengths for x in inputs)])
        offsets = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        ids = np.concatenate([*(x.state_ids for x in inputs), *(x.pair_ids for x in inputs)])
        embedded = self.embedding(torch.from_numpy(ids), torch.from_numpy(offsets))
        n_states = 3 * len(inputs)
        states = embedded[:n_states].view(len(contexts), 3, -1)
        n_actions = sum(sizes)
        pairs = embedded[n_states:].view(n_actions, 2, -1)
        features = torch.from_numpy(np.concatenate([x.features for x in inputs]))
        # each context's row once per candidate: the index_select that repeat_interleave runs
        # (so the same numbers and gradients), with its index built in numpy in one go
        owner = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        per_action = states.index_select(0, torch.from_numpy(owner))
        t, o, r = per_action[:, 0], per_action[:, 1], per_action[:, 2]
        a, m = pairs[:, 0], pairs[:, 1]
        x = torch.cat([a, m, a * t, a * o, m * t, a * r, features], dim=-1)
        flat = self.out(torch.tanh(self.hidden(x))).squeeze(-1)
        return list(torch.split(flat, sizes))


@dataclass(frozen=True)
class _Inputs:
    """What the scoring pass reads from one context: the bags of its task, observation and
    recent actions, its candidates' bags, and every candidate's features as float32."""

    state_bags: tuple[np.ndarray, np.ndarray, np.ndarray]
    pair_ids: np.ndarray
    pair_lengths: np.ndarray
    features: np.ndarray
    """``[n_actions, n_features]`` float32: the word-overlap, repeat and memory features."""
    n_actions: int
    state_ids: np.ndarray = field(init=False, repr=False)
    """The three state bags concatenated."""
    state_lengths: np.ndarray = field(init=False, repr=False)
    """Their lengths (int64)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_ids", np.concatenate(self.state_bags))
        object.__setattr__(self, "state_lengths", np.array([len(b) for b in self.state_bags], dtype=np.int64))


@dataclass(frozen=True)
class _Candidates:
    """The parts of a context's scoring input that depend only on its task, observation and
    admissible list."""

    pair_ids: np.ndarray
    """The bucket ids of ``a_0, m_0, a_1, m_1, ...`` (each action, then its mention), concatenated."""
    pair_lengths: np.ndarray
    """The length of each of those bags."""
    features: np.ndarray
    """``[n_actions, 3]`` float64: the share of the action's words in the task and in the
    observation, the share of its mention's words in the task."""
    positions: dict[str, list[int]]
    """Where each action text stands in the admissible list (for the repeat feature)."""


def _derive_inputs(task: str, observation: str, actions: tuple[str, ...], recent: tuple[str, ...], max_chars: int, mention_chars: int,
                   buckets: int, memory: np.ndarray | None = None) -> _Inputs:
    """A context's :class:`_Inputs` from its task, observation, admissible list and last actions
    (``memory``: its memory features, ``[n_actions, k]`` float64, or None)."""
    found = _candidates(task, observation, actions, max_chars, mention_chars, buckets)
    taken = np.zeros(len(actions))
    for action in recent:  # the repeat feature: ``action in recent``
        taken[found.positions.get(action, [])] = 1.0
    columns = [found.features, taken[:, None]]
    if memory is not None:
        columns.append(memory)
    # float64 features rounded once to float32, as a tensor built from Python floats would be
    # (elementwise: rounding each context's block is rounding the whole batch's)
    features = np.concatenate(columns, axis=1).astype(np.float32)
    features.setflags(write=False)  # read-only, as the arrays it is built beside
    return _Inputs((_bag_ids(task, max_chars, buckets), _bag_ids(observation, max_chars, buckets), _bag_ids("\n".join(recent), max_chars, buckets)),
                   found.pair_ids, found.pair_lengths, features, len(actions))


@lru_cache(maxsize=1 << 15)
def _plain_inputs(task: str, observation: str, actions: tuple[str, ...], recent: tuple[str, ...], max_chars: int, mention_chars: int,
                  buckets: int) -> _Inputs:
    # the contexts of a batch share their first pages, and the learner and the probes score
    # again the very contexts the samples were drawn at: one derivation serves them all
    return _derive_inputs(task, observation, actions, recent, max_chars, mention_chars, buckets)


@lru_cache(maxsize=1 << 16)
def _bag_ids(text: str, max_chars: int, buckets: int) -> np.ndarray:
    # hashed_ngrams' own cache is bypassed: this one keeps the ids (as a compact array)
    ids = _ngram_ids(text[:max_chars], buckets)
    ids.setflags(write=False)  # shared by every call that hits the cache
    return ids


@lru_cache(maxsize=1 << 14)
def _candidates(task: str, observation: str, actions: tuple[str, ...], max_chars: int, mention_chars: int, buckets: int) -> _Candidates:
    """What every context with this task, observation and admissible list shares: the bags of
    the actions and their mentions, and the word-overlap features."""
    task_words, obs_words = _words(task[:max_chars]), _words(observation[:max_chars])
    bags: list[np.ndarray] = []
    features = np.zeros((len(actions), N_FEATURES - 1))
    positions: dict[str, list[int]] = {}
    for i, (action, mention) in enumerate(zip(actions, mentions(observation, actions, mention_chars), strict=True)):
        bags += [_bag_ids(action, max_chars, buckets), _bag_ids(mention, max_chars, buckets)]
        a_words, m_words = _words(action), _words(mention)
        features[i] = (
            len(a_words & task_words) / max(len(a_words), 1),
            len(a_words & obs_words) / max(len(a_words), 1),
            len(m_words & task_words) / max(len(m_words), 1),
        )
        positions.setdefault(action, []).append(i)
    lengths = np.fromiter((len(b) for b in bags), dtype=np.int64, count=len(bags))
    ids = np.concatenate(bags) if bags else np.zeros(0, dtype=np.int64)
    for array in (ids, lengths, features):
        array.setflags(write=False)  # shared by every context that hits the cache
    return _Candidates(ids, lengths, features, positions)
