"""η's bias on synthetic trees with a known η, for the estimator of ``bpo_algos.mechanism`` and
the one it replaced (docs/mechanism.md, "How η is estimated").

The trees and the replaced estimator are those of ``tests/test_mechanism_unbiased.py`` (one
definition, imported from there): shapes flat 2x4 and nested 2x2x2, 1, 2 and 8 trees a task,
true η 0, 0.2 and 0.4, 16 trees a batch, one batch a reading. Prints one JSON line per cell::

    PYTHONPATH=$PWD python studies/eta_bias_table.py --readings 1500 > eta_bias.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_mechanism_unbiased import (  # noqa: E402 - the test module is the one definition of the trees
    ETAS,
    SHAPES,
    TREES_PER_TASK,
    measured_eta,
    replaced_eta,
    synthetic_batch,
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readings", type=int, default=1500, help="batches (readings) per cell")
    parser.add_argument("--seed", type=int, default=99)
    args = parser.parse_args(argv)
    for name, shape in SHAPES.items():
        for per_task in TREES_PER_TASK:
            for eta in ETAS:
                rng = np.random.default_rng(np.random.SeedSequence([args.seed, per_task, int(eta * 10), len(shape)]))
                before, after = [], []
                for _ in range(args.readings):
                    batch = synthetic_batch(shape, eta, per_task, rng)
                    before.append(replaced_eta([batch]))
                    after.append(measured_eta([batch]))
                row = {"shape": name, "trees_per_task": per_task, "eta": eta}
                for label, values in (("before", before), ("after", after)):
                    x = np.array([v for v in values if v is not None])
                    row[label] = float(x.mean())
                    row[f"{label}_se"] = float(x.std() / np.sqrt(len(x)))
                    row[f"{label}_sd"] = float(x.std())
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
