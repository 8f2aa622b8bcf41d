"""Seeds derived from keys: one ``numpy.random.SeedSequence`` per key, never arithmetic on a seed.

``seed + i`` or ``seed * 1000 + i`` makes two keys share a stream (seed 0's item 1000 is seed
1's item 0); ``SeedSequence`` hashes the whole key, so keys that differ anywhere give unrelated
streams. The main job's keys are ``(seed, role, task, episode)``
(:mod:`bpo_experiments.streams`, docs/main-job.md "Random streams"); this layer's helpers key
their own streams with :func:`key_seed` the same way.
"""

from __future__ import annotations

import numpy as np


def key_seed(*key: int) -> int:
    """The 31-bit seed of the stream ``key`` (non-negative integers): the first word of
    ``SeedSequence(key)``, which fits every seed argument (numpy, torch, ``env.reset``)."""
    words = [int(k) for k in key]
    if not words or any(k < 0 for k in words):
        raise ValueError(f"a stream key is one or more non-negative integers, got {key}")
    return int(np.random.SeedSequence(words).generate_state(1)[0]) & 0x7FFFFFFF
