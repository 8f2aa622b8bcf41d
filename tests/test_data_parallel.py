"""Data-parallel training: two gloo ranks under torchrun or accelerate reproduce one process.

Every tree has its own random stream (update, index), the trees are split round robin over the
ranks, and the loss of
each rank is divided by the global normaliser before the gradients are summed, so after three
SGD updates the parameters of 2 ranks equal those of 1 process up to float summation order.
With ``fsdp=True`` the tiny Qwen2 is sharded with FSDP2 over the 2 ranks; in float64 the
summation order is all that differs, so the parameters agree to ~1e-12 (any error in the
normaliser, the zero passes or the reduce would show at ~1e-3), also across a resume.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bpo_algos import data_parallel as dp

HERE = Path(__file__).resolve().parent


def test_update_seeds_and_shards_do_not_depend_on_the_rank_count():
    assert dp.update_seed(1, 2) == dp.update_seed(1, 2) != dp.update_seed(1, 3)
    assert dp.shard_indices(5, 0, 2) == [0, 2, 4] and dp.shard_indices(5, 1, 2) == [1, 3]
    assert sorted(dp.shard_indices(7, 0, 3) + dp.shard_indices(7, 1, 3) + dp.shard_indices(7, 2, 3)) == list(range(7))
    assert dp.all_reduce_sum([1.5, 2]) == [1.5, 2.0] and dp.world_size() == 1


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """``dp_train.py``'s one-process run for given arguments, made once for the module: the
    torchrun and the accelerate test of the default scorer setting compare against one run."""
    made: dict[tuple[str, ...], dict] = {}

    def run(*args: str) -> dict:
        if args not in made:
            made[args] = _one(tmp_path_factory.mktemp("one") / "one.pt", *args)
        return made[args]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["token-mean", "step-sum"])
def test_two_gloo_ranks_give_the_parameters_of_one_process(tmp_path, aggregation, one_process):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun (ships with torch) not found"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    two = tmp_path / "two.pt"
    subprocess.run(
        [torchrun, "--nproc_per_node=2", "--standalone", str(HERE / "dp_train.py"), str(two), aggregation],
        check=True,
        env=env,
        timeout=300,
    )
    a, b = one_process(aggregation), torch.load(two)
    assert [r["n_trees"] for r in a["history"]] == [r["n_trees"] for r in b["history"]] == [4, 4, 4]
    for x, y in zip(a["history"], b["history"], strict=True):
        assert x["compute"]["env_steps"] == y["compute"]["env_steps"]
        assert x["success"] == pytest.approx(y["success"]) and x["loss"] == pytest.approx(y["loss"], abs=1e-6)
    init = _init()
    assert max(float((a["params"][k] - init[k]).abs().max()) for k in init) > 1e-4  # training changed the parameters
    for key in a["params"]:
        torch.testing.assert_close(a["params"][key], b["params"][key], rtol=0, atol=1e-6)
    diff = max(float((a["params"][k] - b["params"][k]).abs().max()) for k in a["params"])
    print(f"max |theta_2proc - theta_1proc| after 3 updates ({aggregation}): {diff:.3g}")


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-5), ("float64", 1e-9)])
def test_default_settings_give_one_process_and_two_ranks_the_same_parameters(tmp_path, dtype, tolerance):
    # what a user moving from one GPU to eight does: nothing but launch it differently. The
    # summation order of the gradients (one batch vs two halves) is all that differs: float
    # rounding, which Adam scales up where a gradient is tiny (float32, the default: 1.7e-6
    # measured after 3 updates; float64: 1.7e-10). Another seeding rule shows at 2e-2, and a
    # parameter whose gradient is zero by construction (the output bias the scorer had) at 5e-2.
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    args = ["--defaults", "--dtype", dtype]
    subprocess.run([sys.executable, str(HERE / "dp_train.py"), str(one), *args], check=True, env=env, timeout=300)
    subprocess.run([torchrun, "--nproc_per_node=2", "--standalone", str(HERE / "dp_train.py"), str(two), *args],
                   check=True, env=env, timeout=300)
    a, b = torch.load(one), torch.load(two)
    assert [r["n_trees"] for r in a["history"]] == [r["n_trees"] for r in b["history"]] == [8, 8, 8]
    init = _init()
    assert max(float((a["params"][k] - init[k].to(a["params"][k].dtype)).abs().max()) for k in init) > 1e-3
    diff = max(float((a["params"][k] - b["params"][k]).abs().max()) for k in a["params"])
    print(f"max |theta_2ranks - theta_1proc| after 3 updates, default TrainerConfig, {dtype}: {diff:.3g}")
    assert diff <= tolerance


@pytest.mark.slow
def test_evaluation_split_over_two_ranks_gives_the_episodes_of_one_process(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    subprocess.run([sys.executable, str(HERE / "dp_eval.py"), str(one)], check=True, env=env, timeout=300)
    subprocess.run([torchrun, "--nproc_per_node=2", "--standalone", str(HERE / "dp_eval.py"), str(two)], check=True, env=env, timeout=300)
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert (a["world"], b["world"]) == (1, 2)
    assert a["wins"] == b["wins"] and len(a["wins"]) == 7 * 3 and 0 < sum(a["wins"]) < 21  # episode by episode


@pytest.mark.slow
def test_the_main_job_runs_under_torchrun_with_rank_0_writing(tmp_path):
    # every rank trains every run together; evaluations are split over the ranks; rank 0 writes
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    out = tmp_path / "two"
    args = ["-m", "bpo_experiments.compare", "--smoke", "--envs", "webshop", "--updates", "2", "--no-progress", "--out", str(out)]
    subprocess.run([torchrun, "--nproc_per_node=2", "--standalone", *args], check=True, env=env, timeout=600)
    results = json.loads((out / "results.json").read_text())
    assert results["timing"]["ranks"] == 2 and results["timing"]["jobs"] == 1
    algorithms = results["per_env"]["webshop"]["algorithms"]
    assert set(algorithms) == {"bpo", "grpo", "rloo", "frozen", "reinforce", "rloo-2x"}
    for name, row in algorithms.items():
        # the budget is split over the ranks, each starting trees while its half lasts;
        # the calibration arm rloo-2x runs at twice the budget by design
        scale = 2.0 if name == "rloo-2x" else 1.0
        assert 0.7 * scale <= row["budget_used_ratio"] <= 1.1 * scale, (name, row["budget_used_ratio"])
    assert all(not p.name.endswith(".tmp") for p in out.rglob("*"))
    run = out / "runs" / "webshop" / "rloo" / "seed0"
    assert json.loads((run / "run.json").read_text())["evals"][0]["update"] == 0 and (run / "checkpoint.pt").exists()
    bad = subprocess.run([torchrun, "--nproc_per_node=2", "--standalone", *args[:-1], str(tmp_path / "x"), "--jobs", "2"],
                         env=env, timeout=300, capture_output=True, text=True)
    assert bad.returncode != 0 and "leave --jobs at 1" in bad.stderr + bad.stdout


def _make():
    import gymnasium as gym

    import bpo_envs  # noqa: F401

    return gym.make("BPO-TreeMDP-v0", depth=2, n_actions=3, seed=4, n_tasks=3)


def _scorer():
    from bpo_algos.policy.scorer import TextScorerPolicy

    return TextScorerPolicy(buckets=128, dim=4, hidden=8, seed=3)


def test_micro_batches_of_at_most_k_steps_give_the_one_batch_gradient():
    from baselines import GRPO

    policy, algorithm = _scorer(), GRPO(group_size=3, seed=2)
    batch = algorithm.collect(policy, [_make], [0, 1])
    groups = batch.micro_batches(None, 2)
    assert max(len(g) for g in groups) == 2 and [i for g in groups for i in g] == list(range(len(batch.steps)))
    assert batch.micro_batches(10**6, 3) == batch.micro_batches(None, 3)
    algorithm.loss(policy, batch).backward()
    whole = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    calls = []
    algorithm.backward(policy, batch, micro_batch_steps=2, before_micro_batch=lambda: calls.append(1))
    assert len(calls) == len(groups)
    for a, p in zip(whole, policy.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-7)


def test_fsdp_on_one_process_warns_and_trains_unsharded(tmp_path, caplog):
    from baselines import GRPO
    from bpo_algos import Trainer, TrainerConfig

    with pytest.raises(ValueError, match="fsdp"):
        TrainerConfig(fsdp="yes")
    config = TrainerConfig(updates=1, tasks_per_update=2, optimizer="sgd", fsdp=True, out_dir=tmp_path)
    with caplog.at_level("WARNING", logger="bpo_algos.trainer"):
        trainer = Trainer(GRPO(group_size=2), _scorer(), [_make], [0, 1, 2], config)
    assert not trainer.fsdp and "nothing to shard" in caplog.text
    trainer.train()
    # a checkpoint of another sharding cannot be resumed: its optimizer state has another form
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    state["fsdp"] = True
    torch.save(state, tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match="with FSDP sharding"):
        Trainer(GRPO(group_size=2), _scorer(), [_make], [0, 1, 2], dataclasses.replace(config, updates=2))


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert path, f"{name} not found next to {sys.executable}"
    return path


def _one(out: Path, *args: str) -> dict:
    subprocess.run([sys.executable, str(HERE / "dp_train.py"), str(out), *args], check=True, env=_env(), timeout=300)
    return torch.load(out, weights_only=False)


def _torchrun(out: Path, *args: str) -> dict:
    cmd = [_tool("torchrun"), "--nproc_per_node=2", "--standalone", str(HERE / "dp_train.py"), str(out), *args]
    subprocess.run(cmd, check=True, env=_env(), timeout=300)
    return torch.load(out, weights_only=False)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _counts(row: dict) -> dict:
    return {k: v for k, v in row["compute"].items() if k != "seconds"}


HF = ("--policy", "hf", "--dtype", "float64")


@pytest.mark.slow  # 1 launch of one process, 2 of 2 FSDP ranks, per case: ~50 s of CPU
@pytest.mark.parametrize("optimizer,lora", [("adam", True), ("sgd", False)])
def test_fsdp_ranks_give_the_parameters_of_one_process_and_resume_where_they_stopped(tmp_path, optimizer, lora):
    """Two FSDP2 ranks train 2 updates, stop, and resume for a 3rd: the same parameters as one process.

    Adam with LoRA adapters: moments to gather and shard again; SGD on the full model with a KL
    term whose frozen reference (a full copy on every rank) is part of the checkpoint. Both clip
    the gradient (its norm is ~40), so the global norm must be reduced over the shards.
    """
    pytest.importorskip("transformers")
    args = (*HF, "--optimizer", optimizer, "--max-grad-norm", "10")
    args += ("--lora",) if lora else ("--kl-coef", "0.5")
    one = _one(tmp_path / "one.pt", *args)
    part = _torchrun(tmp_path / "part.pt", *args, "--fsdp", "--updates", "2", "--out-dir", str(tmp_path / "run"))
    assert part["world_size"] == 2 and part["fsdp"]
    assert "unsharded policy" in part["probe_error"]
    for x, y in zip(one["history"][:2], part["history"], strict=True):
        assert (x["n_trees"], x["n_steps"], _counts(x)) == (y["n_trees"], y["n_steps"], _counts(y))
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-9)
    checkpoint = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert checkpoint["update"] == 2 and checkpoint["fsdp"]
    assert set(checkpoint["policy"]) == set(one["params"])  # the full, unsharded weights
    assert bool(checkpoint["optimizer"]["state"]) == (optimizer == "adam")  # Adam's moments, gathered
    if optimizer == "sgd":
        assert any(k.startswith("_reference.") for k in checkpoint["policy"])
    resumed = _torchrun(tmp_path / "resumed.pt", *args, "--fsdp", "--updates", "3", "--out-dir", str(tmp_path / "run"))
    assert resumed["history"][:2] == part["history"]  # loaded, not recomputed
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3
    from bpo_algos.policy import HFPolicy
    from bpo_algos.policy.tiny import tiny_model_path

    if lora:  # the adapters' B matrices start at zero
        assert min(float(v.abs().max()) for k, v in one["params"].items() if "lora_B" in k) > 1e-4
    else:
        init = HFPolicy(tiny_model_path(), device="cpu", dtype=torch.float64).state_dict()
        trained = {k: one["params"][k] for k in init}  # (the KL reference is not a parameter)
        assert _max_diff(trained, init) > 1e-3  # training changed the parameters
    diff = _max_diff(one["params"], resumed["params"])
    print(f"max |theta_fsdp2 resumed after 2 - theta_1proc| after 3 {optimizer} updates (float64, lora={lora}): {diff:.3g}")
    assert diff < 1e-9


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # two launches of the TextScorerPolicy script: ~15 s
def test_accelerate_launch_gives_the_parameters_of_one_process(tmp_path, one_process):
    pytest.importorskip("accelerate")
    one = one_process("token-mean")  # dp_train.py's default aggregation
    # accelerate's torchrun launcher; without a GPU the ranks join a gloo group (``--cpu
    # --num_processes N`` needs MPI, ``--mpirun_hostfile``, else it starts one process)
    cmd = [
        _tool("accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
        str(HERE / "dp_train.py"), str(tmp_path / "acc.pt"),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, env=_env(), timeout=300)
    two = torch.load(tmp_path / "acc.pt", weights_only=False)
    assert two["world_size"] == 2
    assert [_counts(r) for r in one["history"]] == [_counts(r) for r in two["history"]]
    diff = _max_diff(one["params"], two["params"])
    print(f"max |theta_accelerate2 - theta_1proc| after 3 updates: {diff:.3g}")
    assert diff < 1e-6


def _init() -> dict[str, torch.Tensor]:
    from bpo_algos.policy.scorer import TextScorerPolicy

    return {k: v.clone() for k, v in TextScorerPolicy(buckets=512, dim=8, hidden=16, seed=3).state_dict().items()}

