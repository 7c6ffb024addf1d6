"""Value equality of compiled policy parts that compares each pair of shared sets once.

The incremental compiler replaces a recompiled part equal to the one before by that one,
since a backend caches its rendering of a set by object identity.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class Sameness:
    """Value equality of compiled parts, each distinct pair of set objects compared once.

    Compiled policies share their sets (every policy allowing the whole cluster holds the
    one set of every pod), so after a rebuild 1,000 such policies cost one comparison of
    5,000 addresses, not 1,000 of them.
    """

    def __init__(self) -> None:
        # (id, id) -> (both sets, answer): holding the sets keeps their ids from being reused
        self._sets: dict[tuple[int, int], tuple[frozenset[Any], frozenset[Any], bool]] = {}

    def same(self, a: Any, b: Any) -> bool:
        """Whether ``a`` equals ``b`` (dataclasses field by field, sets memoized)."""
        if a is b:
            return True
        if type(a) is not type(b):
            return False
        if isinstance(a, frozenset):
            return self._same_sets(a, b)
        if isinstance(a, tuple):
            return len(a) == len(b) and all(map(self.same, a, b))
        names = _field_names(type(a))
        if names is None:
            return bool(a == b)
        return all(self.same(getattr(a, name), getattr(b, name)) for name in names)

    def _same_sets(self, a: frozenset[Any], b: frozenset[Any]) -> bool:
        key = (id(a), id(b))
        found = self._sets.get(key)
        if found is None:
            found = self._sets[key] = (a, b, a == b)
        return found[2]


_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _field_names(cls: type) -> tuple[str, ...] | None:
    """The fields of a dataclass; None for any other type."""
    if cls not in _FIELDS:
        is_dataclass = dataclasses.is_dataclass(cls)
        _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls)) if is_dataclass else None
    return _FIELDS[cls]
