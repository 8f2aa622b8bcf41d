"""``RolloutTree``: the rollouts of one task, for every algorithm.

The root is the reset state; a node is a decision point (history ``h``); an edge is one agent
step. A *branch node* has ``K`` child edges, i.i.d. samples from the policy at ``h`` (the root
branches into ``N`` for GRPO/RLOO, ``K0`` for BPO); every other inner node has one. A leaf is a
finished episode.

docs/unbiasedness.md, rule 3, computed by :meth:`RolloutTree.finalize`:

* weight: ``w(e) = prod over branch nodes b above e (including e's source) of 1 / K_b``, so each
  branch node's subtree counts as one sample and the leaf weights of a tree sum to 1;
* value: ``Q(e) = r(e) + mean_{e' out of child(e)} Q(e')`` — the weighted mean, over the leaves
  below ``e``, of the reward collected from ``e`` on.

:meth:`RolloutTree.to_dict` / :meth:`RolloutTree.from_dict` and :func:`save_trees` /
:func:`load_trees` keep a tree for looking at later (``bpo_algos.viz``): structure, action
texts, rewards, weights, values, advantages, entropies, branch factors, ``won``, task id,
algorithm and compute, without the tokens.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from bpo_algos.compute import DERIVED_UNITS, ComputeMeter
from bpo_algos.policy.base import Action, Context

logger = logging.getLogger(__name__)

TREE_FORMAT = "bpo-gym.rollout-trees"
TREE_FORMAT_VERSION = 1


@dataclass(eq=False)
class Node:
    """A decision point (or a leaf)."""

    context: Context
    info: dict[str, Any]
    parent: Edge | None = None
    children: list[Edge] = field(default_factory=list)
    depth: int = 0
    entropy: float | None = None
    """Decision entropy computed here before sampling (None where none was needed)."""
    branch_factor: int = 1
    """K of a branch node (how many i.i.d. actions were sampled here), else 1."""

    @property
    def observation(self) -> str:
        return self.context.observation

    @property
    def is_branch(self) -> bool:
        return self.branch_factor > 1

    @property
    def is_leaf(self) -> bool:
        return self.parent is not None and (self.parent.terminated or self.parent.truncated)


@dataclass(eq=False)
class Edge:
    """One agent step: the action taken at ``parent`` and what the env answered."""

    parent: Node
    child: Node
    action: Action
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    weight: float = 0.0
    q: float = 0.0
    advantage: float = 0.0

    @property
    def context(self) -> Context:
        return self.parent.context

    @property
    def entropy(self) -> float | None:
        return self.parent.entropy

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        return self.action.prompt_token_ids

    @property
    def old_logprobs(self) -> tuple[float, ...]:
        return self.action.logprobs

    @property
    def won(self) -> bool:
        return bool(self.info.get("won", False))


@dataclass(eq=False)
class RolloutTree:
    """All rollouts of one task: nodes, edges, weights (rule 3), values, compute used."""

    task_id: Any
    root: Node
    compute: ComputeMeter = field(default_factory=ComputeMeter)
    algorithm: str | None = None
    """Name of the algorithm that collected the tree (set by ``Algorithm.collect``)."""
    seed: int | None = None
    """The env seed the tree's root was reset with (set by the engine). An algorithm's own
    per-tree randomness derives from it, so a tree is the same whichever rank builds it."""
    index: int | None = None
    """The tree's index in its batch (set by the engine): with the batch's seed, the key of the
    tree's random stream (:mod:`bpo_algos.rollout`)."""

    def edges(self) -> list[Edge]:
        """Every edge, depth-first, children in sampling order."""
        out: list[Edge] = []
        stack = list(reversed(self.root.children))
        while stack:
            edge = stack.pop()
            out.append(edge)
            stack.extend(reversed(edge.child.children))
        return out

    def nodes(self) -> Iterator[Node]:
        yield self.root
        for edge in self.edges():
            yield edge.child

    def leaf_edges(self) -> list[Edge]:
        """The last edge of every finished episode."""
        return [e for e in self.edges() if e.terminated or e.truncated]

    def branch_nodes(self) -> list[Node]:
        return [n for n in self.nodes() if n.is_branch]

    @property
    def branch_points(self) -> int:
        """Inner branch nodes: branch nodes other than the root (0 for a GRPO/RLOO fan)."""
        return sum(1 for n in self.branch_nodes() if n is not self.root)

    def finalize(self) -> None:
        """Compute every edge's weight and value ``Q`` (rule 3)."""

        def visit(node: Node, weight: float) -> float:
            # returns the mean Q of node's out-edges (0 at a leaf)
            if not node.children:
                return 0.0
            share = weight / len(node.children)
            total = 0.0
            for edge in node.children:
                edge.weight = share
                edge.q = edge.reward + visit(edge.child, share)
                total += edge.q
            return total / len(node.children)

        # iterative depth would be nicer, but episodes are at most a few hundred steps
        visit(self.root, 1.0)

    # ---- summaries (weighted: unbiased estimates for the policy that collected the tree) --
    def mean_return(self) -> float:
        """Weighted mean episode return (= mean Q of the root's children)."""
        kids = self.root.children
        return sum(e.q for e in kids) / len(kids) if kids else 0.0

    def success_rate(self) -> float:
        """Weighted fraction of won episodes."""
        return sum(e.weight * e.won for e in self.leaf_edges())

    def path_to(self, edge: Edge) -> list[Edge]:
        """Edges from the root down to ``edge`` (inclusive)."""
        path = [edge]
        while path[-1].parent.parent is not None:
            path.append(path[-1].parent.parent)
        return path[::-1]

    # ---- serialisation (what a picture or an offline look needs; no token tensors) ------
    def to_dict(self, *, observations: bool = False) -> dict[str, Any]:
        """A JSON-ready dict: structure, action texts, rewards, weights, ``Q``, advantages,
        decision entropies, branch factors, ``won``, task id, algorithm and compute.

        Nodes are a flat list in depth-first order, each naming its parent's index, so a
        500-step episode needs no deep nesting. Token ids and per-token log-probs are left
        out (an action keeps its total log-prob); observations only with
        ``observations=True`` (they can be whole web pages or terminal logs).
        """
        index: dict[int, int] = {id(self.root): 0}
        nodes = [_node_dict(self.root, None, observations)]
        for edge in self.edges():
            index[id(edge.child)] = len(nodes)
            record = _node_dict(edge.child, index[id(edge.parent)], observations)
            record["edge"] = {
                "action": edge.action.text,
                **({"env_action": edge.action.env_action} if edge.action.env_action is not None else {}),
                "logprob": edge.action.logprob,
                "reward": edge.reward,
                "terminated": edge.terminated,
                "truncated": edge.truncated,
                "weight": edge.weight,
                "q": edge.q,
                "advantage": edge.advantage,
                "info": {**_scalar_info(edge.info), "won": edge.won},
            }
            nodes.append(record)
        return {
            "task_id": _jsonable_task_id(self.task_id),
            "algorithm": self.algorithm,
            "seed": self.seed,
            "compute": self.compute.to_dict(),
            "nodes": nodes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutTree:
        """The tree :meth:`to_dict` described (weights, ``Q`` and advantages as stored).

        A loaded action has no tokens: ``token_ids == ()`` and ``logprobs`` holds one entry,
        the action's total log-prob, so it can be looked at but not trained on.
        """
        try:
            records = data["nodes"]
            task_id = data["task_id"]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a RolloutTree dict (missing {exc})") from exc
        if not records or records[0].get("parent") is not None:
            raise ValueError("a RolloutTree dict starts with its root (a node without parent)")
        known = {f.name for f in fields(ComputeMeter)}
        compute = data.get("compute", {})
        extra = set(compute) - known - set(DERIVED_UNITS)  # derived values are recomputed
        if extra:
            logger.warning("ignoring unknown compute fields %s of a saved tree", sorted(extra))
        first = records[0]
        root = Node(
            context=Context(task_id, first.get("observation", ""), None, (), first.get("observation", "")),
            info=dict(first.get("info", {})),
            entropy=first.get("entropy"),
            branch_factor=int(first.get("branch_factor", 1)),
        )
        nodes = [root]
        for i, record in enumerate(records[1:], start=1):
            parent_index = record.get("parent")
            if not isinstance(parent_index, int) or not 0 <= parent_index < i:
                raise ValueError(f"node {i} of a saved tree names parent {parent_index!r}; parents come first")
            parent = nodes[parent_index]
            e = record["edge"]
            action = Action(e["action"], (), (float(e.get("logprob", 0.0)),), e.get("env_action"))
            child = Node(
                context=parent.context.child(action.command, record.get("observation", ""), None),
                info=dict(record.get("info", {})),
                depth=parent.depth + 1,
                entropy=record.get("entropy"),
                branch_factor=int(record.get("branch_factor", 1)),
            )
            edge = Edge(
                parent, child, action, float(e["reward"]), bool(e["terminated"]), bool(e["truncated"]),
                dict(e.get("info", {})), float(e.get("weight", 0.0)), float(e.get("q", 0.0)), float(e.get("advantage", 0.0)),
            )
            child.parent = edge
            parent.children.append(edge)
            nodes.append(child)
        return cls(
            task_id=task_id,
            root=root,
            compute=ComputeMeter(**{k: v for k, v in compute.items() if k in known}),
            algorithm=data.get("algorithm"),
            seed=data.get("seed"),
        )


def _node_dict(node: Node, parent: int | None, observations: bool) -> dict[str, Any]:
    record: dict[str, Any] = {"parent": parent, "branch_factor": node.branch_factor, "entropy": node.entropy}
    if observations:
        record["observation"] = node.context.observation
    info = _scalar_info(node.info)
    if info:
        record["info"] = info
    return record


def _scalar_info(info: dict[str, Any]) -> dict[str, Any]:
    """The short scalar entries of an env's ``info`` (``won``, scores, ids), not its lists."""
    out: dict[str, Any] = {}
    for k, v in info.items():
        if isinstance(v, np.generic):  # numpy's bool_ and int64 are no JSON types
            v = v.item()
        if isinstance(k, str) and (isinstance(v, bool | int | float) or (isinstance(v, str) and len(v) <= 200)):
            out[k] = v
    return out


def _jsonable_task_id(task_id: Any) -> Any:
    if task_id is None or isinstance(task_id, bool | int | float | str):
        return task_id
    try:
        json.dumps(task_id)
    except TypeError:
        logger.warning("task id %r is not JSON: saved as its str()", task_id)
        return str(task_id)
    return task_id


def save_trees(trees: Iterable[RolloutTree], path: str | os.PathLike[str], *, observations: bool = False) -> Path:
    """Write ``trees`` to ``path`` as JSON (gzip-compressed when the name ends in ``.gz``).

    The file holds ``{"format": "bpo-gym.rollout-trees", "version": 1, "trees": [...]}`` with
    one :meth:`RolloutTree.to_dict` per tree; it is written to a temporary name and renamed,
    so a reader never sees half a file.
    """
    path = Path(path)
    payload = {
        "format": TREE_FORMAT,
        "version": TREE_FORMAT_VERSION,
        "trees": [tree.to_dict(observations=observations) for tree in trees],
    }
    data = json.dumps(payload, separators=(",", ":")).encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def load_trees(path: str | os.PathLike[str]) -> list[RolloutTree]:
    """The trees :func:`save_trees` wrote to ``path`` (gzip recognised by its magic bytes)."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a saved-trees JSON file: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != TREE_FORMAT:
        raise ValueError(f"{path} is not a saved-trees file (no format {TREE_FORMAT!r})")
    if payload.get("version") != TREE_FORMAT_VERSION:
        raise ValueError(f"{path} has saved-trees version {payload.get('version')!r}; this bpo-gym reads {TREE_FORMAT_VERSION}")
    return [RolloutTree.from_dict(t) for t in payload["trees"]]
