"""``BPO-SWEBench-v0``: SWE-bench(-Verified) instances as a snapshottable sandbox env.

``gym.make("BPO-SWEBench-v0", instances=PATH_OR_NAME, backend="local" | "docker")``; with no
``instances`` the bundled small repositories are used. See :class:`SWEBenchEnv`; rows:
``bpo_envs.swebench.instances``; images (official names, tarballs, the offline test image):
``bpo_envs.swebench.images``; observation formats: ``bpo_envs.swebench.output``.
"""

from bpo_envs.swebench.bundled import bundled_instances
from bpo_envs.swebench.env import MINI_SWE_SUBMIT, SUBMIT, SWEBenchEnv
from bpo_envs.swebench.instances import InstanceError, load_instances

__all__ = [
    "MINI_SWE_SUBMIT",
    "SUBMIT",
    "InstanceError",
    "SWEBenchEnv",
    "bundled_instances",
    "load_instances",
]
