"""Set names: a digest of a set's members, each distinct set computed once."""

from __future__ import annotations

import hashlib
from typing import Any


class SetDigests:
    """Names a set by a digest of its members, computing each distinct set once.

    The canonical form refers to sets by these digests, so a fingerprint costs the
    members of the distinct sets, not of every reference to them.
    """

    def __init__(self) -> None:
        self._known: dict[frozenset[Any], str] = {}

    def __call__(self, members: frozenset[Any]) -> str:
        found = self._known.get(members)
        if found is None:
            text = "\n".join(sorted(map(str, members)))
            found = hashlib.sha256(text.encode()).hexdigest()[:32]
            self._known[members] = found
        return found
