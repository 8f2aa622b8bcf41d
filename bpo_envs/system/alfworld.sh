#!/usr/bin/env bash
# BPO-ALFWorld-v0's system part: the ALFWorld text engine, installed with --no-deps.
#   alfworld==0.4.2 textworld==1.7.0 fast-downward-textworld==20.6.4 jericho==3.3.1
# They cannot be a pip extra: their declared requirements pull spaCy and the THOR/vision stack,
# none of which the text engine imports. Their light requirements are the `alfworld` extra in
# pyproject.toml. fast-downward-textworld compiles Fast Downward (C++, about 2 minutes), so a
# compiler and cmake are installed first when missing. Idempotent; needs $VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
PKGS=(alfworld==0.4.2 textworld==1.7.0 fast-downward-textworld==20.6.4 jericho==3.3.1)

installed() {
  "$PY" - "${PKGS[@]}" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PYEOF
}

if installed; then
  echo "alfworld engine already installed in $VENV"
else
  if ! command -v g++ >/dev/null || ! command -v cmake >/dev/null || ! command -v make >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ cmake make >/dev/null
    else
      echo "fast-downward-textworld needs g++, cmake and make to build; install them first" >&2
      exit 1
    fi
  fi
  "$PY" -m pip install --quiet --disable-pip-version-check \
    "networkx>=2.5" "more-itertools>=8" "tatsu>=5.8,<5.9" "hashids>=1.2" "mementos>=1.3" \
    "termcolor>=1.1" "prompt-toolkit>=3" "tqdm>=4.60" "numpy>=1.24"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps "${PKGS[@]}"
fi
# smoke test: the engine imports without writing ~/.cache/alfworld and loads Fast Downward
BPO_ALFWORLD_CACHE="${BPO_ALFWORLD_CACHE:-$(mktemp -d)}" "$PY" -c "
from bpo_envs.alfworld.engine import AlfredEngine
AlfredEngine()
print('alfworld engine OK')
"
