"""The log of a training run: one JSON line per update in ``metrics.jsonl``, and the same
scalars to TensorBoard and W&B when asked for (and installed)."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import subprocess
from pathlib import Path
from typing import Any

from bpo_algos.checkpoints import atomic_write


class RunLog:
    """Appends rows to ``out_dir/metrics.jsonl`` (nothing when ``out_dir`` is None: other ranks,
    or a run kept in memory) and mirrors their numbers to the optional loggers.

    ``wandb_*`` name the W&B project, run, group and shown configuration; the run id is kept in
    ``out_dir/wandb_id.txt``, so a resumed run continues the same W&B run.
    """

    def __init__(
        self,
        out_dir: Path | None,
        *,
        tensorboard: bool = False,
        wandb_project: str | None = None,
        wandb_name: str | None = None,
        wandb_group: str | None = None,
        wandb_config: dict[str, Any] | None = None,
    ) -> None:
        self.out_dir = out_dir
        self.tensorboard = tensorboard
        self.wandb = {"project": wandb_project, "name": wandb_name, "group": wandb_group, "config": wandb_config or {}}
        self._tensorboard: Any = None
        """The TensorBoard ``SummaryWriter`` (``tensorboard=True``), opened with the first row."""
        self._wandb_run: Any = None
        """The W&B run (``wandb_project``), opened with the first row."""
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)

    @property
    def path(self) -> Path | None:
        return None if self.out_dir is None else self.out_dir / "metrics.jsonl"

    def rewrite(self, rows: list[dict[str, Any]]) -> None:
        """Replace the file's rows by ``rows`` (on resume: rows after the checkpoint are redone;
        on a fresh start: none)."""
        if self.path is not None:
            lines = "".join(json.dumps(row) + "\n" for row in rows)
            atomic_write(self.path, lambda fh: fh.write(lines.encode()))

    def write(self, row: dict[str, Any], step: int) -> None:
        """Append ``row`` and log its numbers (and the running compute total) at ``step``."""
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        self._open()
        scalars = {k: v for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        scalars.update({f"compute/{k}": v for k, v in row["compute_total"].items()})
        if self._tensorboard is not None:
            for key, value in scalars.items():
                self._tensorboard.add_scalar(key, value, step)
        if self._wandb_run is not None:
            self._wandb_run.log(scalars, step=step)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        self._tensorboard = self._wandb_run = None

    def _open(self) -> None:
        if self._tensorboard is not None or self._wandb_run is not None or self.out_dir is None:
            return
        if self.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise ImportError("tensorboard=True needs `pip install tensorboard`") from exc
            self._tensorboard = SummaryWriter(str(self.out_dir / "tensorboard"))
        if self.wandb["project"]:
            try:
                import wandb
            except ImportError as exc:  # pragma: no cover
                raise ImportError("wandb_project needs `pip install wandb`") from exc
            id_file = self.out_dir / "wandb_id.txt"
            if not id_file.exists():
                run_id = wandb.util.generate_id().encode()
                atomic_write(id_file, lambda fh: fh.write(run_id))
            self._wandb_run = wandb.init(
                project=self.wandb["project"],
                id=id_file.read_text().strip(),
                name=self.wandb["name"],
                group=self.wandb["group"],
                config=self.wandb["config"],
                dir=str(self.out_dir),
                resume="allow",
            )


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The code this process runs, for the record of every result it writes: ``bpo-gym
    VERSION``, and where the package is a git checkout its commit (``+modified`` when its
    sources differ from it). A folder resumed after the code changed then shows two versions."""
    try:
        version = importlib.metadata.version("bpo-gym")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return f"bpo-gym {version}"
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True).stdout.strip()

        commit = git("rev-parse", "--short=12", "HEAD")
        modified = bool(git("status", "--porcelain", "--untracked-files=no", "--", "bpo_algos", "bpo_envs", "baselines"))
    except (OSError, subprocess.SubprocessError):
        return f"bpo-gym {version}"
    return f"bpo-gym {version} (git {commit}{'+modified' if modified else ''})"
