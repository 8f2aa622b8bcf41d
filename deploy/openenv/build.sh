#!/usr/bin/env bash
# deploy/openenv/build.sh ENV [TAG]: build the OpenEnv image of one served env, locally.
#
# The image is built FROM the project's local base image (bpo-gym/swebench-base:bookworm, made by
# `bpo-gym-setup swebench`: Debian bookworm + python3.11, no pip); docker pulls nothing. This
# script fills the build context first (Python and Debian package registries through pip and
# apt, as the set-up does; the Dockerfile then installs offline):
#   wheels/  the bpo-gym wheel built from this checkout, the run-time wheels of requirements.txt
#            (and of ENV/requirements.txt, where present) for the image's Python, pip itself, and
#            the packages of ENV/engine.txt built here with `pip wheel --no-deps` (the ALFWorld
#            engine: Fast Downward is compiled, about 2 minutes, unless pip's cache has it);
#   debs/    the Debian packages of ENV/debs.txt (`apt-get download`; bubblewrap for SWE-bench).
set -euo pipefail
env=${1:?usage: build.sh webshop|treemdp|alfworld|swebench [TAG]}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ctx="$here/$env"
tag=${2:-bpo-gym/openenv-$env:latest}
py=${PYTHON:-python3}
[ -f "$ctx/server/Dockerfile" ] || { echo "no $ctx/server/Dockerfile" >&2; exit 2; }
docker image inspect bpo-gym/swebench-base:bookworm >/dev/null \
  || { echo "the base image is missing: run bpo-gym-setup swebench" >&2; exit 1; }
rm -rf "$ctx/wheels" "$ctx/debs"
mkdir -p "$ctx/wheels" "$ctx/debs"
"$py" -m pip wheel -q --no-deps -w "$ctx/wheels" "$root"
requirements=(-r "$here/requirements.txt")
[ -f "$ctx/requirements.txt" ] && requirements+=(-r "$ctx/requirements.txt")
"$py" -m pip download -q --only-binary=:all: --implementation cp --python-version 3.11 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform linux_x86_64 -d "$ctx/wheels" "${requirements[@]}" pip
if [ -f "$ctx/engine.txt" ]; then
  "$py" -m pip wheel -q --no-deps -w "$ctx/wheels" -r "$ctx/engine.txt"
fi
if [ -f "$ctx/debs.txt" ]; then
  (cd "$ctx/debs" && xargs apt-get download -q < "$ctx/debs.txt")
fi
docker build -q -t "$tag" -f "$ctx/server/Dockerfile" "$ctx"
echo "built $tag: docker run --rm -p 127.0.0.1:8000:8000 $tag"
