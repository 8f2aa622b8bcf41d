"""``scripts/rediagnose_eta.py``: η re-read from the trees ``bpo-diagnose`` saved (docs/mechanism.md).

On a small TreeMDP diagnosis written to a temporary folder: the recomputed η and interval are
the folder's own (the same estimator and seed stream), written beside ``diagnose.json`` without
touching it. The broken cases: a script that reported the stored η instead of reading the trees
(caught: with one tree dropped from the saved file the reading changes), and a folder without
saved trees (nothing written, nothing claimed). Deterministic (seeded); about 2 CPU seconds.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import rediagnose_eta  # noqa: E402

from bpo_experiments import diagnose  # noqa: E402

SHAPE = "bpo-2x4-q0.8"
CELL = {"depth": 6, "decisive_levels": [3], "observe": "state"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("diagnose")
    diagnose.main(["BPO-TreeMDP-v0", "--env-kwargs", json.dumps(CELL), "--policy", "tabular-prior", "--batches", "3",
                   "--warmup", "1", "--shapes", SHAPE, "--no-measure", "--seed", "3", "--out", str(out)])
    return out


def test_recomputed_eta_is_the_folders_own(folder: Path) -> None:
    stored = json.loads((folder / "diagnose.json").read_text())
    assert stored["trees"] == {"rloo-4": "trees/rloo-4.json.gz", SHAPE: f"trees/{SHAPE}.json.gz"}
    before = (folder / "diagnose.json").read_bytes()
    written = rediagnose_eta.main([str(folder), "--n-boot", "200"])
    assert (folder / "diagnose.json").read_bytes() == before
    readings = json.loads((folder / rediagnose_eta.OUT_NAME).read_text())
    assert readings == json.loads(json.dumps(written[str(folder)]))
    assert readings["seed"] == 3
    entry = readings["configs"][SHAPE]
    mechanism = stored["configs"][SHAPE]["mechanism"]
    assert mechanism["prefix_explained"] is not None
    assert entry["recomputed"]["eta"] == pytest.approx(mechanism["prefix_explained"], abs=1e-12)
    assert entry["recomputed"]["branch_nodes"] == mechanism["branch_nodes"]
    # the interval: bpo-diagnose draws 1000 bootstrap resamples; with the same number, the same interval
    again = rediagnose_eta.rediagnose(folder, n_boot=1000)
    assert again["configs"][SHAPE]["recomputed"]["ci95"] == pytest.approx(mechanism["prefix_explained_ci95"], abs=1e-12)
    # RLOO never branches: no eta, and the reason says so
    assert readings["configs"]["rloo-4"]["recomputed"]["eta"] is None
    assert readings["configs"]["rloo-4"]["reason"].startswith("eta undefined")


def test_reads_the_trees_not_the_stored_value(folder: Path, tmp_path: Path) -> None:
    """Broken case: one tree fewer in the saved file must change the reading."""
    copy = tmp_path / "copy"
    (copy / "trees").mkdir(parents=True)
    (copy / "diagnose.json").write_bytes((folder / "diagnose.json").read_bytes())
    payload = json.loads(gzip.decompress((folder / "trees" / f"{SHAPE}.json.gz").read_bytes()))
    payload["trees"] = payload["trees"][1:]
    (copy / "trees" / f"{SHAPE}.json.gz").write_bytes(gzip.compress(json.dumps(payload).encode()))
    stored = json.loads((folder / "diagnose.json").read_text())["configs"][SHAPE]["mechanism"]["prefix_explained"]
    readings = rediagnose_eta.rediagnose(copy, n_boot=0)
    assert readings is not None
    assert abs(readings["configs"][SHAPE]["recomputed"]["eta"] - stored) > 1e-6


def test_folder_without_trees_writes_nothing(folder: Path, tmp_path: Path) -> None:
    old = json.loads((folder / "diagnose.json").read_text())
    del old["trees"]
    (tmp_path / "diagnose.json").write_text(json.dumps(old))
    assert rediagnose_eta.main([str(tmp_path)]) == {}
    assert not (tmp_path / rediagnose_eta.OUT_NAME).exists()
