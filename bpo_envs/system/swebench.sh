#!/usr/bin/env bash
# System part of BPO-SWEBench-v0 (idempotent, as root):
#  * bubblewrap for the local sandbox backend (required);
#  * docker.io for the docker backend: starts dockerd in the background when no daemon answers
#    and builds the small local base image (bookworm minbase + python3, pytest, git, patch), then
#    on it, offline, a test image in the official layout (sweb.eval.x86_64.<bundled id>, a conda-
#    style `testbed` env activated by /root/.bashrc; python -m bpo_envs.swebench.images).
# A docker part that cannot be set up is reported and skipped (the docker tests then skip with
# the reason); it never fails the whole setup.
set -uo pipefail
IMAGE=${BPO_SWEBENCH_IMAGE:-bpo-gym/swebench-base:bookworm}
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
apt_updated=0
apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ $apt_updated = 0 ]; then $SUDO apt-get update -qq && apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

apt_install bubblewrap git || { echo "swebench setup: could not install bubblewrap" >&2; exit 1; }

docker_part() {
  apt_install docker.io debootstrap || return 1
  if ! docker info >/dev/null 2>&1; then
    echo "swebench setup: starting dockerd"
    # overlay2 first: the disk quota reads a container's writable layer, which vfs does not keep
    # apart. overlay2 refuses a data root on overlayfs (a machine that is itself a container):
    # then its data goes on a tmpfs, and vfs (the quota not enforced) only when that fails too.
    start_dockerd --storage-driver=overlay2 \
      || { mkdir -p /var/lib/bpo-docker && { mountpoint -q /var/lib/bpo-docker \
             || mount -t tmpfs -o size=50% tmpfs /var/lib/bpo-docker; } \
           && start_dockerd --storage-driver=overlay2 --data-root=/var/lib/bpo-docker; } \
      || start_dockerd --storage-driver=vfs \
      || { tail -5 /var/log/bpo-dockerd.log >&2; return 1; }
  fi
  echo "swebench setup: docker storage driver $(docker info -f '{{.Driver}}' 2>/dev/null)"
  if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then build_base || return 1; fi
  local py="${VENV:-.venv}/bin/python"
  [ -x "$py" ] || py=python3
  "$py" -m bpo_envs.swebench.images >/dev/null \
    || echo "swebench setup: could not build the official-layout test image" >&2
}

# start dockerd with "$@"; true once it answers, false when it exits or does not answer in 3 min
# (a slow start on a busy machine is waited for, not taken for an unsupported driver)
start_dockerd() {
  local pid
  nohup dockerd "$@" >/var/log/bpo-dockerd.log 2>&1 &
  pid=$!
  for _ in $(seq 1 180); do
    docker info >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || { echo "swebench setup: dockerd $* exited: $(tail -1 /var/log/bpo-dockerd.log)" >&2; return 1; }
    sleep 1
  done
  kill "$pid" 2>/dev/null; sleep 2
  return 1
}

build_base() {
  echo "swebench setup: building $IMAGE (debootstrap, about a minute)"
  local root mirror
  # the Debian mirror this machine's apt already uses (first "URIs:" / "deb" line for debian)
  mirror=$(grep -hoE '^(URIs:|deb)[[:space:]]+https?://[^[:space:]]+/debian([[:space:]]|$)' \
    /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -n 1)
  [ -n "$mirror" ] || { echo "swebench setup: no Debian mirror found in the apt sources" >&2; return 1; }
  root=$(mktemp -d /tmp/bpo-swe-rootfs.XXXXXX)
  debootstrap --variant=minbase --include=python3,python3-pytest,git,patch,ca-certificates \
    bookworm "$root" "$mirror" >/tmp/bpo-swe-debootstrap.log 2>&1 \
    || { tail -5 /tmp/bpo-swe-debootstrap.log >&2; rm -rf "$root"; return 1; }
  mkdir -p "$root/opt/miniconda3/bin" "$root/testbed"
  printf 'conda() { :; }\n' >"$root/opt/miniconda3/bin/activate"
  ln -sf python3 "$root/usr/bin/python"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' -c 'WORKDIR /testbed' - "$IMAGE" >/dev/null
  local rc=$?
  rm -rf "$root"
  return $rc
}

if ! docker_part; then
  echo "swebench setup: the docker backend is not available here (docker tests will skip)" >&2
fi
exit 0
