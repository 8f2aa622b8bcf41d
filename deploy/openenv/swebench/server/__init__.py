"""BPO-SWEBench-v0 as an OpenEnv environment (deploy/openenv/; docs/serving.md)."""
