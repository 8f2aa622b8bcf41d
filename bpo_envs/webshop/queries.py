"""What the start page's ``info["admissible_actions"]`` offers: the ``search_actions=`` modes.

* ``"instruction"`` (the env's default): :func:`instruction_queries`, phrases cut from the
  instruction text the agent reads on the page, so no candidate holds a word the agent cannot
  see. A choice policy (``TextScorerPolicy``, ``TabularPolicy``) picks among them.
* ``"free"``: the single placeholder ``search[<your query>]``, as verl-agent lists it; the agent
  types its own query (any ``search[...]`` is valid in every mode). For text-generating policies.
* ``"upstream-il"``: upstream WebShop's imitation-learning candidates: the goal's ``query``, each
  goal attribute + ``query``, and the instruction. ``query`` and ``attributes`` are hidden goal
  fields (no agent sees them in upstream's text env), so a policy choosing among these can pick
  the goal's own query: use it only to reproduce that baseline.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

SEARCH_ACTIONS: tuple[str, ...] = ("free", "instruction", "upstream-il")
DEFAULT_SEARCH_ACTIONS = "instruction"
FREE_SEARCH = "search[<your query>]"

_PRICE = re.compile(r",? and price lower than .*$")
_OPTIONS = re.compile(r" with [a-z][a-z0-9 &'\-]*:.*$")
_REQUEST = re.compile(
    r"^(?:(?:hi|hello|hey)[,!]?\s+)?(?:please\s+)?"
    r"(?:i(?:'m| am)? (?:need|want|would like|wish to buy|'d like|am looking for|looking for|am searching for)"
    r"|i'm looking for|i'm searching for|find me|get me|buy me|show me|look for|search for|looking for|can you find)"
    r"\s+(?:to (?:buy|get|find)\s+)?(?:an?|some|the|one|two|three|\d+)?\s*"
)
_HEAD = re.compile(r"\s+(?:that|which|with|for|in)\s+")


def instruction_queries(instruction: str) -> list[str]:
    """Search candidates made only from ``instruction`` (each a prefix/infix of its words).

    In order: the instruction without its price clause, then without its option clause
    (``with color: ...``), then without the request words (``i need a``), then its head
    phrase (up to the first ``that`` / ``which`` / ``with`` / ``for`` / ``in``), and the
    whole instruction last (as upstream's IL list ends with it). Empty and repeated ones are
    dropped.
    """
    # brackets would change how the action parses (the argument ends at the last "]")
    text = " ".join(instruction.lower().replace("[", " ").replace("]", " ").split()).strip(" .")
    no_price = _PRICE.sub("", text).strip(" ,.")
    no_options = _OPTIONS.sub("", no_price).strip(" ,.")
    core = _REQUEST.sub("", no_options).strip(" ,.")
    head = _HEAD.split(core, maxsplit=1)[0].strip(" ,.")
    return list(dict.fromkeys(q for q in (no_price, no_options, core, head, text) if q))


def upstream_il_queries(goal: Mapping[str, Any]) -> list[str]:
    """Upstream's IL candidates (hidden goal fields: see the module docstring)."""
    query = goal["query"]
    texts = [query, *(f"{a} {query}" for a in goal["attributes"]), goal["instruction_text"].lower()]
    return list(dict.fromkeys(texts))


def search_candidates(mode: str, goal: Mapping[str, Any]) -> list[str]:
    """The start page's admissible ``search[...]`` actions under ``search_actions=mode``."""
    if mode == "free":
        return [FREE_SEARCH]
    if mode == "instruction":
        return [f"search[{q}]" for q in instruction_queries(goal["instruction_text"])]
    if mode == "upstream-il":
        return [f"search[{q}]" for q in upstream_il_queries(goal)]
    raise ValueError(f"search_actions must be one of {SEARCH_ACTIONS}, got {mode!r}")
