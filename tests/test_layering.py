"""The packages import only downward and never in a circle.

Layers, lowest first: ``bpo_envs`` (environments) <- ``bpo_algos`` (engine, algorithms,
trainer) <- ``baselines`` (GRPO, RLOO, GiGPO, Tree-GRPO) <- ``bpo_experiments`` (the main job
and the studies around it) <- the script folders ``scripts/`` (tools), ``benchmarks/`` and
``studies/`` (docs/layout.md): a script may import any package, no package may import a script,
whether as ``studies.x`` or, the way scripts import one another through ``sys.path``, as ``x``.
Every ``import`` statement counts, also one
inside a function or under ``TYPE_CHECKING``: each is a dependency a reader has to follow.
Built-in algorithms reach ``bpo_algos`` through entry points (``pyproject.toml``), not imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bpo_envs", "bpo_algos", "baselines", "bpo_experiments")
SCRIPT_FOLDERS = ("scripts", "benchmarks", "studies")  # one layer, above every package


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    for folder in SCRIPT_FOLDERS:
        for path in sorted((ROOT / folder).glob("*.py")):
            found[f"{folder}.{path.stem}"] = path
    return found


def script_names(known: dict[str, Path]) -> dict[str, str]:
    """A script's bare name (``bench_serve``, as another script imports it through ``sys.path``)
    -> its module (``benchmarks.bench_serve``)."""
    return {name.split(".", 1)[1]: name for name in known if name.split(".")[0] in SCRIPT_FOLDERS}


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules that ``name`` imports (``from a import b``: ``a.b`` when that is a
    module, else ``a``)."""
    is_package = path.name == "__init__.py"
    bare = script_names(known)
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        targets = [bare.get(t.split(".")[0], t) if t not in known else t for t in targets]
        out.update(t for t in targets if t in known and t != name)
    return out


def layer(module: str) -> int:
    top = module.split(".")[0]
    return len(PACKAGES) if top in SCRIPT_FOLDERS else PACKAGES.index(top)


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} -> {b}" for a, targets in edges.items() for b in targets if layer(b) > layer(a)
    )


def test_no_import_cycle():
    edges = graph()
    assert len(edges) > 50  # the walk found the packages
    assert {"scripts.device_check", "benchmarks.bench_serve", "studies.eta_bias_table"} <= set(edges)
    assert "benchmarks.bench_serve" in edges["benchmarks.fault_serve"]  # a bare import through sys.path
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_upward_import():
    found = upward(graph())
    assert not found, ("imports from a layer above (bpo_envs <- bpo_algos <- baselines <- bpo_experiments "
                       "<- scripts, benchmarks, studies):\n" + "\n".join(found))


def test_the_walk_sees_what_it_must_refuse(tmp_path):
    # a cycle and an upward import, in a throwaway tree: both are reported
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "bpo_envs" / "a.py").write_text("def f():\n    from bpo_envs import b\n")
    (tmp_path / "bpo_envs" / "b.py").write_text("from . import a\n")
    (tmp_path / "bpo_algos" / "x.py").write_text("import baselines\n")
    (tmp_path / "baselines" / "y.py").write_text("from bpo_experiments import z\n")
    (tmp_path / "bpo_experiments" / "z.py").write_text("import bpo_algos.x\n")
    for folder in SCRIPT_FOLDERS:
        (tmp_path / folder).mkdir()
    # a study may import every package and a benchmark by its bare name; a package may import neither
    (tmp_path / "studies" / "s.py").write_text("import bpo_experiments.z\nimport bpo_envs.a\nfrom b_one import f\n")
    (tmp_path / "benchmarks" / "b_one.py").write_text("import baselines.y\n")
    (tmp_path / "bpo_envs" / "c.py").write_text("import studies.s\n")
    (tmp_path / "baselines" / "w.py").write_text("def f():\n    from b_one import f\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        edges = graph()
    finally:
        ROOT = saved
    assert cycles(edges) == [["bpo_envs.a", "bpo_envs.b"]]
    # the top layer imports every layer below it; an import of it from below is refused
    assert edges["studies.s"] == {"bpo_experiments.z", "bpo_envs.a", "benchmarks.b_one"}
    assert upward(edges) == ["baselines.w -> benchmarks.b_one", "baselines.y -> bpo_experiments.z",
                             "bpo_algos.x -> baselines", "bpo_envs.c -> studies.s"]


if __name__ == "__main__":  # the report: modules, imports, cycles, upward imports
    edges = graph()
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports between them")
    print("cycles:", cycles(edges) or "none")
    print("upward imports:", upward(edges) or "none")
