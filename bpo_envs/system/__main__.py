"""``python -m bpo_envs.system``: the same as ``bpo-gym-setup``."""

from bpo_envs.system import main

main()
