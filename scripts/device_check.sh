#!/usr/bin/env bash
# The GPU path in one short check (<= 8 minutes on one H200; about a minute with --device cpu):
# one BPO and one RLOO update on WebShop, bf16 compute + fp32 master weights, gradient
# checkpointing, micro-batched backward; prints JSON. Nothing is downloaded: pass
# --model FOLDER (e.g. SmolLM2-135M converted beforehand by bpo_algos.policy.tiny.smollm2_path)
# or get the tiny offline Qwen2 (cached in $BPO_GYM_CACHE).
#   bash scripts/device_check.sh                 # CUDA
#   bash scripts/device_check.sh --device cpu    # CI
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-${VENV:-.venv}/bin/python}"
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" scripts/device_check.py "$@"
