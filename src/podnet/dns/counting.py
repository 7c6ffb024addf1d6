"""Reference counts kept in a dict, as the zone index and the pod addresses keep them."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def count(counts: dict[K, int], key: K, delta: int) -> bool:
    """Add ``delta`` (+1 or -1) to ``key``'s count, dropping it at 0; whether ``key``
    started or stopped being counted (went from 0 to 1, or to 0)."""
    value = counts.get(key, 0) + delta
    if value:
        counts[key] = value
    else:
        del counts[key]
    return value == 0 or (value == 1 and delta > 0)
