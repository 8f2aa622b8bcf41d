"""Nonsense arguments give a ValueError that names the argument."""

from __future__ import annotations

import pytest

from baselines import GRPO, RLOO
from bpo_algos import BPO, Budget, TabularPolicy, TrainerConfig


@pytest.mark.parametrize(
    "factory, name",
    [
        (lambda: BPO(branch_factor=1), "branch_factor"),
        (lambda: BPO(backbones=1), "backbones"),
        (lambda: BPO(max_depth=0), "max_depth"),
        (lambda: BPO(entropy_quantile=1.5), "entropy_quantile"),
        (lambda: BPO(entropy_threshold=-1.0), "entropy_threshold"),
        (lambda: BPO(max_branch_points=-1), "max_branch_points"),
        (lambda: BPO(aggregation="sum"), "aggregation"),
        (lambda: GRPO(group_size=1), "group_size"),
        (lambda: GRPO(scale="batch"), "scale"),
        (lambda: RLOO(group_size=0), "group_size"),
        (lambda: RLOO(clip_eps=0.0), "clip_eps"),
        (lambda: RLOO(kl_coef=-0.1), "kl_coef"),
        (lambda: Budget("env_steps", -5), "amount"),
        (lambda: Budget("env_steps", 0), "amount"),
        (lambda: Budget("furlongs", 10), "unit"),
        (lambda: TrainerConfig(updates=0), "updates"),
        (lambda: TrainerConfig(optimizer="lion"), "optimizer"),
        (lambda: TrainerConfig(budget=("env_steps", -1)), "amount"),
        (lambda: TabularPolicy(temperature=0), "temperature"),
    ],
)
def test_bad_arguments_name_themselves(factory, name):
    with pytest.raises(ValueError, match=name):
        factory()


def test_collect_with_no_tasks_or_envs():
    with pytest.raises(ValueError, match="tasks"):
        RLOO(group_size=2).collect(TabularPolicy(), [lambda: None], [])
    with pytest.raises(ValueError, match="env_fns"):
        RLOO(group_size=2).collect(TabularPolicy(), [], [0])
