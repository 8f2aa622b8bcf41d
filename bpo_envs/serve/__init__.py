"""The envs served over OpenEnv's WebSocket protocol, with snapshots over the wire.

``bpo-serve ENV_ID`` (:mod:`.cli`) runs :func:`.app.create_app`; :mod:`.protocol` is the wire
format, :mod:`.models` its openenv-core types, :mod:`.snapshots` the server's snapshot table and
:mod:`.session` one client's session. :class:`bpo_envs.remote.RemoteEnv` is the Gymnasium env on
the client side. Needs the ``serve`` extra (openenv-core, fastapi, uvicorn, websockets); the
modules import what they need, so a client does not load the server's dependencies.
Wire format and limits: docs/serving.md.
"""
