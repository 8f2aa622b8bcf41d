"""A bounded store of prefilled prompts, found by their longest common token prefix.

An agent's prompt at step ``t + 1`` repeats most of its prompt at step ``t`` (the system text,
the task, the earlier turns), and every sibling after a fork starts from its parent's prompt.
The key-value cache of a causal LM at position ``j`` depends on tokens ``0..j`` only, so the
first ``k`` positions of a kept prompt's KV are the KV of any prompt that shares those ``k``
tokens: only the rest needs a forward pass (:class:`~bpo_algos.policy.hf.HFPolicy`, docs/training.md
"Prompt KV cache").

:class:`PrefixStore` keeps entries (anything with a token-id tuple ``ids``) in least-recently
used order, and bounds the tokens they hold: a KV entry's memory is proportional to its length
(``2 * layers * kv_heads * head_dim * bytes`` per token), so a token cap is a memory cap. Putting
an entry evicts the least recently used ones until the total is within ``max_tokens``; an entry
longer than the cap is not kept. Lookups (:meth:`get`, :meth:`longest_prefix`) refresh an
entry's recency.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol


class Keyed(Protocol):
    ids: tuple[int, ...]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect on slice equality (C speed)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixStore:
    """Entries keyed by their token ids, at most ``max_tokens`` tokens in all (None: unbounded).

    ``evictions`` counts the entries dropped to respect the cap (reported by benchmarks)."""

    def __init__(self, max_tokens: int | None) -> None:
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 or None, got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.tokens = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, ids: object) -> bool:
        return ids in self._entries

    def get(self, ids: tuple[int, ...]) -> Any | None:
        """The entry for exactly ``ids`` (None if absent)."""
        entry = self._entries.get(ids)
        if entry is not None:
            self._entries.move_to_end(ids)
        return entry

    def longest_prefix(self, ids: Sequence[int]) -> tuple[Any | None, int]:
        """The entry sharing the most leading tokens with ``ids`` and that count ``k``
        ((None, 0) when none shares a token); ties go to the most recently used entry."""
        best, best_k = None, 0
        for key, entry in reversed(self._entries.items()):
            if len(key) <= best_k:
                continue
            k = common_prefix_length(key, ids)
            if k > best_k:
                best, best_k = entry, k
        if best is not None:
            self._entries.move_to_end(best.ids)
        return best, best_k

    def put(self, entry: Keyed) -> None:
        """Keep ``entry`` (most recent), evicting the least recently used beyond the cap."""
        key = entry.ids
        if self.max_tokens is not None and len(key) > self.max_tokens:
            return
        if key in self._entries:
            self._entries.move_to_end(key)
            self._entries[key] = entry
            return
        self._entries[key] = entry
        self.tokens += len(key)
        while self.max_tokens is not None and self.tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self.tokens -= len(old)
            self.evictions += 1

    def pop(self, ids: tuple[int, ...]) -> None:
        if self._entries.pop(ids, None) is not None:
            self.tokens -= len(ids)

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0
