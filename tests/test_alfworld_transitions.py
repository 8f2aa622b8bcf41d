"""The transition memo (bpo_envs.alfworld.transitions): an ALFWorld env that answers steps from
what the engine answered before shows exactly what one that runs the engine at every step
shows, through invalid commands, snapshots (native, after a reset, portable), both experts and
game switches, while running fewer engine steps; a memo keyed without the last command is
caught; the memo stays within its bound."""

from __future__ import annotations

import random
from typing import Any

import pytest
from alfworld_support import private_cache

import bpo_envs
from bpo_envs.alfworld import ALFWorldEnv
from bpo_envs.alfworld import env as alfworld_env
from bpo_envs.alfworld.engine import AlfredEngine
from bpo_envs.alfworld.transitions import Answer, TransitionMemo, _entry_bytes

TASKS = ["pick_and_place_simple/0001", "pick_clean_then_place_in_recep/0001", "look_at_obj_in_light/0001"]


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    with private_cache(tmp_path_factory, "alfworld-transitions-cache"):
        yield


def _walk(env: ALFWorldEnv, seed: int, episodes: int = 4, asks: bool = True) -> list[Any]:
    """A seeded walk that records everything the env shows: episodes over a few games (the same
    game again, another game), admissible and invalid commands, and (``asks``) the expert asked
    at random points and native snapshots restored within the episode, after a reset (re-rooted)
    and as portable bytes. Without ``asks`` nothing reads the engine's own state: an evaluation."""
    rng = random.Random(seed)
    out: list[Any] = []
    for _ in range(episodes):
        task = rng.choice(TASKS)
        obs, info = env.reset(options={"task_id": task})
        out.append(("reset", obs, info))
        saved: list[Any] = []
        for _ in range(rng.randint(4, 14)):
            draw = rng.random()
            if draw < 0.1:
                action = "take the moon"
            elif asks and draw < 0.4 and (plan := env.expert_actions()):
                out.append(("expert", plan))
                action = plan[0]
            else:
                action = rng.choice(info["admissible_actions"])
            obs, reward, terminated, truncated, info = env.step(action)
            out.append(("step", action, obs, reward, terminated, truncated, info))
            if terminated or truncated:
                break
            if asks and rng.random() < 0.25:
                saved.append(bpo_envs.snapshot(env))
            if saved and rng.random() < 0.2:
                snap = rng.choice(saved)
                how = rng.random()
                if how < 0.3:
                    env.reset(options={"task_id": rng.choice(TASKS)})  # the restore then re-roots
                    bpo_envs.restore(env, snap)
                elif how < 0.5:
                    bpo_envs.restore(env, snap.portable())
                else:
                    bpo_envs.restore(env, snap)
                env.expert_actions()  # the engine's own state, read right after the restore
                obs, reward, terminated, truncated, info = env.step("look")
                out.append(("restored", obs, reward, info))
                if terminated:
                    break
        for snap in saved:
            snap.release()
    return out


def _counted_engine_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count = [0]
    step = AlfredEngine.step

    def counted(self: AlfredEngine, command: str) -> str:
        count[0] += 1
        return step(self, command)

    monkeypatch.setattr(AlfredEngine, "step", counted)
    return count


# (seed, asks): seed 0 again finds its walk in the memo, but its expert and snapshots make the
# engine catch up; seed 4's second walk, an evaluation's, runs no engine step
WALKS = ((0, True), (1, True), (0, True), (4, False), (4, False))


@pytest.mark.parametrize("expert", ["handcoded", pytest.param("planner", marks=pytest.mark.slow)])
def test_answers_from_the_memo_equal_the_engines_at_every_step(monkeypatch: pytest.MonkeyPatch, expert: str) -> None:
    count = _counted_engine_steps(monkeypatch)
    monkeypatch.setattr(alfworld_env, "MEMO", TransitionMemo(max_bytes=0))
    plain = ALFWorldEnv(games_per_type=2, expert=expert)
    expected = [_walk(plain, seed, asks=asks) for seed, asks in WALKS]
    plain.close()
    plain_steps = count[0]

    memo = TransitionMemo()
    monkeypatch.setattr(alfworld_env, "MEMO", memo)
    count[0] = 0
    env = ALFWorldEnv(games_per_type=2, expert=expert)
    got = [_walk(env, seed, asks=asks) for seed, asks in WALKS]
    env.close()
    assert got == expected
    evaluation_steps = sum(1 for event in expected[-1] if event[0] == "step" and "invalid_action" not in event[-1])
    # never more engine steps than playing; the repeated evaluation walk's steps all from the memo
    assert memo.hits > 0 and count[0] <= plain_steps - evaluation_steps, (memo.hits, count[0], plain_steps)


class _ForgetsTheLastCommand(TransitionMemo):
    """The broken case: answers keyed by the path without its last command."""

    def get(self, game: str, path: tuple[str, ...]) -> Answer | None:
        return super().get(game, path[:-1])

    def put(self, game: str, path: tuple[str, ...], answer: Answer) -> None:
        super().put(game, path[:-1], answer)


def test_a_memo_keyed_without_the_last_command_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alfworld_env, "MEMO", TransitionMemo(max_bytes=0))
    plain = ALFWorldEnv(games_per_type=2)
    expected = [_walk(plain, seed, asks=False) for seed in (3, 3)]
    plain.close()
    monkeypatch.setattr(alfworld_env, "MEMO", _ForgetsTheLastCommand())
    env = ALFWorldEnv(games_per_type=2)
    assert [_walk(env, seed, asks=False) for seed in (3, 3)] != expected
    env.close()


def test_the_memo_is_bounded_and_drops_the_least_recently_used() -> None:
    answer = Answer("You arrive at the fridge 1.", tuple(f"go to cabinet {i}" for i in range(30)), False)
    size = _entry_bytes(("look", "c0"), answer)
    memo = TransitionMemo(max_bytes=10 * size)
    for i in range(10):
        memo.put("game", ("look", f"c{i}"), answer)
    assert memo.get("game", ("look", "c0")) is answer  # c0 used last: c1 is the oldest now
    memo.put("game", ("look", "c10"), answer)
    assert memo.bytes <= memo.max_bytes and len(memo) == 10
    assert memo.get("game", ("look", "c1")) is None and memo.get("game", ("look", "c0")) is answer
    off = TransitionMemo(max_bytes=0)
    off.put("game", (), answer)
    assert not off.enabled and len(off) == 0
