#!/usr/bin/env bash
# Opt-in: verifiers 0.4 (verifiers.v1) in its own venv, for bpo_envs.integrations.verifiers.
# Does nothing unless BPO_INSTALL_VERIFIERS=1. verifiers pins mcp==2.0.0 and openai<3, which clash
# with openenv-core 0.3 (the server's; an install that mixes them breaks `import openenv.core`), so
# it gets $VENV_VERIFIERS (default: .venv-verifiers next to $VENV) with verifiers[openenv] (its
# OpenEnv client), uv (each rollout's chat harness is a PEP 723 script uv prepares) and
# gymnasium (to import bpo_envs from a clone). Idempotent; about 20 minutes on a loaded 2-core box.
set -euo pipefail
if [ "${BPO_INSTALL_VERIFIERS:-0}" != "1" ]; then
    echo "verifiers.sh: skipped (set BPO_INSTALL_VERIFIERS=1 to install verifiers in its own venv)"
    exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
VENV_VERIFIERS="${VENV_VERIFIERS:-$ROOT/.venv-verifiers}"
if [ ! -x "$VENV_VERIFIERS/bin/python" ]; then
    python3 -m venv "$VENV_VERIFIERS"
fi
if ! "$VENV_VERIFIERS/bin/python" -c "import verifiers.v1, openenv, uv, gymnasium" 2>/dev/null; then
    "$VENV_VERIFIERS/bin/pip" install 'verifiers[openenv]==0.4.0' 'mcp==2.0.0' uv 'gymnasium>=1.0,<2'
fi
echo "verifiers ready in $VENV_VERIFIERS: pytest tests/test_serve_verifiers.py runs it"
