"""What ALFWorld's engine answered, kept per process by (game, commands since the reset).

The engine is deterministic: a game and the admissible commands run since its reset fix the
state, so they fix what the env shows (the feedback, the admissible commands, the won flag).
Every evaluation point of a run plays the same games with a policy that changed a little, and
most episodes walk the paths an earlier point walked (docs/alfworld.md, "Transitions kept":
81% of a run's valid_seen evaluation steps, 66% of its training steps). :class:`ALFWorldEnv`
answers a step from here when it can and runs the engine only where the path is new, or where
something needs the engine's own state (a snapshot, the expert): it then replays the episode's
commands into the engine first (:meth:`~bpo_envs.alfworld.env.ALFWorldEnv._sync_engine`), so
a path never costs more engine steps than playing it did. An answer is a function of the game's
identity (the games' source and version and the task id) and the path; reward settings, step
limits and the expert are applied by the env on top of it.

The memo holds at most :data:`TRANSITION_MEMO_BYTES` (``$BPO_ALFWORLD_TRANSITION_MEMO_MB``, 64
by default; 0 turns it off), counted from the texts' lengths, and drops the least recently used
answer first.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

TRANSITION_MEMO_BYTES = int(float(os.environ.get("BPO_ALFWORLD_TRANSITION_MEMO_MB", 64)) * 2**20)

_ENTRY_BYTES = 400
"""An answer's bytes beyond its texts: the key's tuple, the answer object, the dict's slot."""


@dataclass(frozen=True)
class Answer:
    """What the env shows after a reset (``text``: the intro) or an admissible command (``text``:
    the feedback)."""

    text: str
    admissible: tuple[str, ...]
    won: bool


CommandPath = tuple[str, ...]
"""The admissible commands run since the reset, canonical (invalid ones change nothing and are left out)."""


def _entry_bytes(path: CommandPath, answer: Answer) -> int:
    """Bytes an entry counts against the memo's bound: its texts, a pointer per command and
    admissible command, and a fixed overhead."""
    return _ENTRY_BYTES + 8 * len(path) + len(answer.text) + sum(len(a) + 8 for a in answer.admissible)


class TransitionMemo:
    """A bounded map ``(game key, path) -> Answer``, least recently used out first, thread-safe."""

    def __init__(self, max_bytes: int = TRANSITION_MEMO_BYTES) -> None:
        self.max_bytes = max_bytes
        self._answers: OrderedDict[tuple[str, CommandPath], Answer] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._answers)

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, game: str, path: CommandPath) -> Answer | None:
        key = (game, path)
        with self._lock:
            answer = self._answers.get(key)
            if answer is None:
                self.misses += 1
                return None
            self._answers.move_to_end(key)
            self.hits += 1
            return answer

    def put(self, game: str, path: CommandPath, answer: Answer) -> None:
        if not self.enabled:
            return
        key = (sys.intern(game), path)
        size = _entry_bytes(path, answer)
        with self._lock:
            if key in self._answers:
                return
            self._answers[key] = answer
            self._bytes += size
            while self._bytes > self.max_bytes and self._answers:
                (_, old_path), old = self._answers.popitem(last=False)
                self._bytes -= _entry_bytes(old_path, old)

    def clear(self) -> None:
        with self._lock:
            self._answers.clear()
            self._bytes = 0
            self.hits = self.misses = 0


MEMO = TransitionMemo()
"""The process's memo, shared by every :class:`~bpo_envs.alfworld.env.ALFWorldEnv`."""

__all__ = ["MEMO", "TRANSITION_MEMO_BYTES", "Answer", "CommandPath", "TransitionMemo"]
