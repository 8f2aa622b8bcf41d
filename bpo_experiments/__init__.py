"""The experiments that ship with BPO gym: the main job and the studies around it.

* :mod:`~bpo_experiments.compare` — ``bpo-compare``, the algorithms at matched compute
  (presets in :mod:`~bpo_experiments.presets`, one run in
  :mod:`~bpo_experiments.runner`, statistics in :mod:`~bpo_experiments.stats`, the
  report in :mod:`~bpo_experiments.report`);
* :mod:`~bpo_experiments.variance` — ``bpo-variance``, estimator bias and variance at a
  fixed policy against the exact gradient;
* :mod:`~bpo_experiments.bench` — ``bpo-bench``, every env's costs and a tree against
  independent rollouts.
"""
