#!/usr/bin/env bash
# Install BPO gym from scratch on a CPU machine (as the README says):
#   a venv at $VENV (default .venv), torch pinned to the local CPU wheel, the project with every
#   CPU extra, then each env's system part (scripts/setup/*.sh: apt packages, services, images).
# Idempotent: re-running it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# torch==2.13.0 first: an unpinned torch would pull a multi-GB CUDA build.
"$VENV/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0
"$VENV/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0 -e '.[all]'
export VENV
for part in scripts/setup/*.sh; do
  [ -e "$part" ] || continue
  echo "== setup: $part"
  bash "$part"
done
echo "== BPO gym installed in $VENV"
