"""The packages import only downward and never in a circle.

Layers, lowest first: ``bpo_envs`` (environments) <- ``bpo_algos`` (engine, algorithms,
trainer) <- ``baselines`` (GRPO, RLOO, GiGPO, Tree-GRPO) <- ``bpo_experiments`` (the main job
and the studies around it). Every ``import`` statement counts, also one
inside a function or under ``TYPE_CHECKING``: each is a dependency a reader has to follow.
Built-in algorithms reach ``bpo_algos`` through entry points (``pyproject.toml``), not imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bpo_envs", "bpo_algos", "baselines", "bpo_experiments")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules that ``name`` imports (``from a import b``: ``a.b`` when that is a
    module, else ``a``)."""
    is_package = path.name == "__init__.py"
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
        out.update(t for t in targets if t in known and t != name)
    return out


def layer(module: str) -> int:
    return PACKAGES.index(module.split(".")[0])


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
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_upward_import():
    found = upward(graph())
    assert not found, "imports from a layer above (bpo_envs <- bpo_algos <- baselines <- bpo_experiments):\n" + "\n".join(found)


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
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        edges = graph()
    finally:
        ROOT = saved
    assert cycles(edges) == [["bpo_envs.a", "bpo_envs.b"]]
    # the top layer imports every layer below it; an import of it from below is refused
    assert upward(edges) == ["baselines.y -> bpo_experiments.z", "bpo_algos.x -> baselines"]


if __name__ == "__main__":  # the report: modules, imports, cycles, upward imports
    edges = graph()
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports between them")
    print("cycles:", cycles(edges) or "none")
    print("upward imports:", upward(edges) or "none")
