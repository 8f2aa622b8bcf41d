"""Compare every file two bpo-compare jobs wrote under runs/ (docs/results/bench-main-job/alfworld-loads):
'bytes equal'; 'equal but seconds and code': equal once every key naming seconds/wall/time and the
'code' key (the git commit) are removed (JSON, JSON lines, gzipped trees; torch checkpoints: every
tensor torch.equal, every other value ==; NaN equals NaN); timing.json holds timings only.

    python equality.py BEFORE_JOB AFTER_JOB"""
from __future__ import annotations

import gzip
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

DROP = ("seconds", "wall", "time")


def strip(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k != "code" and not any(d in str(k) for d in DROP)}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape):
            return False
        if a.is_floating_point():  # NaN where the other has NaN
            return torch.equal(a.isnan(), b.isnan()) and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
        return torch.equal(a, b)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def load(path: Path, blob: bytes) -> Any:
    name = path.name
    if name.endswith(".pt"):
        return strip(torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False))
    if name.endswith(".gz"):
        blob = gzip.decompress(blob)
        name = name[:-3]
    text = blob.decode()
    if name.endswith(".jsonl"):
        return [strip(json.loads(line)) for line in text.splitlines() if line.strip()]
    return strip(json.loads(text))


def main(before: str, after: str) -> int:
    a_root, b_root = Path(before) / "runs", Path(after) / "runs"
    files = sorted({p.relative_to(a_root) for p in a_root.rglob("*") if p.is_file()} | {p.relative_to(b_root) for p in b_root.rglob("*") if p.is_file()})
    bad = 0
    for rel in files:
        a, b = a_root / rel, b_root / rel
        if not a.exists() or not b.exists():
            verdict = "only in " + ("after" if b.exists() else "before")
        elif a.read_bytes() == b.read_bytes():
            verdict = "bytes equal"
        elif rel.name == "timing.json":
            verdict = "timing only"
        else:
            verdict = "equal but seconds and code" if same(load(a, a.read_bytes()), load(b, b.read_bytes())) else "DIFFERENT"
        bad += verdict not in ("bytes equal", "timing only", "equal but seconds and code")
        print(f"runs/{rel}: {verdict}")
    return bad


if __name__ == "__main__":
    sys.exit(1 if main(*sys.argv[1:3]) else 0)
