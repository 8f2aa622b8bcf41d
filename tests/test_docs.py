"""Every Python block of the README and of ``docs/*.md`` runs.

The blocks of one page run in order in one fresh interpreter (a later block may use an earlier
one's names), in a temporary folder. A page says what it needs in an HTML comment:
``<!-- docs-test: slow -->`` (run with ``-m slow``), ``<!-- docs-test: needs MOD ... -->``
(optional packages: the page is skipped, naming them, where one is not installed).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
MARK = re.compile(r"<!-- docs-test: (.*?) -->")


def blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


def marks(page: Path) -> list[str]:
    return [word for m in MARK.findall(page.read_text()) for word in [m.strip()]]


def _param(page: Path):
    slow = any(m == "slow" for m in marks(page))
    return pytest.param(page, id=page.relative_to(ROOT).as_posix(), marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("page", [_param(p) for p in PAGES if blocks(p)])
def test_every_python_block_runs(page: Path, tmp_path: Path):
    for mark in marks(page):
        if mark.startswith("needs "):
            missing = [m for m in mark.split()[1:] if importlib.util.find_spec(m) is None]
            if missing:
                pytest.skip(f"{page.name} needs {', '.join(missing)} (optional; not installed)")
    code = "\n\n".join(blocks(page))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{page.name}:\n{done.stderr[-3000:]}"


def test_the_pages_have_python_blocks_and_the_readme_is_short():
    assert sum(len(blocks(p)) for p in PAGES) >= 6
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
