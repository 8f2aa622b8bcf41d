"""Pictures of rollout trees: :func:`draw_tree` and the ``bpo-trees`` command.

:func:`draw_tree` draws any :class:`~bpo_algos.tree.RolloutTree` (GRPO's fan, BPO's backbones
with their forks, nested forks, trees that lost lines to env failures) with matplotlib, as PNG
or SVG by the file's suffix. The picture reads left to right:

* the root on the left; depth (the step) grows to the right, and every node sits at the x of
  its depth. Runs of steps without a branch are drawn compressed: between two depths where
  something branches the x axis grows like ``1 + log2(steps)``, so a 50-step episode takes a
  few label widths, not 50; the ticks give the real step numbers;
* one row per leaf (finished episode); an inner node sits midway between its first and last
  child; a grey bracket joins a branch node to its children;
* every step is a piece of line coloured by its advantage (a diverging colormap centred at 0,
  at least ±``ADVANTAGE_FLOOR`` wide, so advantages that are all 0 draw neutral grey;
  see the colorbar), as thick as its weight (docs/unbiasedness.md, rule 3), with a tick
  between steps where they are far enough apart;
* above a line, the actions of its steps (shortened), as many as fit, always the first one
  (which is what tells siblings apart); below it, the number of steps it stands for;
* a branch node is a diamond with ``K`` (how many i.i.d. actions were sampled there) and ``H``,
  the decision entropy (nats) the branch decision used;
* a leaf is a green dot (won), a black cross (lost) or a grey square (cut by the step limit),
  followed by the episode's return ``R``.

``bpo-trees RUN_DIR`` (also ``python -m bpo_algos.viz``) draws the trees a
:class:`~bpo_algos.trainer.Trainer` saved under ``RUN_DIR`` (``TrainerConfig.save_trees_every``).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bpo_algos.tree import Edge, Node, RolloutTree, load_trees
from bpo_envs.console import ends_on_ctrl_c

FORMATS = ("png", "svg")
TREES_DIR = "trees"
"""The folder of a run directory that holds its saved batches (``update00010.json.gz``, ...)."""

# sizes in inches / points; chosen by looking at the pictures
_UNIT_IN = 1.45  # width of one compressed-x unit (a one-step segment)
_MAX_AXES_W_IN = 40.0
_ROW_IN = 0.36
_MAX_AXES_H_IN = 60.0
_FONT = 7.0
_MONO_EM = 0.6  # advance of a DejaVu Sans Mono glyph, in em
_SANS_EM = 0.62  # a generous average for DejaVu Sans
_MAX_LABEL = 30
_ADVANTAGE_COLOURS = ("#b2182b", "#ef8a62", "#c4c4c4", "#67a9cf", "#2166ac")

ADVANTAGE_FLOOR = 1e-3
"""The least half-range of the advantage colour scale: advantages this small (a sum of returns
that cancels to 0 in floating point, 1e-16) draw as the neutral middle colour, not saturated."""


def advantage_scale(advantages: Any) -> float:
    """The half-range of the colour scale, centred on 0: the largest ``|advantage|``, at least
    :data:`ADVANTAGE_FLOOR` (so a tree whose advantages are all 0 draws neutral)."""
    return max(max((abs(float(a)) for a in advantages), default=0.0), ADVANTAGE_FLOOR)
_WON, _LOST, _CUT = "#1a9641", "#222222", "#8c8c8c"


def shorten_action(text: str, max_chars: int = _MAX_LABEL) -> str:
    """``text`` on one line in at most ``max_chars`` characters ('' when fewer than 4 fit).

    ``name[argument]`` actions keep their name and closing bracket
    (``search[wireless charging…]``), so the kind of action stays readable.
    """
    flat = " ".join(str(text).split())
    if len(flat) <= max_chars:
        return flat
    if max_chars < 4:
        return ""
    match = re.fullmatch(r"([\w\- ]{1,24}\[)(.*)\]", flat)
    if match:
        head, inner = match.groups()
        if max_chars >= len(head) + 5:
            return head + inner[: max_chars - len(head) - 2] + "…]"
        # no room for the argument: the action's name alone says what kind of step it was
        return head[:-1] + "…" if max_chars >= len(head) else ""
    return flat[: max_chars - 1] + "…"


# ---- layout ----------------------------------------------------------------------------
@dataclass(eq=False)
class _Segment:
    """A run of edges from one drawn node to the next (no branch in between)."""

    edges: list[Edge]

    @property
    def start(self) -> Node:
        return self.edges[0].parent

    @property
    def end(self) -> Node:
        return self.edges[-1].child


@dataclass
class _Layout:
    segments: list[_Segment]
    x: dict[int, float]  # by id(node), for every node
    y: dict[int, float]  # by id(node), for drawn nodes
    terminals: list[Node]  # drawn nodes without children, top to bottom
    inner: list[Node]  # drawn nodes with children (the root and the branch nodes)
    returns: dict[int, float]  # by id(terminal node): reward summed from the root
    anchors: list[tuple[int, float]]  # (depth, x) where the x scale changes
    width: float


def _is_drawn(node: Node) -> bool:
    return node.parent is None or len(node.children) != 1 or node.is_branch


def _gap(steps: int) -> float:
    return 1.0 + math.log2(steps)


def _layout(tree: RolloutTree) -> _Layout:
    segments: list[_Segment] = []
    inner: list[Node] = []
    returns: dict[int, float] = {}
    kids: dict[int, list[Node]] = {}
    order: list[Node] = []  # drawn nodes, pre-order
    max_depth = 0
    stack: list[tuple[Node, float]] = [(tree.root, 0.0)]
    while stack:
        node, collected = stack.pop()
        order.append(node)
        kids[id(node)] = []
        if node.children:
            inner.append(node)
        else:
            returns[id(node)] = collected
        pending = []
        for first in node.children:
            edges, total = [first], collected + first.reward
            while not _is_drawn(edges[-1].child):
                edges.append(edges[-1].child.children[0])
                total += edges[-1].reward
            segment = _Segment(edges)
            segments.append(segment)
            kids[id(node)].append(segment.end)
            max_depth = max(max_depth, segment.end.depth)
            pending.append((segment.end, total))
        stack.extend(reversed(pending))

    terminals = [n for n in order if not n.children]
    y: dict[int, float] = {id(n): float(i) for i, n in enumerate(terminals)}
    for node in reversed(order):  # children before parents
        if node.children:
            ys = [y[id(c)] for c in kids[id(node)]]
            y[id(node)] = (ys[0] + ys[-1]) / 2

    # the x scale: piecewise linear in depth between anchors (the root, every depth where a
    # node branches, the deepest leaf), ``_gap(steps)`` wide between consecutive anchors
    depths = sorted({0, max_depth, *(n.depth for n in inner)})
    anchors = [(depths[0], 0.0)]
    for d in depths[1:]:
        anchors.append((d, anchors[-1][1] + _gap(d - anchors[-1][0])))
    x_of = _depth_scale(anchors)
    x: dict[int, float] = {}
    for node in tree.nodes():
        x[id(node)] = x_of(node.depth)
    return _Layout(segments, x, y, terminals, inner, returns, anchors, anchors[-1][1])


def _depth_scale(anchors: list[tuple[int, float]]) -> Any:
    import bisect

    depths = [d for d, _ in anchors]

    def x_of(depth: int) -> float:
        i = bisect.bisect_left(depths, depth)
        if i < len(depths) and depths[i] == depth:
            return anchors[i][1]
        if i == 0 or i == len(depths):
            raise ValueError(f"depth {depth} outside the tree's depths")
        (d0, x0), (d1, x1) = anchors[i - 1], anchors[i]
        return x0 + (x1 - x0) * (depth - d0) / (d1 - d0)

    return x_of


# ---- drawing ---------------------------------------------------------------------------
def _matplotlib() -> Any:
    import matplotlib  # a core dependency

    return matplotlib


def _title(tree: RolloutTree, layout: _Layout) -> tuple[str, str]:
    head = f"task {tree.task_id}"
    if tree.algorithm:
        head += f"  ·  {tree.algorithm}"
    branch_points = sum(1 for n in layout.inner if n.parent is not None)
    leaves = len(layout.terminals)
    won = sum(1 for n in layout.terminals if n.parent is not None and n.parent.won)
    parts = [
        f"{leaves} leaves ({won} won)",
        f"root K={len(tree.root.children)}",
        f"{branch_points} branch point{'s' if branch_points != 1 else ''}",
        f"depth ≤ {max((n.depth for n in layout.terminals), default=0)}",
    ]
    if tree.root.children:
        parts.append(f"weighted return {tree.mean_return():.3f}, success {tree.success_rate():.2f}")
    if tree.compute.dropped_steps:
        parts.append(f"{tree.compute.dropped_steps} steps dropped after env failures")
    return head, "  ·  ".join(parts)


def _branch_text(node: Node) -> str:
    k = len(node.children)
    text = f"K={k}" if node.branch_factor in (k, 1) else f"K={node.branch_factor} ({k} kept)"
    if node.entropy is not None:
        text += f" H={node.entropy:.2f}"
    return text


_STYLES: dict[str, dict[str, Any]] = {
    # marker styles shared by the nodes and the legend (sizes in points, scaled with the rows)
    "won": {"marker": "o", "ms": 6, "color": _WON},
    "lost": {"marker": "x", "ms": 6, "mew": 1.6, "color": _LOST},
    "step limit": {"marker": "s", "ms": 5, "mfc": "white", "mec": _CUT, "mew": 1.3},
    "unfinished": {"marker": "o", "ms": 5, "mfc": "white", "mec": _CUT, "mew": 1.0},
    "branch": {"marker": "D", "ms": 5.5, "mfc": "white", "mec": "#111111", "mew": 1.1},
    "root": {"marker": "o", "ms": 6, "color": "#111111"},
}


def _style(name: str, scale: float = 1.0) -> dict[str, Any]:
    return {k: v * scale if k in ("ms", "mew") else v for k, v in _STYLES[name].items()}


def _leaf_kind(edge: Edge) -> str:
    if edge.won:
        return "won"
    if edge.terminated:
        return "lost"
    return "step limit" if edge.truncated else "unfinished"  # unfinished: a tree built by hand


@dataclass
class _Sizes:
    """The picture's geometry (inches unless named ``_pt``), from the tree's rows and width."""

    rows: int
    row_in: float
    font: float
    unit_pt: float  # points per x unit
    marker: float  # marker scale
    axes_w: float
    axes_h: float
    left: float = 0.75
    right: float = 1.75
    top: float = 0.75
    bottom: float = 0.95
    pad_l: float = 0.12  # x units
    pad_r: float = 0.08

    @classmethod
    def of(cls, layout: _Layout) -> _Sizes:
        rows = max(len(layout.terminals), 1)
        row_in = min(_ROW_IN, _MAX_AXES_H_IN / rows)
        axes_h = rows * row_in
        span = layout.width + cls.pad_l + cls.pad_r
        # a few long rows: keep the picture from turning into a strip (labels shorten to fit)
        max_w = min(_MAX_AXES_W_IN, max(12.0, 8.0 + 2.0 * axes_h))
        axes_w = min(max(span * _UNIT_IN, 4.0), max_w)
        return cls(
            rows=rows,
            row_in=row_in,
            font=min(_FONT, row_in * 72 * 0.27),
            unit_pt=axes_w / span * 72,
            marker=max(0.35, min(1.0, row_in / _ROW_IN)),
            axes_w=axes_w,
            axes_h=axes_h,
        )

    @property
    def labels(self) -> bool:
        return self.font >= 3.5

    @property
    def fig_w(self) -> float:
        return self.left + self.axes_w + self.right

    @property
    def fig_h(self) -> float:
        return self.bottom + self.axes_h + self.top


def draw_tree(tree: RolloutTree, path: str | os.PathLike[str], *, dpi: int = 150, title: str | None = None) -> Path:
    """Draw ``tree`` into ``path``: PNG or SVG by its suffix (see the module docstring).

    ``title`` replaces the first title line (task id and algorithm). SVGs keep their text as
    text and are byte-for-byte reproducible. Returns the path written.
    """
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"draw_tree writes .png or .svg files; {str(path)!r} has suffix {path.suffix!r}")
    if not isinstance(tree, RolloutTree):
        raise TypeError(f"draw_tree needs a RolloutTree, got {type(tree).__name__}")
    mpl = _matplotlib()
    from matplotlib.colors import LinearSegmentedColormap, Normalize
    from matplotlib.figure import Figure

    layout = _layout(tree)
    size = _Sizes.of(layout)
    scale = advantage_scale(e.advantage for s in layout.segments for e in s.edges)
    norm = Normalize(-scale, scale)
    cmap = LinearSegmentedColormap.from_list("advantage", _ADVANTAGE_COLOURS)

    with mpl.rc_context({"svg.fonttype": "none", "svg.hashsalt": "bpo-gym", "font.size": size.font}):
        fig = Figure(figsize=(size.fig_w, size.fig_h), dpi=dpi)
        ax = fig.add_axes((size.left / size.fig_w, size.bottom / size.fig_h, size.axes_w / size.fig_w, size.axes_h / size.fig_h))
        ax.set_xlim(-size.pad_l, layout.width + size.pad_r)
        ax.set_ylim(size.rows - 0.5, -0.5)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        ax.set_yticks([])
        _draw_steps(ax, layout, size, cmap, norm)
        _draw_nodes(ax, layout, size)
        if not tree.root.children:
            ax.text(0.5, 0.5, "no steps", transform=ax.transAxes, ha="center", va="center")
        _depth_axis(ax, layout, size.unit_pt, size.font)
        _decorate(fig, tree, layout, size, cmap, norm, title)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format=fmt, dpi=dpi, metadata={"Date": None} if fmt == "svg" else None)
    return path


def _draw_steps(ax: Any, layout: _Layout, size: _Sizes, cmap: Any, norm: Any) -> None:
    """One coloured piece per step, brackets from branch nodes, ticks between steps, labels."""
    from matplotlib.collections import LineCollection

    x, y = layout.x, layout.y
    w_max = max((e.weight for s in layout.segments for e in s.edges), default=0.0) or 1.0
    pieces, colours, widths, ticks, brackets = [], [], [], [], []
    for seg in layout.segments:
        row = y[id(seg.end)]
        for edge in seg.edges:
            pieces.append(((x[id(edge.parent)], row), (x[id(edge.child)], row)))
            colours.append(cmap(norm(edge.advantage)))
            widths.append(0.9 + 3.1 * edge.weight / w_max)
        steps = len(seg.edges)
        if steps > 1 and (x[id(seg.end)] - x[id(seg.start)]) * size.unit_pt / steps >= 3.0:
            ticks.extend((x[id(e.child)], row) for e in seg.edges[:-1])
        brackets.append(((x[id(seg.start)], y[id(seg.start)]), (x[id(seg.start)], row)))
    ax.add_collection(LineCollection(brackets, colors="#9a9a9a", linewidths=0.8, zorder=1))
    ax.add_collection(LineCollection(pieces, colors=colours, linewidths=widths, capstyle="butt", zorder=2))
    if ticks:
        ax.scatter(*zip(*ticks, strict=True), marker="|", s=(size.font * 0.9) ** 2, c="#555555", linewidths=0.6, zorder=3)
    if size.labels:
        for seg in layout.segments:
            _label_segment(ax, seg, x, y[id(seg.end)], size.unit_pt, size.font)


def _draw_nodes(ax: Any, layout: _Layout, size: _Sizes) -> None:
    """The root, the branch nodes (with K and H) and the leaves (with their return)."""
    x, y, font = layout.x, layout.y, size.font
    for node in layout.inner:
        at = (x[id(node)], y[id(node)])
        if node.parent is None:
            ax.plot(*at, **_style("root", size.marker), zorder=5)
            ax.annotate(
                _branch_text(node), at, xytext=(-5, 0), textcoords="offset points",
                ha="right", va="center", fontsize=font + 0.5, fontweight="bold", color="#111111",
            )
            continue
        ax.plot(*at, **_style("branch", size.marker), zorder=5)
        if size.labels:
            ax.annotate(
                _branch_text(node), at, xytext=(-4, -2), textcoords="offset points",
                ha="right", va="top", fontsize=font, fontweight="bold", color="#111111", zorder=6,
            )
    for node in layout.terminals:
        if node.parent is None:
            continue
        at = (x[id(node)], y[id(node)])
        ax.plot(*at, **_style(_leaf_kind(node.parent), size.marker), zorder=5)
        if size.labels:
            ax.annotate(
                f"R={layout.returns[id(node)]:.2f}", at, xytext=(6, 0), textcoords="offset points",
                ha="left", va="center", fontsize=font, color=_WON if node.parent.won else "#333333",
            )


def _decorate(fig: Any, tree: RolloutTree, layout: _Layout, size: _Sizes, cmap: Any, norm: Any, title: str | None) -> None:
    """Title lines, the advantage colorbar and the legend."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.lines import Line2D

    fw, fh = size.fig_w, size.fig_h
    head, sub = _title(tree, layout)
    fig.text(size.left / fw, 1 - 0.12 / fh, title or head, ha="left", va="top", fontsize=11, fontweight="bold")
    fig.text(size.left / fw, 1 - 0.42 / fh, sub, ha="left", va="top", fontsize=8)
    bar_h = min(size.axes_h, 3.0)
    cax = fig.add_axes(((size.left + size.axes_w + 0.9) / fw, (size.bottom + size.axes_h - bar_h) / fh, 0.14 / fw, bar_h / fh))
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax, format="%.2g")  # short labels: the floor's 0.001 too
    bar.set_label("advantage", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    handles = [
        *(Line2D([], [], ls="", label=name, **_style(name)) for name in ("won", "lost", "step limit")),
        Line2D([], [], ls="", label="branch node: K samples, H = decision entropy", **_style("branch")),
        Line2D([], [], color="#777777", lw=3.5, label="line width ∝ weight"),
    ]
    fig.legend(
        handles=handles, loc="lower left", bbox_to_anchor=(size.left / fw, 0.04 / fh),
        ncol=len(handles), fontsize=7, frameon=False, handlelength=1.6, columnspacing=1.2,
    )


def _text_pt(text: str, font: float, em: float) -> float:
    return len(text) * font * em


def _label_segment(ax: Any, seg: _Segment, x: dict[int, float], row: float, unit_pt: float, font: float) -> None:
    """Actions above the line (greedy, left to right, never overlapping), steps below it."""
    x_end = x[id(seg.end)]
    gap_pt = font * 0.9
    end_pt = (x_end - x[id(seg.start)]) * unit_pt - 3.0
    free_from = 0.0  # points from the segment's start
    labelled = 0
    for i, edge in enumerate(seg.edges):
        at = (x[id(edge.parent)] - x[id(seg.start)]) * unit_pt
        if at < free_from and i > 0:
            continue
        fits = int((end_pt - at - 3.5) // (font * _MONO_EM))
        label = shorten_action(edge.action.command, min(fits, _MAX_LABEL))
        if not label:
            if i == 0:
                continue
            break
        labelled += 1
        ax.annotate(
            label, (x[id(edge.parent)], row), xytext=(3.5, 1.6), textcoords="offset points",
            ha="left", va="bottom", fontsize=font, family="monospace", color="#222222", zorder=4,
        )
        free_from = at + 3.5 + _text_pt(label, font, _MONO_EM) + gap_pt
    steps = len(seg.edges)
    below_right = _branch_text(seg.end) if seg.end.children else ""
    room = end_pt - (_text_pt(below_right, font, _SANS_EM) + gap_pt if below_right else 0.0)
    if steps > 1 and labelled < steps:  # some steps carry no label: say how many there are
        text = f"{steps} steps"
        if _text_pt(text, font, _SANS_EM) + 2.0 > room:
            text = f"{steps}"
        if _text_pt(text, font * 0.95, _SANS_EM) + 2.0 <= room:
            ax.annotate(
                text, (x[id(seg.start)], row), xytext=(2.0, -1.8), textcoords="offset points",
                ha="left", va="top", fontsize=font * 0.95, style="italic", color="#666666", zorder=4,
            )


def _depth_axis(ax: Any, layout: _Layout, unit_pt: float, font: float) -> None:
    """Ticks at the anchors (real step numbers), thinned to stay apart."""
    min_pt = font * 4
    ticks: list[tuple[float, int]] = [(layout.anchors[0][1], layout.anchors[0][0])]
    for (d0, x0), (d1, x1) in zip(layout.anchors, layout.anchors[1:], strict=False):
        per_step = (x1 - x0) / (d1 - d0)
        stride = max(1, math.ceil(min_pt / (per_step * unit_pt)))  # steps between ticks here
        for depth in [*range(d0 + stride, d1, stride), d1]:
            pos = x0 + per_step * (depth - d0)
            if (pos - ticks[-1][0]) * unit_pt >= min_pt:
                ticks.append((pos, depth))
            elif depth == d1:  # the anchors (where something branches) win over in-between ticks
                if len(ticks) > 1 and ticks[-1][1] not in {d for d, _ in layout.anchors}:
                    ticks[-1] = (pos, depth)
    ax.set_xticks([p for p, _ in ticks], [str(d) for _, d in ticks], fontsize=font)
    for pos, _ in ticks:
        ax.axvline(pos, color="#eeeeee", lw=0.6, zorder=0)
    ax.set_xlabel("step (compressed where nothing branches)", fontsize=font + 0.5)


# ---- the bpo-trees command ---------------------------------------------------------------
def tree_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Every saved batch under ``run_dir``: ``**/trees/*.json[.gz]``, or the file itself."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        return [run_dir]
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory or trees file at {run_dir}")
    found = [p for p in run_dir.rglob("*.json*") if p.parent.name == TREES_DIR and p.name.endswith((".json", ".json.gz"))]
    return sorted(found)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _safe(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(value))[:60]


def draw_run(
    run_dir: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    fmt: str = "png",
    max_trees: int | None = None,
    all_updates: bool = False,
) -> list[Path]:
    """Draw the saved trees of a run directory (what ``bpo-trees`` does); returns the pictures.

    For every folder of saved batches under ``run_dir``, the newest batch (every batch with
    ``all_updates``), at most ``max_trees`` trees of each. Pictures go next to the batch
    (``trees/update00030-tree00-task17.png``), or under ``out`` keeping the folders below
    ``run_dir``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if max_trees is not None and max_trees < 1:
        raise ValueError(f"max_trees must be >= 1, got {max_trees}")
    run_dir = Path(run_dir)
    files = tree_files(run_dir)
    if not files:
        raise FileNotFoundError(
            f"no saved trees under {run_dir} (a Trainer writes them to OUT_DIR/{TREES_DIR}/ with "
            "TrainerConfig(save_trees_every=N))"
        )
    if not all_updates:
        newest: dict[Path, Path] = {}
        for f in files:
            newest[f.parent] = f  # sorted, so the last is the newest update
        files = sorted(newest.values())
    written = []
    base = run_dir if run_dir.is_dir() else run_dir.parent
    for f in files:
        trees = load_trees(f)
        folder = f.parent if out is None else Path(out) / f.parent.relative_to(base)
        run = f.parent.parent.relative_to(base).as_posix() if f.parent.parent != base else base.name
        for i, tree in enumerate(trees[:max_trees]):
            target = folder / f"{_stem(f)}-tree{i:02d}-task{_safe(tree.task_id)}.{fmt}"
            title = " · ".join(str(p) for p in (run, _stem(f), f"task {tree.task_id}", tree.algorithm) if p)
            written.append(draw_tree(tree, target, title=title))
    return written


@ends_on_ctrl_c("bpo-trees")
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bpo-trees",
        description="Draw the rollout trees a run saved (TrainerConfig(save_trees_every=N) writes them to RUN_DIR/trees/).",
    )
    parser.add_argument("run_dir", help="a Trainer out_dir, a folder of runs (searched recursively), or one trees file")
    parser.add_argument("--out", default=None, help="folder for the pictures (default: next to each trees file)")
    parser.add_argument("--format", choices=FORMATS, default="png")
    parser.add_argument("--max", type=int, default=None, dest="max_trees", help="at most N trees per saved batch")
    parser.add_argument("--all-updates", action="store_true", help="every saved batch, not only the newest of each run")
    args = parser.parse_args(argv)
    try:
        written = draw_run(args.run_dir, args.out, fmt=args.format, max_trees=args.max_trees, all_updates=args.all_updates)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        parser.exit(2, f"bpo-trees: error: {exc}\n")
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
