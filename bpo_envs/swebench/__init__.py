"""``BPO-SWEBench-v0``: SWE-bench(-Verified) instances as a snapshottable sandbox env.

``gym.make("BPO-SWEBench-v0", instances=PATH_OR_NAME, backend="local" | "docker")``; with no
``instances`` the bundled small repositories are used. See :class:`SWEBenchEnv`; rows:
``bpo_envs.swebench.instances``; images (official names, tarballs, the offline test image):
``bpo_envs.swebench.images``; observation formats: ``bpo_envs.swebench.output``; what crashed
processes left and its clean-up (:func:`clean_up`): ``bpo_envs.swebench.owners``.
"""

from bpo_envs.swebench.bundled import bundled_instances
from bpo_envs.swebench.env import MINI_SWE_SUBMIT, SUBMIT, SWEBenchEnv
from bpo_envs.swebench.instances import InstanceError, load_instances
from bpo_envs.swebench.owners import CleanReport, clean_up

__all__ = [
    "CleanReport",
    "MINI_SWE_SUBMIT",
    "SUBMIT",
    "InstanceError",
    "SWEBenchEnv",
    "bundled_instances",
    "clean_up",
    "load_instances",
]
