"""``BPO-SWEBench-v0``: SWE-bench(-Verified) instances as a snapshottable sandbox env.

``gym.make("BPO-SWEBench-v0", instances=PATH, backend="local" | "docker")``; with no
``instances`` the bundled small repositories are used. See :class:`SWEBenchEnv`.
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
