"""Argument checks shared by the env layer and the algorithm layer above it."""

from __future__ import annotations

from typing import Any

import numpy as np


def check_count(name: str, value: Any, low: int = 1) -> int:
    """``value`` as an int, or a ValueError naming ``name`` unless it is an int >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)
