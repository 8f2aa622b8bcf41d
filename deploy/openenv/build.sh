#!/usr/bin/env bash
# deploy/openenv/build.sh ENV [TAG]: build the OpenEnv image of one served env, locally.
#
# The image is built FROM the project's local base image (bpo-gym/swebench-base:bookworm, made by
# `bpo-gym-setup swebench`: Debian bookworm + python3.11, no pip); docker pulls nothing. This
# script fills the build context's wheels/ first: the bpo-gym wheel built from this checkout,
# the run-time wheels of requirements.txt for the image's Python, and pip itself (the Dockerfile
# runs pip from its wheel, offline, with --no-index).
set -euo pipefail
env=${1:?usage: build.sh webshop|treemdp [TAG]}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ctx="$here/$env"
tag=${2:-bpo-gym/openenv-$env:latest}
py=${PYTHON:-python3}
[ -f "$ctx/server/Dockerfile" ] || { echo "no $ctx/server/Dockerfile" >&2; exit 2; }
docker image inspect bpo-gym/swebench-base:bookworm >/dev/null \
  || { echo "the base image is missing: run bpo-gym-setup swebench" >&2; exit 1; }
rm -rf "$ctx/wheels"
mkdir -p "$ctx/wheels"
"$py" -m pip wheel -q --no-deps -w "$ctx/wheels" "$root"
"$py" -m pip download -q --only-binary=:all: --implementation cp --python-version 3.11 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform linux_x86_64 -d "$ctx/wheels" -r "$here/requirements.txt" pip
docker build -q -t "$tag" -f "$ctx/server/Dockerfile" "$ctx"
echo "built $tag: docker run --rm -p 127.0.0.1:8000:8000 $tag"
