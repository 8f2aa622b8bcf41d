"""Command output: bounded collection of a byte stream and the observation text made from it.

Two observation formats (``SWEBenchEnv(prompt=...)``):

* ``"bpo"``: the output (head and tail, 5,000 characters each, when longer than 10,000), then
  ``[exit code: N]`` and notes for a timeout or an output kill.
* ``"mini-swe-agent"``: mini-swe-agent's SWE-bench observation: ``<returncode>N</returncode>``
  and an ``<output>`` block; output of 10,000 characters or more becomes a ``<warning>`` (use
  head/tail/grep or a file), ``<output_head>`` (first 5,000), ``<elided_chars>`` and
  ``<output_tail>`` (last 5,000); a timeout names the command and asks for a non-interactive
  one.
"""

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

    def _mini_parts(self) -> tuple[str, int, str] | None:
        """``(head, elided, tail)`` when mini-swe-agent would truncate, else None."""
        if self.elided_chars == 0 and len(self.output) < OUTPUT_LIMIT_CHARS:
            return None
        half = OUTPUT_LIMIT_CHARS // 2
        # a truncated ``output`` is head[:half] + marker + tail[-half:] (OutputCollector.result)
        return self.output[:half], self.elided_chars, self.output[-half:]

    def mini_observation(self, command: str) -> str:
        """The observation in mini-swe-agent's SWE-bench format (see the module docstring)."""
        parts = self._mini_parts()
        if self.timed_out:
            if parts is None:
                body = f"<output>\n{self.output}\n</output>"
            else:
                head, elided, tail = parts
                body = (f"<warning>Output was too long and has been truncated.</warning>\n"
                        f"<output_head>\n{head}\n</output_head>\n"
                        f"<elided_chars>{elided} characters elided</elided_chars>\n"
                        f"<output_tail>\n{tail}\n</output_tail>")
            return (f"The last command <command>{command}</command> timed out and has been killed.\n"
                    f"The output of the command was:\n{body}\n"
                    "Please try another command and make sure to avoid those requiring interactive "
                    "input.")
        head_line = f"<returncode>{self.exit_code}</returncode>\n"
        if parts is None:
            return f"{head_line}<output>\n{self.output}</output>"
        head, elided, tail = parts
        return (
            f"{head_line}<warning>\n{MINI_TOO_LONG}\n</warning>"
            f"<output_head>\n{head}\n</output_head>\n"
            f"<elided_chars>\n{elided} characters elided\n</elided_chars>\n"
            f"<output_tail>\n{tail}\n</output_tail>"
        )


MINI_TOO_LONG = (
    "The output of your last command was too long.\n"
    "Please try a different command that produces less output.\n"
    "If you're looking at a file you can try use head, tail or sed to view a smaller number of "
    "lines selectively.\n"
    "If you're using grep or find and it produced too much output, you can use a more selective "
    "search pattern.\n"
    "If you really need to see something from the full command's output, you can redirect output "
    "to a file and then search in that file."
)
"""mini-swe-agent's warning for output of 10,000 characters or more (its SWE-bench config)."""
