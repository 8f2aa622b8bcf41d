"""Text spaces shared by every env: a printable charset wide enough for real text.

Gymnasium's ``Text`` space checks that every character of an observation is in its charset.
Real observations (product titles, tracebacks, issue texts) carry accents, dashes, currency
signs and the odd symbol, so the charset covers printable ASCII plus the common Unicode blocks
below. Anything outside it is folded by :func:`to_observation` (NFKD decomposition, else
``"?"``), so an observation is always inside ``observation_space``.
"""

from __future__ import annotations

import functools
import unicodedata

import numpy as np
from gymnasium import spaces

_BLOCKS: tuple[tuple[int, int], ...] = (
    (0x20, 0x7E),  # printable ASCII
    (0xA0, 0x24F),  # Latin-1 supplement, Latin extended A and B
    (0x370, 0x3FF),  # Greek
    (0x400, 0x4FF),  # Cyrillic
    (0x2010, 0x205E),  # general punctuation (dashes, quotes, bullets, ellipsis)
    (0x20A0, 0x20C0),  # currency signs
    (0x2100, 0x214F),  # letterlike symbols (trademark, numero)
    (0x2190, 0x21FF),  # arrows
    (0x2200, 0x22FF),  # mathematical operators
    (0x2500, 0x259F),  # box drawing and blocks (progress bars, tables)
    (0x25A0, 0x25FF),  # geometric shapes
    (0x2600, 0x26FF),  # miscellaneous symbols
    (0x2713, 0x2718),  # check marks
)

TEXT_CHARSET: str = "\t\n\r" + "".join(
    ch for lo, hi in _BLOCKS for ch in map(chr, range(lo, hi + 1)) if ch.isprintable()
)
"""Every character an observation or action may contain."""

_CHARSET = frozenset(TEXT_CHARSET)

_ASCII_INSIDE = bytes(ch for ch in range(128) if chr(ch) in _CHARSET)


def inside_charset(text: str) -> bool:
    """Whether every character of ``text`` is in :data:`TEXT_CHARSET` (ASCII text, the usual
    case, in C: deleting the allowed bytes leaves nothing; ten times faster than a set test)."""
    if text.isascii():
        return not text.encode("ascii").translate(None, _ASCII_INSIDE)
    return _CHARSET.issuperset(text)


OBSERVATION_MAX_LENGTH = 1 << 18
ACTION_MAX_LENGTH = 1 << 14


@functools.lru_cache(maxsize=1)
def _charset_tables() -> tuple[frozenset[str], tuple[str, ...], dict[str, np.int32], str]:
    template = spaces.Text(max_length=1, min_length=0, charset=TEXT_CHARSET)
    return template._char_set, template._char_list, template._char_index, template._char_str


class SharedCharsetText(spaces.Text):
    """``Text`` over :data:`TEXT_CHARSET` whose charset tables are built once per process.

    Gymnasium's ``Text`` builds a list, a set and an index of its charset per instance (about
    380 KB for this charset); every env has two spaces, so sharing the read-only tables keeps
    an extra env instance small. Each instance keeps its own random generator.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | None = None) -> None:
        if not 0 <= min_length <= max_length:
            raise ValueError(f"need 0 <= min_length <= max_length, got {min_length}, {max_length}")
        self.min_length = int(min_length)
        self.max_length = int(max_length)
        self._char_set, self._char_list, self._char_index, self._char_str = _charset_tables()
        spaces.Space.__init__(self, dtype=str, seed=seed)

    def __reduce__(self):  # pickles (async vector envs) without the tables
        return (SharedCharsetText, (self.max_length,), {"min_length": self.min_length})

    def __setstate__(self, state: dict) -> None:
        self.__init__(self.max_length, min_length=state.get("min_length", 0))


def text_space(max_length: int) -> spaces.Text:
    """A ``Text`` space over :data:`TEXT_CHARSET` (the empty string included)."""
    return SharedCharsetText(max_length, min_length=0)


def _fold(ch: str) -> str:
    folded = "".join(c for c in unicodedata.normalize("NFKD", ch) if c in _CHARSET)
    return folded or "?"


def to_observation(text: str, max_length: int = OBSERVATION_MAX_LENGTH) -> str:
    """Return ``text`` made to fit the observation space.

    Characters outside :data:`TEXT_CHARSET` are folded to their NFKD decomposition (``"ﬁ"`` →
    ``"fi"``) or replaced by ``"?"``; text longer than ``max_length`` keeps its head and tail
    around a marker that says how many characters were cut.
    """
    if not inside_charset(text):
        text = "".join(ch if ch in _CHARSET else _fold(ch) for ch in text)
    if len(text) > max_length:
        marker = f"\n[... {len(text) - max_length + 64} characters cut ...]\n"
        keep = max_length - len(marker)
        head = keep // 2
        text = text[:head] + marker + text[len(text) - (keep - head) :]
    return text
