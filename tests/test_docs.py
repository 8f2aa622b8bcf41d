"""Every Python block of the README and of ``docs/*.md`` runs, and every reference resolves.

The blocks of one page run in order in one fresh interpreter (a later block may use an earlier
one's names), in a temporary folder. A page says what it needs in an HTML comment:
``<!-- docs-test: slow -->`` (run with ``-m slow``), ``<!-- docs-test: needs MOD ... -->``
(optional packages: the page is skipped, naming them, where one is not installed).

References (docs/layout.md): a relative link of a page names a file that exists (and, with
``#anchor``, one of its headings); a citation in the code or the docs (``docs/X.md, "Section"``,
``docs/X.md#anchor``) names a page that exists and a heading of it (or a paragraph's bold lead)
that starts with the cited words; a script path (``scripts/``, ``benchmarks/``, ``studies/``)
names a file that exists; each of those three folders has a README that lists every file in it.
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
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "studies").glob("*.md"))]
SCRIPT_FOLDERS = ("scripts", "benchmarks", "studies")
README_MAX_LINES = 150
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
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES


# --- references -------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")
SECTION = r'"([A-Z`][^"]{0,89})"'  # a section's title starts with a capital or a code span
CITATION = re.compile(rf"(docs/[\w/-]+\.md)(?:#([\w-]+)|,?\s*\(?{SECTION}(?:\s+and\s+{SECTION})?)?")
SCRIPT_PATH = re.compile(r"(?<![\w/.-])((?:scripts|benchmarks|studies)/[\w-]+\.(?:py|sh))")
CODE_FOLDERS = ("bpo_envs", "bpo_algos", "baselines", "bpo_experiments", "tests", *SCRIPT_FOLDERS, "examples", "deploy")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # no code-block comments
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)]


def bold_leads(page: Path) -> list[str]:
    return re.findall(r"^\*\*(.+?)\*\*", page.read_text(), re.M)


def section_exists(page: Path, cited: str) -> bool:
    cited = " ".join(cited.replace("`", "").split())
    names = [" ".join(h.replace("`", "").split()) for h in headings(page) + bold_leads(page)]
    return any(name.startswith(cited) for name in names)


def broken_links(page: Path) -> list[str]:
    where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
    found = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            found.append(f"{where}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in headings(dest)}:
            found.append(f"{where}: {target} (no such heading)")
    return found


def broken_citations(text: str, where: str, root: Path = ROOT) -> list[str]:
    found = []
    for m in CITATION.finditer(text):
        doc, anchor, *sections = m.groups()
        page = root / doc
        if not page.exists():
            found.append(f"{where}: {doc} (no such page)")
            continue
        if anchor and anchor not in {slug(h) for h in headings(page)}:
            found.append(f"{where}: {doc}#{anchor} (no such heading)")
        for section in filter(None, sections):
            section = re.sub(r"\s*#\s*", " ", section)  # a citation wrapped across comment lines
            if not section_exists(page, section):
                found.append(f'{where}: {doc}, "{section}" (no heading or bold lead starts so)')
    return found


def broken_script_paths(text: str, where: str, root: Path = ROOT) -> list[str]:
    return [f"{where}: {path} (no such file)" for path in SCRIPT_PATH.findall(text) if not (root / path).exists()]


def sources() -> list[Path]:
    """Every file that may cite the docs or name a script: the code, the tests, the pages, the
    committed results' write-ups."""
    files = [*PAGES, *(ROOT / f / "README.md" for f in SCRIPT_FOLDERS), ROOT / "Makefile", ROOT / ".ci" / "run",
             ROOT / "pyproject.toml", *sorted((ROOT / "docs" / "results").rglob("*.md"))]
    for folder in CODE_FOLDERS:
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in {".py", ".sh", ".md", ".toml"}]
    return [p for p in files if p.exists() and p != Path(__file__).resolve()]


def unlisted(folder: Path) -> list[str]:
    """The files of ``folder`` its README does not name, and the names it lists that are not there."""
    readme = folder / "README.md"
    if not readme.exists():
        return [f"{folder.name}/README.md (missing)"]
    text = readme.read_text()
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != "README.md")
    listed = set(re.findall(r"`([\w.-]+\.(?:py|sh))`", text))
    return [f"{folder.name}/{n} (not in its README)" for n in files if f"`{n}`" not in text] + [
        f"{folder.name}/README.md lists {n} (no such file)" for n in sorted(listed - set(files))]


def test_every_relative_link_resolves():
    found = [b for page in [*PAGES, *(ROOT / f / "README.md" for f in SCRIPT_FOLDERS)] if page.exists()
             for b in broken_links(page)]
    assert not found, "broken links:\n" + "\n".join(found)


def test_every_cited_page_and_section_exists():
    found = [b for path in sources() for b in broken_citations(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "citations of the docs that name nothing:\n" + "\n".join(found)


def test_every_script_path_named_exists():
    found = [b for path in sources() for b in broken_script_paths(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "script paths that do not exist:\n" + "\n".join(found)


def test_each_script_folder_lists_every_file_in_its_readme():
    found = [u for folder in SCRIPT_FOLDERS for u in unlisted(ROOT / folder)]
    assert not found, "\n".join(found)


def test_the_reference_checks_catch_what_they_must(tmp_path):
    # the broken cases: each check, on a throwaway tree, reports what is wrong and passes what is right
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## The first reset of a game\n\n**LLM policies.** text\n\n"
                                            "[ok](a.md#the-first-reset-of-a-game) [gone](b.md) [bad](a.md#nowhere)\n")
    page = tmp_path / "docs" / "a.md"
    assert [b.split(": ", 1)[1] for b in broken_links(page)] == ["b.md (no such file)", "a.md#nowhere (no such heading)"]
    cite = "docs/" + "a.md"  # built, so that this file names no page itself
    good = f'({cite}, "The first reset") ({cite} ("LLM policies")) {cite}#the-first-reset-of-a-game'
    assert broken_citations(good, "x", tmp_path) == []
    bad = f'({cite}, "Statistics") {cite}#nowhere (' + "docs/" + 'gone.md, "X") ' + f'({cite}, "The first\n    # reset")'
    assert broken_citations(bad, "x", tmp_path) == [
        f'x: {cite}, "Statistics" (no heading or bold lead starts so)', f"x: {cite}#nowhere (no such heading)",
        "x: docs/" + "gone.md (no such page)"]
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "kept.py").write_text("")
    (tmp_path / "studies" / "orphan.py").write_text("")
    (tmp_path / "studies" / "README.md").write_text("* `kept.py`: a study.\n* `moved.py`: another.\n")
    assert unlisted(tmp_path / "studies") == ["studies/orphan.py (not in its README)",
                                              "studies/README.md lists moved.py (no such file)"]
    assert broken_script_paths("python " + "studies/kept.py and " + "studies/moved.py", "x", tmp_path) == [
        "x: studies/" + "moved.py (no such file)"]
