"""The envs served over OpenEnv's WebSocket protocol, with snapshots over the wire.

``bpo-serve ENV_ID`` (:mod:`.cli`) runs :func:`create_app`; :class:`bpo_envs.remote.RemoteEnv`
is the Gymnasium env on the client side. Needs the ``serve`` extra (openenv-core, fastapi,
uvicorn, websockets). The wire format and limits: docs/serving.md.
"""

try:
    import fastapi  # noqa: F401
    import openenv.core  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(f"bpo_envs.serve needs the serve extra: pip install 'bpo-gym[serve]' ({exc})") from exc

from bpo_envs.serve.app import EnvServer, ServeConfig, create_app
from bpo_envs.serve.protocol import ServedState, TextAction, TextObservation
from bpo_envs.serve.snapshots import SnapshotStore, UnknownSnapshotError

__all__ = [
    "EnvServer", "ServeConfig", "ServedState", "SnapshotStore", "TextAction", "TextObservation",
    "UnknownSnapshotError", "create_app",
]  # fmt: skip
