"""Preparing generated ALFWorld games from the shipped game index (docs/alfworld.md, "Many
training games"): a fresh cache gets planner-checked games without the planner, and a damaged or
foreign cache or index is rebuilt or refused, loudly."""

from __future__ import annotations

import gzip
import json
import logging
import time
from pathlib import Path

import pytest

pytest.importorskip("alfworld")

from alfworld_support import private_cache  # noqa: E402

from bpo_envs.alfworld import ALFWorldEnv  # noqa: E402
from bpo_envs.alfworld import game_index as gi  # noqa: E402
from bpo_envs.alfworld.games import GAME_FILE, GeneratedGames  # noqa: E402

SHIPPED = gi.load_index(3, 0)


@pytest.fixture
def fresh_cache(tmp_path_factory: pytest.TempPathFactory):
    with private_cache(tmp_path_factory, "alfworld-games"):
        yield


def _indexed(split: str, n: int) -> list[str]:
    assert SHIPPED is not None, "the package ships bpo_envs/alfworld/data/games-v3-seed0.json.gz"
    ids = sorted(SHIPPED._games[split])
    assert len(ids) >= n
    return ids[:n]


def test_a_fresh_cache_gets_indexed_games_without_the_planner(fresh_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from bpo_envs.alfworld import games as games_module

    def no_planner(*args, **kwargs):
        raise AssertionError("an indexed game went to the planner")

    monkeypatch.setattr(games_module, "make_verified_game", no_planner)
    games = GeneratedGames("train", None, 200, 0)
    ids = _indexed("train", 6)
    start = time.perf_counter()
    for task_id in ids:
        game = games.game(task_id)
        assert game["solvable"] is True and game["walkthrough"] == SHIPPED.entry("train", task_id)["walkthrough"]
        assert gi.game_digest(game) == SHIPPED.entry("train", task_id)["sha256"]
        assert (games.root / task_id / GAME_FILE).is_file()
    assert games.made == {"index": 6}
    assert time.perf_counter() - start < 60  # milliseconds each, plus importing alfworld once
    # read back from the cache: nothing rebuilt
    again = GeneratedGames("train", None, 200, 0)
    assert [again.game(t) for t in ids] and again.made == {}
    assert again.provenance()["game_index"] == {"file": "games-v3-seed0.json.gz", "games": SHIPPED.count("train")}


def test_the_indexed_plan_wins_the_rebuilt_game(fresh_cache: None) -> None:
    task_id = _indexed("valid_seen", 1)[0]
    env = ALFWorldEnv(split="valid_seen", games_per_type=200)
    try:
        obs, info = env.reset(options={"task_id": task_id})
        assert not info["won"]
        for action in env.games.game(task_id)["walkthrough"]:
            obs, reward, terminated, truncated, info = env.step(action)
        assert terminated and info["won"] and reward == 1.0
    finally:
        env.close()


def _pack_script(monkeypatch: pytest.MonkeyPatch):
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "scripts" / "alfworld_pack_games.py"
    spec = importlib.util.spec_from_file_location("alfworld_pack_games", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "alfworld_pack_games", module)  # its workers (forked) find it by name
    return module


def test_packing_is_resumable_and_checkpoints_the_index(fresh_cache: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # scripts/alfworld_pack_games.py: a stopped run keeps what it made (the cache), and the index
    # is rewritten every --checkpoint games with the games done so far, never fewer
    pack = _pack_script(monkeypatch)
    monkeypatch.setattr(pack, "_indexed_first", lambda wanted: (wanted, 0))  # checkpoint from the first game on
    written: list[dict] = []
    write = pack._write
    monkeypatch.setattr(pack, "_write", lambda path, done: written.append(write(path, done)) or written[-1])
    index = tmp_path / "games-v3-seed0.json.gz"
    args = ["--train", "3", "--valid-seen", "1", "--valid-unseen", "0", "--jobs", "1", "--checkpoint", "2", "--index", str(index)]
    first = pack.main(args)
    assert first["made"] == {"cache": 0, "index": 4, "planner": 0}
    assert [w["games"] for w in written] == [{"train": 2, "valid_seen": 0, "valid_unseen": 0}, {"train": 3, "valid_seen": 1, "valid_unseen": 0}]
    mine = gi.load_index(3, 0, index)
    for task_id in pack.order("train", 3):
        assert mine.entry("train", task_id) == SHIPPED.entry("train", task_id)
    again = pack.main(args)  # resumed: every game read back from the cache
    assert again["made"] == {"cache": 4, "index": 0, "planner": 0}
    assert gi.load_index(3, 0, index)._games == mine._games


def test_a_damaged_or_foreign_cached_game_is_rebuilt_and_says_so(fresh_cache: None, caplog: pytest.LogCaptureFixture) -> None:
    task_id = _indexed("train", 1)[0]
    games = GeneratedGames("train", None, 200, 0)
    original = games.game(task_id)
    path = games.root / task_id / GAME_FILE
    for content, why in (
        ("{not json", "damaged"),
        (json.dumps(dict(original, pddl_problem=original["pddl_problem"] + " ")), "another generator version"),
    ):
        path.write_text(content)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="bpo_envs.alfworld.games"):
            assert GeneratedGames("train", None, 200, 0).game(task_id) == original
        assert why in caplog.text and str(path) in caplog.text
        assert json.loads(path.read_text()) == original


def test_a_damaged_or_foreign_index_is_an_error(tmp_path: Path) -> None:
    shipped = gi.index_path(3, 0).read_bytes()
    bad = tmp_path / "games-v3-seed0.json.gz"
    bad.write_bytes(shipped[: len(shipped) // 2])
    with pytest.raises(gi.GameIndexError, match="damaged"):
        gi.load_index(3, 0, bad)
    data = json.loads(gzip.decompress(shipped))
    split = next(s for s, e in data["games"].items() if e)
    task_id = next(iter(data["games"][split]))
    data["games"][split][task_id]["attempt"] += 1  # edited without its checksum
    bad.write_bytes(gzip.compress(json.dumps(data).encode()))
    with pytest.raises(gi.GameIndexError, match="checksum"):
        gi.load_index(3, 0, bad)
    with pytest.raises(gi.GameIndexError, match="seed 0, not v3 seed 1"):
        gi.load_index(3, 1, gi.index_path(3, 0))
    # an index whose recorded game the generator no longer makes: refused, never mixed in
    data["checksum"] = gi._checksum(data["games"])
    bad.write_bytes(gzip.compress(json.dumps(data).encode()))
    with pytest.raises(gi.GameIndexMismatch, match="Regenerate the index"):
        gi.load_index(3, 0, bad).rebuild(split, task_id)


def test_a_game_set_smaller_than_asked_is_an_error() -> None:
    from bpo_experiments.presets import EnvSetup
    from bpo_experiments.tasks import extra_eval_tasks, task_split

    kwargs = {"split": "train", "games_per_type": 2, "task_types": ["pick_and_place_simple"]}
    with pytest.raises(ValueError, match="3 training tasks asked, but the training env has 2"):
        task_split(EnvSetup("BPO-ALFWorld-v0", kwargs, train_tasks=3, eval_tasks=1, eval_split="valid_seen"))
    with pytest.raises(ValueError, match="5 valid_seen evaluation tasks asked, but that split has 2"):
        task_split(EnvSetup("BPO-ALFWorld-v0", kwargs, train_tasks=2, eval_tasks=5, eval_split="valid_seen"))
    with pytest.raises(ValueError, match="4 valid_unseen evaluation tasks asked, but that split has 2"):
        extra_eval_tasks(EnvSetup("BPO-ALFWorld-v0", kwargs, extra_eval={"valid_unseen": 4}))


def test_the_cpu_default_needs_no_planner_on_a_fresh_machine() -> None:
    # every game the CPU default trains and evaluates on is in the shipped index, so a fresh
    # machine rebuilds them in milliseconds each instead of planner-checking them for minutes
    from bpo_experiments.presets import PRESETS
    from bpo_experiments.tasks import extra_eval_tasks, task_split

    setup = PRESETS["cpu"].envs["alfworld"]
    train, evals = task_split(setup)
    wanted = {"train": train, setup.eval_split: evals, **extra_eval_tasks(setup)}
    assert set(wanted) == {"train", "valid_seen", "valid_unseen"}
    for split, ids in wanted.items():
        missing = [t for t in ids if SHIPPED.entry(split, t) is None]
        assert not missing, (split, len(missing), missing[:3])


def test_streams_of_a_further_split_are_its_own() -> None:
    from bpo_experiments.streams import EVALUATION, stream_seed

    assert stream_seed(3, EVALUATION, 5, 1, 0) == stream_seed(3, EVALUATION, 5, 1)  # the primary split's keys are unchanged
    keys = {stream_seed(3, EVALUATION, i, j, k) for i in range(20) for j in range(2) for k in range(3)}
    assert len(keys) == 120


@pytest.mark.slow
def test_the_main_job_evaluates_both_validation_splits(tmp_path: Path) -> None:
    # a tiny ALFWorld comparison: the warm start and each run's final policy on valid_seen (the
    # primary split) and valid_unseen (a further split), reported per split; the positive control
    # (frozen) is the warm start itself, so its final equals its warm start on both splits
    # (common random numbers), while RLOO's is measured afresh
    from bpo_experiments.presets import EnvSetup, Preset, _trainer
    from bpo_experiments.run_config import comparison_config, env_config, run_config
    from bpo_experiments.runner import initial_job, run_one
    from bpo_experiments.stats import aggregate
    from bpo_experiments.tasks import extra_eval_tasks, task_split

    setup = EnvSetup(
        "BPO-ALFWorld-v0", {"max_episode_steps": 4, "split": "train", "expert": "handcoded"}, train_tasks=2, eval_tasks=3,
        eval_split="valid_seen", extra_eval={"valid_unseen": 3}, policy="scorer-memory", sft_epochs=0,
        trainer={"updates": 1, "task_draw": "unseen-first"}, seeds=(0,), eval_every=1, eval_episodes=1, grad_seeds=0,
        budget=16,
    )  # fmt: skip
    preset = Preset(envs={"alfworld": setup}, algorithms=("rloo", "frozen"),
                    trainer=_trainer(updates=1, learning_rate=0.5), torch_threads=1)  # fmt: skip
    train, evals = task_split(setup)
    for split, ids in {"train": train, "valid_seen": evals, **extra_eval_tasks(setup)}.items():
        assert all(SHIPPED.entry(split, t) is not None for t in ids)  # no planner in this test
    init = initial_job(env_config(preset, "alfworld"), 0, train, evals)
    assert set(init["warm"]["extra"]) == {"valid_unseen"} and init["warm"]["extra"]["valid_unseen"]["episodes"] == 3
    runs = [run_one(tmp_path, run_config(preset, "alfworld", a, 0, len(train)), init["policy"], init["warm"], init["reference"], train, evals)
            for a in ("rloo", "frozen")]
    assert all(set(r["extra_eval"]) == {"valid_unseen"} for r in runs)
    splits = aggregate(runs, comparison_config(preset), ["alfworld"])["per_env"]["alfworld"]["splits"]
    assert set(splits) == {"valid_seen", "valid_unseen"} and splits["valid_seen"]["primary"] and not splits["valid_unseen"]["primary"]
    for split in splits.values():
        frozen = split["algorithms"]["frozen"]
        assert frozen["vs_warm_start"]["diff"] == 0.0 and frozen["final"] == split["warm_start"]["mean"]
        assert set(split["algorithms"]) == {"rloo", "frozen"}
