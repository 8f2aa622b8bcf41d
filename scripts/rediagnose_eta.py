"""Re-read η of committed ``bpo-diagnose`` folders with the current estimator.

For each folder, every configuration whose measured trees ``bpo-diagnose`` saved
(``diagnose.json["trees"]``: ``trees/CONFIG.json.gz``) gets η and its 95% interval recomputed
from those trees with :mod:`bpo_algos.mechanism`'s estimator (docs/mechanism.md, "How η is
estimated"; the same seed stream as ``bpo-diagnose``, so on the code that wrote the folder the
reading is the folder's own). The readings are written beside the old ones as
``FOLDER/eta_recomputed.json`` (``diagnose.json`` is left as it was)::

    {"estimator": ..., "command": ..., "configs": {CONFIG: {"stored": {eta, ci95},
     "recomputed": {eta, ci95, trees, branch_nodes} | null, "reason": null | why not}}}

A folder written before ``bpo-diagnose`` saved its trees has nothing to recompute from: the
script says so and writes nothing there (its η stays the estimator's of that run)::

    python scripts/rediagnose_eta.py docs/results/diagnose/webshop docs/results/diagnose/alfworld
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from bpo_algos.mechanism import eta_terms, prefix_explained_interval
from bpo_algos.tree import RolloutTree, load_trees
from bpo_experiments.streams import MECHANISM, stream_seed

ESTIMATOR = ("bpo_algos.mechanism: unbiased nested random-effects ANOVA per branch node and per tree, "
             "jackknife bias correction, Rao-Wu rescaled bootstrap over trees within tasks "
             "(docs/mechanism.md, 'How η is estimated')")
OUT_NAME = "eta_recomputed.json"


def diagnose_seed(command: str | None) -> int:
    """The ``--seed`` of the recorded ``bpo-diagnose`` command (its default, 0, if absent)."""
    words = shlex.split(command or "")
    for i, word in enumerate(words):
        if word == "--seed" and i + 1 < len(words):
            return int(words[i + 1])
        if word.startswith("--seed="):
            return int(word.split("=", 1)[1])
    return 0


def eta_of(trees: list[RolloutTree], seed: int, n_boot: int) -> dict[str, Any]:
    """η and its interval from ``trees`` as :func:`bpo_algos.mechanism.measure` reads them."""
    eta, ci = prefix_explained_interval(eta_terms(trees), seed=stream_seed(seed, MECHANISM), n_boot=n_boot)
    nodes = sum(1 for t in trees for n in t.nodes() if n is not t.root and len(n.children) >= 2)
    return {"eta": eta, "ci95": list(ci) if ci else None, "trees": len(trees), "branch_nodes": nodes}


def rediagnose(folder: Path, *, n_boot: int = 1000) -> dict[str, Any] | None:
    """The recomputed readings of one ``bpo-diagnose`` folder, or ``None`` where it saved no trees."""
    result = json.loads((folder / "diagnose.json").read_text())
    saved = result.get("trees") or {}
    seed = diagnose_seed(result.get("command"))
    configs: dict[str, Any] = {}
    for name, row in result["configs"].items():
        mechanism = row["mechanism"]
        entry: dict[str, Any] = {
            "stored": {"eta": mechanism["prefix_explained"], "ci95": mechanism["prefix_explained_ci95"]},
            "recomputed": None,
            "reason": None,
        }
        path = folder / saved[name] if name in saved else None
        if path is None or not path.is_file():
            entry["reason"] = "no saved trees"
        else:
            entry["recomputed"] = eta_of(load_trees(path), seed, n_boot)
            if entry["recomputed"]["eta"] is None:
                entry["reason"] = "eta undefined (fewer than two branch nodes, or no return variance)"
        configs[name] = entry
    if not any(e["recomputed"] is not None for e in configs.values()):
        return None
    return {"estimator": ESTIMATOR, "diagnose_command": result.get("command"), "seed": seed, "n_boot": n_boot,
            "configs": configs}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="bpo-diagnose output folders")
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap draws for the interval")
    args = parser.parse_args(argv)
    command = "python scripts/rediagnose_eta.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    written: dict[str, Any] = {}
    for folder in args.folders:
        readings = rediagnose(folder, n_boot=args.n_boot)
        if readings is None:
            print(f"{folder}: no saved trees; nothing recomputed (its eta is the estimator's of its own run)")
            continue
        readings["command"] = command
        (folder / OUT_NAME).write_text(json.dumps(readings, indent=1))
        written[str(folder)] = readings
        for name, entry in readings["configs"].items():
            new = entry["recomputed"]
            shown = f"{new['eta']:+.3f} {new['ci95']}" if new and new["eta"] is not None else entry["reason"]
            print(f"{folder} {name}: stored {entry['stored']['eta']}, recomputed {shown}")
    return written


if __name__ == "__main__":
    main()
