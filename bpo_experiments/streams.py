"""The main job's random streams: one ``numpy.random.SeedSequence`` per (seed, role, task, episode).

Every random stream of a comparison (the warm start, the training run, each evaluation episode,
the gradient probes, the reference gradient, the bootstraps) is keyed by the run's seed, a
*role* (what the stream is for) and, where it matters, the task's index and the episode's index
(docs/main-job.md, "Random streams"). ``SeedSequence`` hashes the whole key, so two keys that
differ anywhere give unrelated streams: seed ``s``'s episode ``j + 1`` is not seed ``s + 1``'s
episode ``j`` (as it was with additive offsets such as ``1000 i + j`` added to the seed). The key holds no
algorithm: every algorithm of one seed draws the same streams (common random numbers), so their
differences are their policies', not their luck's.
"""

from __future__ import annotations

import numpy as np

# Roles: what a stream is for (part of the key, never added to a seed).
WARM_START = 1
"""The initial policy: its initialisation, expert demos and behaviour cloning."""
TRAINING = 2
"""The trainer: task sequence and every batch's trees (each keyed further by update and tree)."""
ALGORITHM = 3
"""The algorithm's own randomness (tie-breaks, adaptive thresholds)."""
EVALUATION = 4
"""An evaluation episode: its env reset and the policy's sampler (task, episode)."""
PROBE = 5
"""The gradient probe's batches (task = 0 at the warm start, 1 at mid-training)."""
REFERENCE = 6
"""The reference gradient's RLOO batches (task = 0 at the warm start, 1 at mid-training)."""
BOOTSTRAP = 7
"""Bootstrap resamples of a diagnostic (task = the probe point)."""
MECHANISM = 8
"""The bootstrap of the mechanism's interval (task = the measurement point)."""
TUNING = 9
"""A tuning run's seed (``bpo-regime``): tuning runs draw from their own streams, never an
evaluation seed's."""

ROLES = {
    "warm_start": WARM_START, "training": TRAINING, "algorithm": ALGORITHM, "evaluation": EVALUATION,
    "probe": PROBE, "reference": REFERENCE, "bootstrap": BOOTSTRAP, "mechanism": MECHANISM, "tuning": TUNING,
}
"""Every role by name."""


def stream_seed(seed: int, role: int, task: int = 0, episode: int = 0, split: int = 0) -> int:
    """The 31-bit seed of the stream ``(seed, role, task, episode)``: the first word of
    ``SeedSequence([seed, role, task, episode])`` (fits every seed argument: numpy, torch,
    ``env.reset``). ``split`` > 0 (an evaluation on a further split, e.g. ALFWorld's
    ``valid_unseen`` beside ``valid_seen``) appends a fifth word, so that split's task ``i``
    shares no stream with the first split's task ``i``."""
    if role not in ROLES.values():
        raise ValueError(f"unknown stream role {role}; roles: {ROLES}")
    key = [int(seed), int(role), int(task), int(episode)] + ([int(split)] if split else [])
    if any(k < 0 for k in key):
        raise ValueError(f"stream keys are non-negative integers, got {key}")
    return int(np.random.SeedSequence(key).generate_state(1)[0]) & 0x7FFFFFFF


def stream(seed: int, role: int, task: int = 0, episode: int = 0, split: int = 0) -> np.random.Generator:
    """A generator on the stream ``(seed, role, task, episode[, split])``."""
    return np.random.default_rng(stream_seed(seed, role, task, episode, split))


PROBE_POINTS = {"initial": 0, "mid": 1}
"""The probe points' index in the keys of the PROBE, REFERENCE and BOOTSTRAP streams."""
