"""The positive control ``frozen`` skips its collection after one checked update (docs/main-job.md,
"Scheduling"; ``Trainer.train``'s ``skip_zero_loss_collection``): on a WebShop seed that probes,
the run that skips equals the run that collects in every evaluation (played again, not reused),
in its probes, in its budget and in its final state; the skip is refused where the state could
move (weight decay, a learner) and a false zero-loss declaration raises."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from baselines.rloo import RLOO
from bpo_algos.controls import Frozen
from bpo_algos.policy.weights import state_digest
from bpo_algos.trainer import Trainer
from bpo_experiments import runner
from bpo_experiments.presets import PRESETS, _trainer
from bpo_experiments.run_config import env_config, run_config
from bpo_experiments.tasks import env_factory, task_split

UPDATES = 4


@pytest.fixture(scope="module")
def webshop(tmp_path_factory):
    """The smoke preset's WebShop (budget 128 env steps, evaluations at 0, 2, 4, probes on seed 0
    at updates 0 and 2): its initial job on seed 0."""
    smoke = PRESETS["smoke"]
    preset = replace(smoke, envs={"webshop": smoke.envs["webshop"]}, algorithms=("rloo", "frozen"), trainer=_trainer(updates=UPDATES))
    train, evals = task_split(preset.envs["webshop"])
    init = runner.initial_job(env_config(preset, "webshop"), 0, train, evals)
    return preset, train, evals, init


def _run(webshop, out, skip):
    preset, train, evals, init = webshop
    config = run_config(preset, "webshop", "frozen", 0, len(train))
    assert config.probing and config.settings.eval_points == (0, 2, 4)
    result = runner.run_one(out, config, init["policy"], init["warm"], init["reference"], train, evals, skip_zero_loss_collection=skip)
    checkpoint = torch.load(out / "runs" / "webshop" / "frozen" / "seed0" / "checkpoint.pt", weights_only=False)
    policy = runner.initial_policy(("webshop", 0), init["policy"], None)
    policy.load_state_dict(checkpoint["policy"])
    return result, state_digest(policy), config.trainer.budget


def test_frozen_skipping_its_collection_equals_frozen_collecting(webshop, tmp_path, monkeypatch):
    skipped, skipped_digest, budget = _run(webshop, tmp_path / "skip", True)
    # played again: the run that collects evaluates its policy afresh at every point
    with monkeypatch.context() as m:
        m.setattr(runner, "state_digest", lambda policy: None)
        collected, collected_digest, _ = _run(webshop, tmp_path / "collect", False)
    assert not any(e.get("warm_start_state") for e in collected["evals"][1:])
    assert all(e.get("warm_start_state") for e in skipped["evals"][1:])
    # every evaluation, the final state and the probes (their own batches) are the same
    assert [(e["update"], e["success"]) for e in skipped["evals"]] == [(e["update"], e["success"]) for e in collected["evals"]]
    assert skipped_digest == collected_digest == state_digest(runner.initial_policy(("webshop", 0), webshop[3]["policy"], None))
    assert set(skipped["probes"]) == {"initial", "mid"}
    # (frozen's probe gradients are zero: its SNR is NaN, hence the comparison as JSON)
    assert json.dumps(skipped["probes"], sort_keys=True) == json.dumps(collected["probes"], sort_keys=True)
    # one collected update, the same as the collecting run's first; the others report the budget as spent
    assert collected["collected_updates"] == UPDATES and skipped["collected_updates"] == 1
    assert skipped["curve"][0] == collected["curve"][0] and all(math.isnan(v) for v in skipped["curve"][1:])
    first = collected["compute_cumulative"][0]
    assert skipped["compute_cumulative"] == [first + budget.amount * u for u in range(UPDATES)]
    # what the run that collects spends an update: the budget, up to where the start rule lands
    spent = [b - a for a, b in zip([0, *collected["compute_cumulative"]], collected["compute_cumulative"], strict=False)]
    assert all(abs(s - budget.amount) <= 0.25 * budget.amount for s in spent)
    assert skipped["evals"][-1]["compute"][budget.unit] == first + budget.amount * (UPDATES - 1)
    assert skipped["budget_multiple"] == collected["budget_multiple"] and skipped["config"] == collected["config"]
    assert skipped["mechanism"]["warm"] == collected["mechanism"]["warm"] and "mid" not in skipped["mechanism"]
    assert skipped["final_success"] == collected["final_success"] == skipped["warm_success"]
    assert skipped["grad_norm_var_train"] == collected["grad_norm_var_train"] == 0.0


def _trainer_on(webshop, algorithm, **config):
    preset, train, _, init = webshop
    run = run_config(preset, "webshop", "frozen", 0, len(train))
    policy = runner.initial_policy(("webshop", 0), init["policy"], None)
    pool = runner.EnvPool([env_factory(preset.envs["webshop"])] * 2)
    return Trainer(algorithm, policy, pool, train, replace(run.trainer, updates=2, out_dir=None, checkpoint_every=0, **config)), pool


def test_the_skip_is_refused_where_the_state_could_move(webshop):
    frozen = Frozen(RLOO(group_size=2, seed=0), "rloo")
    trainer, pool = _trainer_on(webshop, frozen)
    try:
        assert trainer.skip_refusal() is None
        history = trainer.train(skip_zero_loss_collection=True)
        assert [row.get("collected", True) for row in history] == [True, False]
    finally:
        pool.close()
    # AdamW's decoupled weight decay moves the weights at a zero gradient: frozen would learn
    trainer, pool = _trainer_on(webshop, frozen, optimizer="adamw", weight_decay=0.01)
    try:
        assert "weight decay" in trainer.skip_refusal()
        before = state_digest(trainer.policy)
        history = trainer.train(skip_zero_loss_collection=True)
        assert [row.get("collected", True) for row in history] == [True, True] and state_digest(trainer.policy) != before
    finally:
        pool.close()
    # a learner's loss is not zero: it always collects
    trainer, pool = _trainer_on(webshop, RLOO(group_size=2, seed=0))
    try:
        assert "not zero" in trainer.skip_refusal()
    finally:
        pool.close()
    with_kl = Frozen(RLOO(group_size=2, seed=0, kl_coef=0.1), "rloo")
    assert not with_kl.zero_loss


class FalselyFrozen(Frozen):
    """Declares a zero loss, and learns: RLOO's advantages are kept."""

    def compute_advantages(self, trees):
        self.inner.compute_advantages(trees)

    def _as_own(self, batch, finish):
        if finish:
            self.end_batch(batch)
        return batch


def test_a_false_zero_loss_declaration_raises(webshop):
    trainer, pool = _trainer_on(webshop, FalselyFrozen(RLOO(group_size=2, seed=0), "rloo"))
    try:
        with pytest.raises(RuntimeError, match="declares a zero loss"):
            trainer.train(skip_zero_loss_collection=True)
        assert trainer.update == 1  # the checked update, then nothing skipped
    finally:
        pool.close()

