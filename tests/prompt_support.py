"""A WebShop-like path of decision points for the prompt tests (no env needed)."""

from __future__ import annotations

import numpy as np

from bpo_envs.prompting import Context

WORDS = ("shirt", "red", "price", "size", "page", "item", "cotton", "$19.99")


def webshop_like_path(steps: int, seed: int, words: int | None = 60) -> list[Context]:
    """The contexts of a path of ``steps`` clicks after a search task: each observation a page
    of ``words`` random words (None: 1 to 29 of them, drawn), so pages are long beside actions."""
    rng = np.random.default_rng(seed)
    task = "Instruction: find a red cotton shirt under 30 dollars, size medium"
    context = Context(0, task, ("search[red shirt]", "click[back]"), initial_observation=task)
    out = [context]
    for step in range(steps):
        page = rng.choice(WORDS, size=words if words is not None else rng.integers(1, 30))
        context = context.child(f"click[item {step}]", f"page {step}: " + " ".join(page), ("click[a]", "click[b]", "click[c]"))
        out.append(context)
    return out
