"""The Ray env pool's former module name; the pool lives in :mod:`bpo_envs.ray_pool`."""

from bpo_envs.ray_pool import EnvHost, RayEnvPool, RemoteEnv, RemoteSnapshot

__all__ = ["EnvHost", "RayEnvPool", "RemoteEnv", "RemoteSnapshot"]
