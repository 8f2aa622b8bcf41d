"""The experiments that ship with BPO gym: the main job and the studies around it.

* :mod:`~bpo_algos.experiments.compare` — ``bpo-compare``, the algorithms at matched compute
  (presets in :mod:`~bpo_algos.experiments.presets`, one run in
  :mod:`~bpo_algos.experiments.runner`, statistics in :mod:`~bpo_algos.experiments.stats`, the
  report in :mod:`~bpo_algos.experiments.report`);
* :mod:`~bpo_algos.experiments.variance` — ``bpo-variance``, estimator bias and variance at a
  fixed policy against the exact gradient;
* :mod:`~bpo_algos.experiments.bench` — ``bpo-bench``, every env's costs and a tree against
  independent rollouts.
"""
