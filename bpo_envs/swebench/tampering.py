"""What grading resets: the test machinery that pytest and Python load on their own.

An agent is graded by the repository's tests, so the cheapest "fix" an optimizer finds is to
change how those tests run rather than what they test: a ``conftest.py`` hook that reports every
test as passed, a ``pytest.py`` at the root that shadows pytest and prints ``PASSED`` lines, an
``addopts`` that loads a plugin. swebench's eval script resets only the test files its test
patch touches, so everything else the agent wrote runs during grading. Before the eval script
runs (both backends, in the fresh copy the patch was applied to), every path of
:data:`MACHINERY` below is put back as it was before the patch: restored when the agent
changed or deleted it, removed when the agent added it. The paths reset are listed in
``info["tampered"]`` and the observation says so; the reward counts only what the repository's
own tests say. See docs/reliability.md ("Reward tampering").

The list (one rule per entry of :data:`MACHINERY`; ``*`` below means "at any depth"):

* ``*/conftest.py``: pytest imports every conftest.py on the way to the tests it runs, and
  its hooks (``pytest_runtest_makereport``, ``pytest_collection_modifyitems``, ...) decide
  outcomes.
* pytest's own configuration files, whole: ``*/pytest.ini``, ``*/.pytest.ini``,
  ``*/pytest.toml``, ``*/.pytest.toml`` (pytest takes the first configuration file found
  from the tests' common folder upwards, so one in ``tests/`` wins over the root's).
* pytest's sections of shared configuration files, only those sections (the rest of the file
  stays the agent's change): ``*/setup.cfg`` ``[tool:pytest]`` (and ``[pytest]``),
  ``*/tox.ini`` ``[pytest]``, ``*/pyproject.toml`` ``[tool.pytest...]`` (``ini_options`` and
  pytest 9's native table; the whole ``tool.pytest`` key, however the TOML spells it).
* modules at the repository root that shadow what Python or pytest imports: ``python -m
  pytest`` puts the root first on ``sys.path``, ahead of site-packages and the standard library,
  so ``pytest.py``, ``_pytest/__init__.py``, ``py.py``, ``unittest.py``, ``argparse.py`` ...
  would be imported instead. Reset: a root module (``NAME.py``, ``.pyc``, ``.pyw``, ``.so``,
  ``.pyd``; a link named ``NAME``) or package marker (``NAME/__init__.*``) for every ``NAME``
  in :data:`SHADOWED_MODULES` (pytest, its dependencies and plugins' usual ones,
  ``sitecustomize``, ``usercustomize`` and the standard library's top-level modules).
* ``*.pth`` at any depth (site's path-configuration files run code at start-up wherever a
  folder becomes a site directory).
* bytecode of those modules: ``*/__pycache__/conftest.*`` and the root's
  ``__pycache__/NAME.*`` (and ``NAME/__pycache__/__init__.*``) for the names above: Python and
  pytest's assertion rewriting load a cached ``.pyc`` instead of the source when it records the
  source's timestamp and size, and the docker image's timestamps are known to the agent.
* ``*/*.dist-info/**`` and ``*/*.egg-info/**``: package metadata on ``sys.path`` (the root, an
  editable install's folder) is read by ``importlib.metadata``, and an ``entry_points.txt``
  with a ``pytest11`` group is a plugin pytest loads on its own.
* the test runner the row's test command names, whole (:func:`runner_files`): a script such as
  Django's ``tests/runtests.py`` or sympy's ``bin/test``, the settings module that
  ``--settings=NAME`` names next to it, and ``tox.ini`` when the command runs ``tox``.
* environment: grading runs with a clean environment, never the agent's: the local backend's
  sandbox starts from an empty environment (``--clearenv`` and a fixed ``PATH``/``HOME``/``LANG``)
  with a fresh ``/tmp`` as ``HOME``; the docker backend grades in a fresh container of the
  instance image with the image's environment and no ``BASH_ENV``. Nothing the agent's
  commands exported or wrote outside ``/testbed`` (``PYTEST_ADDOPTS``, ``PYTEST_PLUGINS``,
  ``PYTHONPATH``, ``~/.bashrc``, site-packages) reaches the eval script.

Limits (what this does not do):

* a real fix that must change one of these files is graded without that change (the
  observation and ``info["tampered"]`` name it); the test patch may change them, and the eval
  script applies it after the reset.
* only what pytest and Python load on their own is reset: code the tests import runs inside
  pytest's process and could still reach pytest's plugin manager (through ``gc``) at import
  time; stopping that needs outcomes reported from outside the process under test.
* code the tests import is the agent's to change: the package under test (pytest-dev/pytest's
  own ``src/_pytest`` included), test helpers, and test files the test patch does not touch
  (swebench's own convention). A non-pytest runner that lives inside the package under test
  (sympy's ``sympy/testing/runtests.py``, Django's ``django/test/runner.py``) cannot be reset
  without reverting real fixes; only the runner script the test command names is.
* shadowing is reset at the repository root only: pytest's default ``prepend`` import mode also
  puts test folders without ``__init__.py`` first on ``sys.path``, but by then pytest and its
  dependencies are imported; a module there can only shadow what test code imports later.
  A root module shadowing a third-party package that is neither pytest's nor one listed
  (a plugin the image installs) is not reset.
* a pyproject.toml whose pytest table cannot be cut out line by line (dotted keys, inline
  tables) or that the sandbox's Python cannot parse (no ``tomllib``: Python < 3.11) is
  restored whole; so is a section file that is not a regular UTF-8 file.
* plugins that read other files on their own (``pytest-dotenv``'s ``.env``) are not covered.

This module is also the program that does the reset inside the sandbox: standard library only,
Python 3.7+, run as ``python -I -S`` from ``/`` (so nothing in ``/testbed``, no ``.pth`` and no
site-packages is imported), ``snapshot`` before the patch is applied and ``reset`` after it.
Nothing agent-controlled runs before the reset: ``git apply`` and ``patch`` run no code.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import stat
import sys

REPORT_PREFIX = "BPO-GYM-MACHINERY-RESET "
"""The line the reset step prints first on the grading run's own output: this prefix, then
``{"reset": [paths], "count": n}`` in JSON (the paths that fit in :data:`REPORT_CHARS`, each
cut to :data:`PATH_CHARS`; ``count``: how many were reset)."""
REPORT_CHARS = 4000
"""The report line's length bound: the grading run's output keeps its first 5,000 characters."""
PATH_CHARS = 300

WHOLE_FILE_NAMES = ("conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml")
"""Files reset whole wherever they are."""

SECTION_FILES = {
    "setup.cfg": ("tool:pytest", "pytest"),
    "tox.ini": ("pytest",),
    "pyproject.toml": ("tool.pytest",),
}
"""Shared configuration files (at any depth) and the sections of them that are pytest's."""

METADATA_DIR_SUFFIXES = (".dist-info", ".egg-info")
"""Package metadata folders: everything below one (at any depth) is reset."""

_PYTEST_AND_FRIENDS = (
    "pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "exceptiongroup", "tomli",
    "tomllib", "colorama", "pygments", "attr", "attrs", "more_itertools", "atomicwrites", "six",
    "wcwidth", "toml", "xdist", "pytest_cov", "coverage", "hypothesis", "_hypothesis_pytestplugin",
    "execnet", "pytest_timeout", "pytest_mock", "pytest_asyncio", "pytest_rerunfailures",
    "unittest", "doctest", "sitecustomize", "usercustomize", "site",
)
_STDLIB_FALLBACK = (
    "abc", "argparse", "ast", "atexit", "bdb", "builtins", "codecs", "collections", "contextlib",
    "copy", "dataclasses", "datetime", "decimal", "difflib", "dis", "enum", "errno", "fnmatch",
    "functools", "gc", "glob", "importlib", "inspect", "io", "itertools", "json", "keyword",
    "linecache", "locale", "logging", "math", "operator", "os", "pathlib", "pdb", "pickle",
    "platform", "pprint", "random", "re", "shlex", "shutil", "signal", "socket", "string",
    "struct", "subprocess", "sys", "tempfile", "textwrap", "threading", "time", "token",
    "tokenize", "traceback", "types", "typing", "warnings", "weakref", "zipfile", "zipimport",
)
SHADOWED_MODULES = frozenset(_PYTEST_AND_FRIENDS) | frozenset(
    getattr(sys, "stdlib_module_names", _STDLIB_FALLBACK)  # third-party: sys, Python >= 3.10 only
)
"""Top-level module names a root-level module or package must not shadow."""

MACHINERY = (
    ("*/conftest.py", "pytest imports it and its hooks decide test outcomes"),
    ("*/pytest.ini, */.pytest.ini, */pytest.toml, */.pytest.toml",
     "pytest's configuration (addopts, plugins, python_files ...), the first found wins"),
    ("*/setup.cfg [tool:pytest], */tox.ini [pytest], */pyproject.toml [tool.pytest]",
     "the same configuration inside shared files (only those sections are reset)"),
    ("root NAME.py/.pyc/.so, NAME/__init__.* for NAME in SHADOWED_MODULES",
     "python -m pytest puts the root first on sys.path: it would shadow pytest or the stdlib"),
    ("*.pth", "site runs them at start-up in a site directory"),
    ("*/*.dist-info/**, */*.egg-info/**", "entry points (pytest11) that pytest loads on its own"),
    ("*/__pycache__/conftest.*, and the root shadows' __pycache__ entries",
     "bytecode loaded instead of the source when it records the source's timestamp and size"),
    ("the runner script the test command names (and its --settings module, tox.ini for tox)",
     "a non-pytest runner prints the outcomes itself"),
    ("environment (PYTEST_ADDOPTS, PYTEST_PLUGINS, PYTHONPATH, ...)",
     "never the agent's: a clean sandbox environment (local) or a fresh container (docker)"),
)
"""The documented list: ``(what, why)`` for each rule :func:`classify` implements."""


# ---- which paths ------------------------------------------------------------------------
def _module_name(name: str) -> str | None:
    """The module ``name`` would be imported as from a ``sys.path`` folder, or None."""
    for suffix in (".py", ".pyc", ".pyw"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    if name.endswith((".so", ".pyd")):
        return name.split(".", 1)[0]
    return name if "." not in name else None


def classify(relpath: str, runner: frozenset[str] = frozenset(), is_dir: bool = False) -> str | None:
    """``"whole"`` (reset the entry as a whole), ``"section"`` (reset pytest's sections of it)
    or None (the agent's to change) for the entry at ``relpath`` (``/``-separated, relative to
    the repository root; ``is_dir``: a real folder, which shadows a module only through its
    ``__init__``)."""
    parts = relpath.split("/")
    name = parts[-1]
    if relpath in runner or name in WHOLE_FILE_NAMES or name.endswith(".pth"):
        return "whole"
    if any(p.endswith(METADATA_DIR_SUFFIXES) for p in parts):
        return "whole"
    if len(parts) == 1 and not (is_dir and "." not in name) and _module_name(name) in SHADOWED_MODULES:
        return "whole"
    if len(parts) == 2 and parts[0] in SHADOWED_MODULES and _module_name(name) == "__init__":
        return "whole"
    if len(parts) >= 2 and parts[-2] == "__pycache__":
        # bytecode Python and pytest's assertion rewriting load instead of a source whose
        # timestamp and size it records: the docker image's timestamps are known to the agent
        stem = name.split(".", 1)[0]
        if stem == "conftest" or (len(parts) == 2 and stem in SHADOWED_MODULES) or (
                len(parts) == 3 and parts[0] in SHADOWED_MODULES and stem == "__init__"):
            return "whole"
    if name in SECTION_FILES:
        return "section"
    return None


def runner_files(test_cmd: str | None) -> list[str]:
    """The files of a row's test command that are reset whole: every relative path it names (the
    runner script: ``./tests/runtests.py``, ``bin/test``; swebench appends the test files
    later, so these are not tests), the module ``--settings=NAME`` names next to the first of
    them, and ``tox.ini`` when the command runs ``tox``."""
    if not test_cmd:
        return []
    import shlex

    try:
        words = shlex.split(test_cmd)
    except ValueError:
        words = test_cmd.split()
    out: list[str] = []
    for word in words:
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word):
            continue  # VAR=value
        if word == "tox" or word.endswith("/tox"):
            out.append("tox.ini")
        elif word.startswith("--settings="):
            module = word.split("=", 1)[1]
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", module):
                script_dir = out[0].rsplit("/", 1)[0] if out and "/" in out[0] else ""
                rel = module.replace(".", "/") + ".py"
                out.append(f"{script_dir}/{rel}" if script_dir else rel)
        elif not word.startswith(("-", "/")) and "/" in word and "::" not in word:
            path = os.path.normpath(word)
            if not path.startswith("..") and path != ".":
                out.append(path)
    return sorted(set(out), key=out.index)


# ---- pytest's sections of shared files --------------------------------------------------
_BOM = "\ufeff"


def _ini_header(line: str) -> str | None:
    """The section name if ``line`` is a section header as iniconfig (pytest's INI parser)
    reads it, else None."""
    if line.lstrip()[:1] in ("#", ";"):
        return None
    line = line.rstrip()
    if not line or line[0] != "[":
        return None
    for c in "#;":
        line = line.split(c)[0].rstrip()
    if line.endswith("]"):
        return line[1:-1].strip()
    return None


_KEY_PART = re.compile(r"""\s*(?:([A-Za-z0-9_-]+)|"((?:[^"\\]|\\.)*)"|'([^']*)')\s*(?:\.|$)""")


def _toml_key(text: str) -> tuple[str, ...] | None:
    """The dotted key of a TOML table header's inside (``tool . "pytest".ini_options``), or
    None when it is not one this reads (a cut made with it is then checked by parsing)."""
    keys: list[str] = []
    i = 0
    while i < len(text):
        m = _KEY_PART.match(text, i)
        if not m or m.end() == i:
            return None
        if m.group(2) is not None:
            try:
                keys.append(json.loads('"' + m.group(2) + '"'))
            except ValueError:
                return None
        else:
            keys.append(m.group(1) if m.group(1) is not None else m.group(3))
        i = m.end()
    return tuple(keys) if keys else None


def _toml_header(line: str) -> str | None:
    """``"tool.pytest"`` for a table header under ``tool.pytest``, ``""`` for another header,
    None for a line that is not a header."""
    m = re.match(r"^\s*\[\[?([^\[\]]*)\]\]?\s*(#.*)?$", line.rstrip("\r\n"))
    if not m:
        return None
    key = _toml_key(m.group(1))
    return "tool.pytest" if key is not None and key[:2] == ("tool", "pytest") else ""


def _blocks(text: str, header: object) -> list[tuple[str | None, str]]:
    """``text`` cut at its section headers: ``[(section name or None, block text)]``."""
    out: list[tuple[str | None, str]] = [(None, "")]
    for line in text.splitlines(True):
        name = header(line)  # type: ignore[operator]
        if name is not None:
            out.append((name, line))
        else:
            out[-1] = (out[-1][0], out[-1][1] + line)
    return out


def _splice(base: str, agent: str, names: tuple[str, ...], header: object) -> str:
    """``agent`` with its ``names`` sections replaced by ``base``'s (at the first one's place,
    else at the end)."""
    keep = [b for n, b in _blocks(base, header) if n in names]
    keep = [b if b.endswith(("\n", "\r")) else b + "\n" for b in keep]
    out: list[str] = []
    placed = False
    for name, block in _blocks(agent, header):
        if name in names:
            if not placed:
                out.extend(keep)
                placed = True
            continue
        out.append(block)
    if not placed and keep:
        if out and out[-1] and not out[-1].endswith(("\n", "\r")):
            out[-1] += "\n"
        out.extend(keep)
    return "".join(out)


def _ini_sections(text: str, names: tuple[str, ...]) -> list[list[str]]:
    return [b.splitlines() for n, b in _blocks(text, _ini_header) if n in names]


def splice_ini(base: str, agent: str, names: tuple[str, ...]) -> str | None:
    """``agent`` (an INI file's text) with pytest's ``names`` sections exactly as in ``base``;
    None when that cannot be done line by line."""
    bom = agent.startswith(_BOM)
    base_text, agent_text = base[len(_BOM):] if base.startswith(_BOM) else base, agent[1:] if bom else agent
    if _ini_sections(base_text, names) == _ini_sections(agent_text, names):
        return agent
    out = _splice(base_text, agent_text, names, _ini_header)
    if _ini_sections(out, names) != _ini_sections(base_text, names):
        return None
    return (_BOM if bom else "") + out


def _toml_loads() -> object:
    try:
        import tomllib  # type: ignore[import-not-found]

        return tomllib.loads
    except ImportError:
        return None


def _without_pytest(doc: dict) -> dict:
    doc = dict(doc)
    tool = doc.get("tool")
    if isinstance(tool, dict):
        tool = {k: v for k, v in tool.items() if k != "pytest"}
        if tool:
            doc["tool"] = tool
        else:
            doc.pop("tool")
    return doc


def _pytest_of(doc: dict) -> object:
    tool = doc.get("tool")
    return tool.get("pytest") if isinstance(tool, dict) else None


def splice_toml(base: str, agent: str) -> str | None:
    """``agent`` (a pyproject.toml's text) whose ``tool.pytest`` is ``base``'s and whose every
    other key is ``agent``'s, checked by parsing; None when that cannot be done (no TOML parser,
    a file that does not parse, a pytest table cut-and-paste cannot move)."""
    if base == agent:
        return agent
    loads = _toml_loads()
    if loads is None:
        return None
    try:
        b, a = loads(base), loads(agent)  # type: ignore[operator]
    except Exception:  # noqa: BLE001 - any parse error: restore the whole file
        return None
    if _pytest_of(a) == _pytest_of(b):
        return agent
    out = _splice(base, agent, ("tool.pytest",), _toml_header)
    try:
        o = loads(out)  # type: ignore[operator]
    except Exception:  # noqa: BLE001
        return None
    if _pytest_of(o) != _pytest_of(b) or _without_pytest(o) != _without_pytest(a):
        return None
    return out


def splice(name: str, base: bytes, agent: bytes) -> bytes | None:
    """The bytes of section file ``name`` to grade with: ``agent``'s with pytest's sections as in
    ``base`` (``base`` empty: the file is new); None: restore the whole file."""
    try:
        base_text, agent_text = base.decode("utf-8"), agent.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if name == "pyproject.toml":
        out = splice_toml(base_text, agent_text)
    else:
        out = splice_ini(base_text, agent_text, SECTION_FILES[name])
    return None if out is None else out.encode("utf-8")


# ---- the program: snapshot before the patch, reset after it -------------------------------
def _walk(root: str, runner: frozenset[str]) -> dict[str, str]:
    """``relpath -> kind`` of every entry :func:`classify` names under ``root`` (no links
    followed, the root's ``.git`` left out; iterative: any depth)."""
    found: dict[str, str] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel) if rel else root))
        except OSError:
            continue
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            if path == ".git":
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            kind = classify(path, runner, is_dir)
            if kind is not None:
                found[path] = kind
            if is_dir:
                stack.append(path)
    return found


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _entry(path: str) -> list:
    """What a reset compares: the type and the content (digest and exec bit, link target)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ["missing"]
    if stat.S_ISLNK(st.st_mode):
        return ["link", os.readlink(path)]
    if stat.S_ISDIR(st.st_mode):
        return ["dir"]
    if stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        return ["file", bool(st.st_mode & 0o111), digest.hexdigest()]
    return ["other", stat.S_IFMT(st.st_mode)]


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _put(root: str, rel: str, entry: list, data: bytes = b"") -> None:
    """Make ``root/rel`` the entry ``entry`` (a file's bytes: ``data``); every folder on the way
    is made a real folder (a link or file in its place is removed first), so nothing is
    written through a link."""
    cur = root
    for part in rel.split("/")[:-1]:
        cur = os.path.join(cur, part)
        if os.path.islink(cur) or (os.path.lexists(cur) and not os.path.isdir(cur)):
            os.unlink(cur)
        if not os.path.lexists(cur):
            os.mkdir(cur)
    path = os.path.join(root, rel)
    _remove(path)
    if entry[0] == "link":
        os.symlink(entry[1], path)
    elif entry[0] == "dir":
        os.mkdir(path)
    elif entry[0] == "file":
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),  # third-party: os, platform flag
                     0o755 if entry[1] else 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)


_MISSING = ["missing"]


def snapshot(root: str, store: str, runner: frozenset[str]) -> None:
    """Save every entry :func:`classify` names under ``root`` (before the patch: the base
    commit's tree as the sandbox has it) to the JSON file ``store``."""
    saved = {}
    for rel, kind in _walk(root, runner).items():
        path = os.path.join(root, rel)
        entry = _entry(path)
        data = base64.b64encode(_read(path)).decode() if entry[0] == "file" else ""
        saved[rel] = {"kind": kind, "entry": entry, "data": data}
    with open(store, "w", encoding="utf-8") as fh:
        json.dump(saved, fh)


def reset(root: str, store: str, runner: frozenset[str]) -> list[str]:
    """Put every entry :func:`classify` names back as :func:`snapshot` saw it (pytest's sections
    only, for section files); return the paths changed (``"PATH [pytest section]"`` for a
    section reset)."""
    with open(store, encoding="utf-8") as fh:
        before = json.load(fh)
    now = _walk(root, runner)
    changed: list[str] = []
    for rel in sorted(set(before) | set(now)):
        saved = before.get(rel) or {"kind": now.get(rel), "entry": _MISSING, "data": ""}
        old, kind = saved["entry"], saved["kind"]
        path = os.path.join(root, rel)
        if old == _MISSING and not os.path.lexists(path):
            continue  # its folder was removed above
        cur = _entry(path)
        if cur == old or cur[0] == old[0] == "dir":
            continue
        old_bytes = base64.b64decode(saved["data"])
        if kind == "section" and cur[0] == "file" and old[0] in ("file", "missing"):
            agent = _read(path)
            out = splice(rel.rsplit("/", 1)[-1], old_bytes, agent)
            if out is not None:
                if out != agent:
                    _put(root, rel, cur, out)
                    changed.append(f"{rel} [pytest section]")
                continue
        if old == _MISSING:
            _remove(path)
        else:
            _put(root, rel, old, old_bytes)
        changed.append(rel)
    return changed


def main(argv: list[str]) -> int:
    """``snapshot|reset ROOT STORE [RUNNER_FILE ...]``; ``reset`` prints :data:`REPORT_PREFIX`
    and the JSON list of paths reset as its only line."""
    if len(argv) < 3 or argv[0] not in ("snapshot", "reset"):
        print("usage: tampering.py snapshot|reset ROOT STORE [RUNNER_FILE ...]", file=sys.stderr)
        return 2
    mode, root, store, runner = argv[0], argv[1], argv[2], frozenset(argv[3:])
    if mode == "snapshot":
        snapshot(root, store, runner)
    else:
        changed = reset(root, store, runner)
        sys.stdout.write(report_line(changed) + "\n")
        sys.stdout.flush()
    return 0


def report_line(changed: list[str]) -> str:
    """The report of ``changed`` (:data:`REPORT_PREFIX`), at most :data:`REPORT_CHARS` long."""
    listed: list[str] = []
    size = len(REPORT_PREFIX) + 40
    for path in changed:
        shown = path if len(path) <= PATH_CHARS else path[: PATH_CHARS // 2] + "..." + path[-PATH_CHARS // 2:]
        size += len(json.dumps(shown)) + 2
        if size > REPORT_CHARS:
            break
        listed.append(shown)
    return REPORT_PREFIX + json.dumps({"reset": listed, "count": len(changed)})


# ---- the host's side --------------------------------------------------------------------
def program_source() -> str:
    """This module's source: the program the runner writes into the sandbox."""
    with open(__file__, encoding="utf-8") as fh:
        return fh.read()


def read_report(output: str) -> tuple[list[str], int] | None:
    """``(paths listed, how many were reset)`` from the reset step's report on the grading run's
    own output (its first report line: the agent's code runs after it), or None when there is
    none (the reset did not run or failed). Paths are made valid UTF-8 text."""
    for line in output.splitlines():
        if line.startswith(REPORT_PREFIX):
            try:
                report = json.loads(line[len(REPORT_PREFIX):])
            except ValueError:
                return None
            if not isinstance(report, dict):
                return None
            paths, count = report.get("reset"), report.get("count")
            if not (isinstance(paths, list) and all(isinstance(p, str) for p in paths)
                    and isinstance(count, int) and count >= len(paths)):
                return None
            return [_text(p) for p in paths], count
    return None


def _text(path: str) -> str:
    """``path`` (a file name as Python reads it: undecodable bytes as lone surrogates) as valid
    text, each undecodable byte a U+FFFD."""
    try:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return path.encode("utf-8", "replace").decode("utf-8")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
