"""BPO-SWEBench-v0 over OpenEnv's protocol: ``uvicorn server.app:app``, ``python -m server.app`` or
``uv run server`` (OpenEnv's layout). Env kwargs come from ``$BPO_ENV_KWARGS`` (JSON), the
session cap from ``$BPO_MAX_SESSIONS``, the bearer token from ``$BPO_SERVE_TOKEN``."""

from bpo_envs.serve.cli import app_from_environ, run

app = app_from_environ("BPO-SWEBench-v0")


def main(host: str = "0.0.0.0", port: int = 8000) -> None:
    """Serve on all interfaces of the container; publish the port on 127.0.0.1 only unless
    clients elsewhere should reach it (and then set $BPO_SERVE_TOKEN)."""
    run(app, host, port)


if __name__ == "__main__":
    main()
