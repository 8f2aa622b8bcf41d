"""Command output: bounded collection of a byte stream and the observation text made from it."""

from __future__ import annotations

import codecs
from dataclasses import dataclass

OUTPUT_LIMIT_CHARS = 10_000
"""Observations keep the head and the tail of longer output (half each)."""

_KEEP_BYTES = 1 << 16


class OutputCollector:
    """Keeps the head and tail of a stream and counts its characters, in bounded memory.

    ``feed`` returns False once ``kill_after_bytes`` have arrived: the caller then kills the
    command (``yes`` would otherwise fill memory and disk until the step timeout).
    """

    def __init__(self, kill_after_bytes: int) -> None:
        self.kill_after_bytes = kill_after_bytes
        self.total_bytes = 0
        self.total_chars = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._head: list[str] = []
        self._head_chars = 0
        self._tail = ""

    def feed(self, chunk: bytes) -> bool:
        self.total_bytes += len(chunk)
        self._text(self._decoder.decode(chunk))
        return self.total_bytes < self.kill_after_bytes

    def _text(self, text: str) -> None:
        if not text:
            return
        self.total_chars += len(text)
        if self._head_chars < _KEEP_BYTES:
            take = text[: _KEEP_BYTES - self._head_chars]
            self._head.append(take)
            self._head_chars += len(take)
            text = text[len(take):]
        if text:
            self._tail = (self._tail + text)[-_KEEP_BYTES:]

    def result(self) -> tuple[str, int]:
        """``(text, characters elided)`` with the middle elided when over the limit."""
        self._text(self._decoder.decode(b"", final=True))
        head = "".join(self._head)
        if self.total_chars <= OUTPUT_LIMIT_CHARS:
            return (head + self._tail)[: self.total_chars], 0
        half = OUTPUT_LIMIT_CHARS // 2
        whole = head + self._tail if self.total_chars <= len(head) + len(self._tail) else None
        tail = (whole if whole is not None else self._tail)[-half:]
        elided = self.total_chars - 2 * half
        return f"{head[:half]}\n[... {elided} characters elided ...]\n{tail}", elided


@dataclass(frozen=True)
class CommandResult:
    """One command's outcome as the agent sees it."""

    output: str
    exit_code: int
    timed_out: bool = False
    output_killed: bool = False
    elided_chars: int = 0

    def observation(self, timeout: float) -> str:
        notes = []
        if self.timed_out:
            notes.append(f"[the command timed out after {timeout:g} s and was killed]")
        if self.output_killed:
            notes.append("[the command was killed: it printed too much output]")
        notes.append(f"[exit code: {self.exit_code}]")
        body = self.output if self.output.endswith("\n") or not self.output else self.output + "\n"
        return body + "\n".join(notes)
