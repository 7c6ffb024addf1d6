"""VNID allocation for multitenant networking (pure, no I/O).

VNID 0 is global (project ``default`` and projects made global); 1 to 9 are reserved;
projects get VNIDs from 10 to 2^24-1. Several namespaces may share one VNID (``join``), so
each VNID counts its users and is free again only when the last one lets go. Allocation is
next-fit, like subnets: a released VNID comes back only after the cursor wraps.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain

from podnet.model.schemas_network import GLOBAL_VNID, MAX_VNID, MIN_VNID

__all__ = ["GLOBAL_VNID", "MAX_VNID", "MIN_VNID", "VnidAllocator", "VnidsExhausted"]


class VnidsExhausted(Exception):
    """Every VNID in the range has at least one user."""

    def __init__(self) -> None:
        super().__init__("no VNIDs available")


class VnidAllocator:
    """Reference-counted VNIDs with next-fit allocation in ``[min_vnid, max_vnid]``."""

    def __init__(self, min_vnid: int = MIN_VNID, max_vnid: int = MAX_VNID) -> None:
        if not 0 < min_vnid <= max_vnid <= MAX_VNID:
            raise ValueError(f"bad VNID range {min_vnid}..{max_vnid}")
        self._min = min_vnid
        self._max = max_vnid
        self._users: dict[int, int] = {}
        self._used_in_range = 0
        self._next = min_vnid

    @property
    def available(self) -> int:
        """How many VNIDs of the range have no user."""
        return self._max - self._min + 1 - self._used_in_range

    def users(self, netid: int) -> int:
        """How many namespaces use ``netid``."""
        return self._users.get(netid, 0)

    def in_range(self, netid: int) -> bool:
        """Whether ``netid`` is one this allocator hands out."""
        return self._min <= netid <= self._max

    def mark(self, netid: int) -> None:
        """Count one more user of ``netid`` (global and reserved VNIDs are counted too)."""
        count = self._users.get(netid, 0)
        self._users[netid] = count + 1
        if count == 0 and self.in_range(netid):
            self._used_in_range += 1

    def allocate(self) -> int:
        """A VNID nobody uses, now with one user; raises ``VnidsExhausted``."""
        if not self.available:
            raise VnidsExhausted()
        for netid in self._from_cursor():
            if netid not in self._users:
                self.mark(netid)
                self._next = netid + 1 if netid < self._max else self._min
                return netid
        raise VnidsExhausted()  # unreachable while the counts are consistent

    def release(self, netid: int) -> bool:
        """Drop one user of ``netid``; True when that was the last one (the VNID is free)."""
        count = self._users.get(netid, 0)
        if count == 0:
            return False
        if count > 1:
            self._users[netid] = count - 1
            return False
        del self._users[netid]
        if self.in_range(netid):
            self._used_in_range -= 1
        return True

    def _from_cursor(self) -> Iterator[int]:
        return chain(range(self._next, self._max + 1), range(self._min, self._next))
