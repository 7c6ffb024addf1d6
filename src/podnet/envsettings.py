"""Durations tuned by environment variables (tests shorten them), read one way everywhere."""

from __future__ import annotations

import os

MAX_SECONDS = 86400  # a day: anything longer is a typo, not a setting


def seconds_from_env(name: str, default: float) -> float:
    """``$name`` as a number of seconds if it is positive and under a day, else ``default``."""
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if 0 < value < MAX_SECONDS else default
