#!/usr/bin/env bash
# The GPU path at real shape in one short check: random-weight models built from the bundled
# Qwen2.5-1.5B and Qwen2.5-7B configs (nothing is downloaded), one BPO and one RLOO update on
# WebShop each with the gpu-lora settings (LoRA r=8 on a bf16 base, KL 0.01, reasoning replies,
# probe entropy, 512-token replies); prints JSON: peak GPU memory against the memory plan,
# generation and training tokens/s, seconds per update, each phase's share.
#   bash scripts/device_check.sh                 # CUDA, about 6 minutes on one H200 (budget: 8)
#   bash scripts/device_check.sh --quick         # CUDA, about 2 minutes (128-token replies)
#   bash scripts/device_check.sh --device cpu    # CI: the tiny offline Qwen2, about a minute
#
# Needs: python >= 3.10 with torch (CUDA build on a GPU), transformers, peft, and this project's
# pure-Python dependencies (gymnasium, numpy, bm25s, PyStemmer, rapidfuzz, ...: pyproject.toml);
# vLLM is not used. What is missing is listed before anything runs. A machine that cannot reach
# a package index takes wheels carried in: on a connected machine with the same python version,
#   pip download -d wheels/ gymnasium transformers peft bm25s PyStemmer rapidfuzz   # (+ whatever is listed)
# (add --python-version 3.X --platform manylinux2014_x86_64 --only-binary=:all: when that
# machine's python differs), put wheels/ beside this repository (or name it with
# BPO_WHEELS=DIR), and this script installs from it, offline, into .device-deps/ (on PYTHONPATH),
# never touching the machine's own packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-${VENV:-.venv}/bin/python}"
[ -x "$PY" ] || PY=python3
WHEELS="${BPO_WHEELS:-wheels}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .device-deps ]; then export PYTHONPATH="$PWD/.device-deps:$PYTHONPATH"; fi
missing="$("$PY" - <<'EOF'
import importlib.util
need = {"torch": "torch", "transformers": "transformers", "peft": "peft", "gymnasium": "gymnasium", "numpy": "numpy",
        "bm25s": "bm25s", "Stemmer": "PyStemmer", "rapidfuzz": "rapidfuzz", "yaml": "PyYAML", "safetensors": "safetensors",
        "tokenizers": "tokenizers", "accelerate": "accelerate", "psutil": "psutil"}
print(" ".join(dist for module, dist in need.items() if importlib.util.find_spec(module) is None))
EOF
)"
if [ -n "$missing" ] && [ -d "$WHEELS" ]; then
    echo "device_check.sh: installing $missing from $WHEELS (offline) into .device-deps/" >&2
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" --target .device-deps $missing >&2
    export PYTHONPATH="$PWD/.device-deps:$PYTHONPATH"
    missing=""
fi
if [ -n "$missing" ]; then
    echo "device_check.sh: missing python packages: $missing" >&2
    echo "  carry their wheels in: pip download -d wheels/ $missing  (on a connected machine), then rerun" >&2
    exit 3
fi
exec "$PY" scripts/device_check.py "$@"
