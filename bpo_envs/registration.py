"""Gymnasium registration of the BPO env ids (no ``TimeLimit``: the step limit is in the env)."""

from __future__ import annotations

import gymnasium as gym

ENV_IDS: dict[str, str] = {
    "BPO-TreeMDP-v0": "bpo_envs.tree_mdp:TreeMDPEnv",
    "BPO-WebShop-v0": "bpo_envs.webshop:WebShopEnv",
    "BPO-ALFWorld-v0": "bpo_envs.alfworld:ALFWorldEnv",
    "BPO-SWEBench-v0": "bpo_envs.swebench:SWEBenchEnv",
}
SERVED_ENV_IDS: dict[str, str] = {
    "BPO-Remote-v0": "bpo_envs.remote:RemoteEnv",  # a session of a bpo-serve server (serve extra)
}


def register_envs() -> None:
    """Register every id once (idempotent: re-importing does not warn)."""
    for env_id, entry_point in {**ENV_IDS, **SERVED_ENV_IDS}.items():
        if env_id in gym.registry:
            continue
        gym.register(
            id=env_id,
            entry_point=entry_point,
            max_episode_steps=None,
            # the passive checker breaks restore-before-reset; check_env runs in the tests instead
            disable_env_checker=True,
            order_enforce=False,  # the env enforces reset-before-step itself; restore() counts as a reset
        )
