"""Per-identity caps on concurrent watches and lists.

Each open watch holds a connection, a handler and up to the fan-out's backlog bound of
memory; each list in flight holds its answer until the client has read it. Without a
cap, one identity (a node's token, a pod that stole one) can open hundreds of them and
take the master's memory (issue 19, finding 3). ``RequestLimits.hold`` counts the
requests of one identity in flight by verb; beyond the cap the request is refused with
429 ``TooManyRequests`` and ``Retry-After``, which every podnet client treats as
transient (it backs off and tries again), as kube-apiserver's max-in-flight limit does.

The defaults are far above what the real clients use at once (a node agent watches
about a dozen kinds, the out-of-process controllers a few dozen, kubectl and the router
a handful); 0 turns a cap off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from podnet.api.events import TooManyRequests

MAX_WATCHES_PER_USER = 100
MAX_LISTS_PER_USER = 25
RETRY_AFTER = 1  # seconds a refused client is told to wait


@dataclass
class RequestLimits:
    """Concurrent watches and lists per identity; 0 is no cap."""

    watches: int = MAX_WATCHES_PER_USER
    lists: int = MAX_LISTS_PER_USER
    _held: dict[tuple[str, str], int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.watches < 0 or self.lists < 0:
            raise ValueError("per-identity watch and list caps are counts (0: no cap)")

    def cap(self, verb: str) -> int:
        """The cap of ``verb`` (0: none; only ``watch`` and ``list`` have one)."""
        return {"watch": self.watches, "list": self.lists}.get(verb, 0)

    def in_flight(self, user: str, verb: str) -> int:
        """How many ``verb`` requests of ``user`` are being served now."""
        return self._held.get((verb, user), 0)

    @contextlib.contextmanager
    def hold(self, user: str, verb: str) -> Iterator[None]:
        """Count one ``verb`` request of ``user`` while it is served; 429 over the cap."""
        cap = self.cap(verb)
        if not cap:
            yield
            return
        key = (verb, user)
        held = self._held.get(key, 0)
        if held >= cap:
            raise TooManyRequests(
                f"too many concurrent {verb} requests from {user} (at most {cap}); "
                f"retry after {RETRY_AFTER}s",
                RETRY_AFTER,
            )
        self._held[key] = held + 1
        try:
            yield
        finally:
            left = self._held[key] - 1
            if left:
                self._held[key] = left
            else:
                del self._held[key]
