#!/usr/bin/env bash
# Install BPO gym from scratch on a CPU machine (as the README says):
#   a venv at $VENV (default .venv), torch pinned to the local CPU wheel, the project with every
#   CPU extra, then each env's system part (bpo_envs/system/*.sh, also `bpo-gym-setup`: apt packages, services, images).
# Idempotent: re-running it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# The Python part is redone only when what it installs from changed (a stamp in the venv).
stamp="$VENV/.bpo-gym-installed"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # torch==2.13.0 first: an unpinned torch would pull a multi-GB CUDA build.
  "$VENV/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0
  "$VENV/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0 -e '.[all]'
  echo "$want" >"$stamp"
fi
export VENV
for part in bpo_envs/system/*.sh; do
  [ -e "$part" ] || continue
  echo "== setup: $part"
  bash "$part"
done
echo "== BPO gym installed in $VENV"
