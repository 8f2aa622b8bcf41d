"""SWE-bench instance images: official names, image tarballs, and the offline test image.

Names (swebench 4.1, ``TestSpec.instance_image_key``): an instance's image is
``sweb.eval.x86_64.<instance_id lowercased>:latest`` when built locally by the harness, and
``swebench/sweb.eval.x86_64.<id with "__" -> "_1776_">:latest`` on Docker Hub. Both are
looked for (a row's own ``image`` column first). Nothing is ever pulled: a missing image is
``docker load``-ed from a tarball in ``images_dir`` (made with ``docker save`` where a network
exists), else the error says how to make one.

A tarball in ``images_dir`` is used for an instance when its file name contains the instance id
(either spelling, any case) or, for an uncompressed ``.tar``, when its ``manifest.json`` tags
one of the names; ``.tar``, ``.tar.gz``, ``.tgz``, ``.tar.xz`` and ``.tar.bz2`` are accepted.

:func:`build_test_image` makes, offline, an image in the official layout on the local base image:
``/testbed`` at the row's base commit, a conda stand-in at ``/opt/miniconda3`` whose
``conda activate testbed`` puts the environment ``/opt/miniconda3/envs/testbed`` (a virtual
environment with its own ``python``, ``pytest`` and marker module ``bpo_testbed_env``) first on
``PATH``, and the official ``/root/.bashrc`` line that activates it. ``python -m
bpo_envs.swebench.images`` builds it for the first bundled instance (the set-up script runs it).
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bpo_envs.swebench.daemon import docker_client, exec_complete
from bpo_envs.swebench.owners import owner_labels, run_dir

DEFAULT_IMAGE = "bpo-gym/swebench-base:bookworm"
"""The local base image (``bpo-gym-setup swebench`` builds it) of the docker backend."""


ARCH = "x86_64"
NAMESPACE = "swebench"
TARBALL_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2")
BASHRC_LINE = "source /opt/miniconda3/etc/profile.d/conda.sh && conda activate testbed"
"""The official images' whole ``/root/.bashrc`` (swebench's python env Dockerfile)."""


def official_names(instance_id: str, tag: str = "latest") -> list[str]:
    """The local and the namespaced (Docker Hub) image names swebench 4.1 gives an instance."""
    key = f"sweb.eval.{ARCH}.{instance_id.lower()}:{tag}"
    return [key, f"{NAMESPACE}/{key}".replace("__", "_1776_")]


def row_image_names(row: dict[str, Any]) -> list[str]:
    """The names to look for, best first: the row's ``image`` column, then the official ones."""
    names = [row["image"]] if row.get("image") else []
    return names + [n for n in official_names(row["instance_id"]) if n not in names]


def how_to_make(instance_id: str) -> str:
    """Commands that make an instance's image tarball on a machine with a network."""
    local, hub = official_names(instance_id)
    return (
        f"where a network exists, either `docker pull {hub}` or build it with swebench's harness: "
        "`python -m swebench.harness.prepare_images --dataset_name "
        f"princeton-nlp/SWE-bench_Verified --instance_ids {instance_id}` (image {local}); then "
        f"`docker save <image> -o {instance_id}.tar`, copy the tarball here and pass its folder "
        "as images_dir="
    )


def _tarball_tags(path: Path) -> list[str]:
    """The ``RepoTags`` of an uncompressed ``docker save`` tarball (empty when unreadable)."""
    try:
        with tarfile.open(path, mode="r:") as tar:
            member = tar.extractfile("manifest.json")
            if member is None:
                return []
            manifest = json.load(member)
    except (tarfile.TarError, KeyError, OSError, json.JSONDecodeError):
        return []
    return [tag for entry in manifest for tag in (entry.get("RepoTags") or [])]


def find_tarball(images_dir: str | Path, instance_id: str, names: Sequence[str]) -> Path | None:
    """The tarball in ``images_dir`` holding ``instance_id``'s image, or None."""
    folder = Path(images_dir)
    tarballs = sorted(p for p in folder.iterdir()
                      if p.is_file() and p.name.lower().endswith(TARBALL_SUFFIXES))
    spellings = {instance_id.lower(), instance_id.lower().replace("__", "_1776_")}
    for path in tarballs:
        if any(s in path.name.lower() for s in spellings):
            return path
    wanted = {n if ":" in n.rsplit("/", 1)[-1] else n + ":latest" for n in names}
    for path in tarballs:
        if path.name.lower().endswith(".tar") and wanted & set(_tarball_tags(path)):
            return path
    return None


class ImageStore:
    """Finds instance images in the local engine, loading them from ``images_dir`` if needed."""

    def __init__(self, client: Any, images_dir: str | Path | None = None) -> None:
        if images_dir is not None and not Path(images_dir).is_dir():
            raise ValueError(f"images_dir {str(images_dir)!r} is not a folder")
        self.client = client
        self.images_dir = Path(images_dir) if images_dir is not None else None

    def has(self, name: str) -> bool:
        import docker

        try:
            self.client.images.get(name)
            return True
        except docker.errors.ImageNotFound:
            return False

    def present(self, names: Sequence[str]) -> str | None:
        """The first of ``names`` the engine has."""
        return next((n for n in names if self.has(n)), None)

    def find(self, instance_id: str, names: Sequence[str]) -> str:
        """An image among ``names``: present, or loaded from a tarball; raise otherwise."""
        found = self.present(names)
        if found:
            return found
        tarball = None
        if self.images_dir is not None:
            tarball = find_tarball(self.images_dir, instance_id, names)
        if tarball is not None:
            with open(tarball, "rb") as fh:
                loaded = self.client.images.load(fh)
            found = self.present(names)
            if found:
                return found
            tags = [t for image in loaded for t in image.tags]
            raise RuntimeError(
                f"{tarball} was loaded but holds {tags or 'untagged images'}, none of {list(names)}: "
                f"tag it (`docker tag <image> {names[0]}`) or give the row an `image` column"
            )
        where = f"; no tarball for it in {self.images_dir}" if self.images_dir else ""
        raise RuntimeError(
            f"no image for {instance_id}: none of {list(names)} is in the local Docker engine"
            f"{where}. Nothing is pulled at run time; {how_to_make(instance_id)}"
        )

    def available(self, instance_id: str, names: Sequence[str]) -> bool:
        """Whether ``find`` can succeed without loading (present, or a tarball exists)."""
        if self.present(names):
            return True
        return self.images_dir is not None and find_tarball(self.images_dir, instance_id, names) is not None


# ---- the offline test image in the official layout ------------------------------------------
_CONDA_SH = r"""# bpo-gym: a stand-in for conda's shell hook (only activate/deactivate of envs by name)
conda() {
  case "$1" in
    activate)
      local name="${2:-base}" prefix=/opt/miniconda3
      [ "$name" = base ] || prefix="/opt/miniconda3/envs/$name"
      [ -d "$prefix/bin" ] || { echo "EnvironmentNameNotFound: $name" >&2; return 1; }
      export PATH="$prefix/bin:${PATH}" CONDA_PREFIX="$prefix" CONDA_DEFAULT_ENV="$name" ;;
    deactivate) unset CONDA_PREFIX CONDA_DEFAULT_ENV ;;
    *) : ;;
  esac
}
"""

_SETUP = r"""set -eu
env=/opt/miniconda3/envs/testbed
ver=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
mkdir -p /opt/miniconda3/etc/profile.d /opt/miniconda3/bin "$env/bin" "$env/lib/python$ver/site-packages"
mv /bpo_layout/conda.sh /opt/miniconda3/etc/profile.d/conda.sh
printf 'source /opt/miniconda3/etc/profile.d/conda.sh\n' > /opt/miniconda3/bin/activate
printf 'home = /usr/bin\ninclude-system-site-packages = true\nversion = %s\n' "$ver" > "$env/pyvenv.cfg"
ln -sf /usr/bin/python3 "$env/bin/python"
ln -sf python "$env/bin/python3"
printf '#!%s/bin/python\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n' "$env" > "$env/bin/pytest"
chmod +x "$env/bin/pytest"
printf 'ENV_NAME = "testbed"\n' > "$env/lib/python$ver/site-packages/bpo_testbed_env.py"
printf '%s\n' "$BASHRC" > /root/.bashrc
rm -rf /bpo_layout
"""


def build_test_image(row: dict[str, Any], client: Any | None = None,
                     base_image: str | None = None, force: bool = False) -> str:
    """Build ``sweb.eval.x86_64.<id>:latest`` for ``row`` (needs ``repo_path``), offline.

    Returns the image name. See the module docstring for the layout.
    """
    from bpo_envs.swebench.local import make_testbed

    client = client or docker_client()
    base_image = base_image or DEFAULT_IMAGE
    name = official_names(row["instance_id"])[0]
    store = ImageStore(client)
    if store.has(name) and not force:
        return name
    if not row.get("repo_path"):
        raise ValueError(f"{row['instance_id']}: building a test image needs the row's repo_path")
    if not store.has(base_image):
        raise RuntimeError(f"the base image {base_image} is missing: run bpo-gym-setup swebench")
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="img-", dir=run_dir()) as tmp:
        make_testbed(Path(tmp) / "testbed", row["repo_path"], row["base_commit"])
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(Path(tmp) / "testbed", arcname="testbed")
            data = _CONDA_SH.encode()
            info = tarfile.TarInfo("bpo_layout/conda.sh")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    box = client.containers.run(base_image, ["sleep", "infinity"], detach=True, init=True,
                                network_mode="none", labels={"bpo-gym": "swebench-build", **owner_labels()})
    try:
        box.exec_run(["rm", "-rf", "/testbed"])
        box.put_archive("/", buf.getvalue())
        rc, out = exec_complete(client.api, box.id, ["bash", "-c", _SETUP], {"BASH_ENV": "", "BASHRC": BASHRC_LINE})
        if rc != 0:
            raise RuntimeError(f"building {name} failed: {out.decode(errors='replace')}")
        repo, tag = name.rsplit(":", 1)
        box.commit(repository=repo, tag=tag, changes=["WORKDIR /testbed"])
    finally:
        box.remove(force=True)
    return name


def verified_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` as a Verified-format row: no ``repo_path`` or ``image`` (found by official name)."""
    return {k: v for k, v in row.items() if k not in ("repo_path", "image")}


def main() -> None:
    import argparse

    from bpo_envs.swebench.bundled import bundled_instances

    parser = argparse.ArgumentParser(description="Build the offline SWE-bench test image(s).")
    parser.add_argument("--all", action="store_true", help="every bundled instance, not only the first")
    parser.add_argument("--force", action="store_true", help="rebuild when present")
    args = parser.parse_args()
    rows = bundled_instances()
    for row in rows if args.all else rows[:1]:
        print(build_test_image(row, force=args.force))


if __name__ == "__main__":
    main()
