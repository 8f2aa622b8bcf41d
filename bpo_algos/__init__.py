"""Branching Policy Optimization and the shared rollout machinery (engine, trees, meter, loss)."""

from bpo_algos.advantages import estimate_advantages, register_advantage, registered_advantages
from bpo_algos.algorithm import Algorithm, AlgorithmConfig, Batch, Options
from bpo_algos.bpo import BPO, BPOOptions
from bpo_algos.compute import COMPUTE_UNITS, Budget, ComputeMeter
from bpo_algos.policy import Action, Context, Policy, TabularPolicy, TextScorerPolicy
from bpo_algos.registry import make_algorithm, register_algorithm, registered_algorithms
from bpo_algos.rollout import EnvFailureError, EnvPool, RolloutEngine, Topology
from bpo_algos.trainer import Trainer, TrainerConfig
from bpo_algos.tree import Edge, Node, RolloutTree

__all__ = [
    "estimate_advantages",
    "register_advantage",
    "registered_advantages",
    "make_algorithm",
    "register_algorithm",
    "registered_algorithms",
    "BPO",
    "BPOOptions",
    "AlgorithmConfig",
    "Options",
    "COMPUTE_UNITS",
    "Action",
    "Algorithm",
    "Batch",
    "Budget",
    "ComputeMeter",
    "Context",
    "Edge",
    "EnvFailureError",
    "EnvPool",
    "Node",
    "Policy",
    "RolloutEngine",
    "RolloutTree",
    "TabularPolicy",
    "TextScorerPolicy",
    "Topology",
    "Trainer",
    "TrainerConfig",
]
