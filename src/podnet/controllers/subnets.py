"""Next-fit allocation of host subnets across the cluster networks (pure, no I/O).

Every cluster network entry is a row of equal slots (a /14 cut into /23s is 512 slots).
A cursor walks the rows in order and wraps around; ``allocate`` returns the first free
slot at or after the cursor and moves the cursor past it, so a released subnet is handed
out again only after the cursor has wrapped (as OpenShift SDN does). Slots are never
materialised: a slot is an integer address, computed on the fly, so a /8 cut into /24s
costs nothing until it is used.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network

from podnet.controllers.config import ClusterNetworkEntry, entry_change_errors


class SubnetsExhausted(Exception):
    """Every subnet of every cluster network is in use."""

    def __init__(self) -> None:
        super().__init__("no subnets available")


@dataclass(frozen=True)
class _Row:
    """The slots of one cluster network entry, as integer arithmetic."""

    base: int
    shift: int  # host bits per subnet
    count: int
    prefixlen: int

    @classmethod
    def of(cls, entry: ClusterNetworkEntry) -> _Row:
        base = int(entry.cidr.network_address)
        return cls(base, entry.host_subnet_length, entry.subnet_count, entry.subnet_prefixlen)

    def address(self, index: int) -> int:
        return self.base + (index << self.shift)

    def subnet(self, index: int) -> IPv4Network:
        return IPv4Network((self.address(index), self.prefixlen))

    def last(self) -> int:
        return self.base + (self.count << self.shift) - 1

    def indices(self, subnet: IPv4Network) -> range:
        """Indices of the slots that overlap ``subnet`` (empty when it is outside the row)."""
        low = max(int(subnet.network_address), self.base)
        high = min(int(subnet.broadcast_address), self.last())
        if low > high:
            return range(0)
        return range((low - self.base) >> self.shift, ((high - self.base) >> self.shift) + 1)


class SubnetAllocator:
    """Hands out host subnets next-fit; never one that is marked or overlaps a marked one."""

    def __init__(self, entries: Sequence[ClusterNetworkEntry]) -> None:
        problems = entry_change_errors([], entries)
        if not entries or problems:
            raise ValueError(f"bad cluster networks: {'; '.join(problems) or 'none given'}")
        self._entries = list(entries)
        self._rows = [_Row.of(e) for e in entries]
        self._total = sum(r.count for r in self._rows)
        # Every marked subnet (inside the networks or not) -> the slot addresses it covers.
        self._marked: dict[IPv4Network, tuple[int, ...]] = {}
        self._taken: dict[int, int] = {}  # slot address -> how many marked subnets cover it
        self._cursor = (0, 0)  # (row, index) of the next slot to try

    @property
    def entries(self) -> list[ClusterNetworkEntry]:
        """The cluster network entries, in allocation order."""
        return list(self._entries)

    @property
    def total(self) -> int:
        """How many subnets the cluster networks hold."""
        return self._total

    @property
    def available(self) -> int:
        """How many subnets are free."""
        return self._total - len(self._taken)

    def is_allocated(self, subnet: IPv4Network) -> bool:
        """Whether ``subnet`` is marked (exactly this subnet, inside the networks or not)."""
        return subnet in self._marked

    def mark_allocated(self, subnet: IPv4Network) -> None:
        """Record ``subnet`` as used (idempotent). Outside the networks it is remembered only."""
        if subnet in self._marked:
            return
        slots = tuple(self._slots_of(subnet))
        self._marked[subnet] = slots
        for slot in slots:
            self._taken[slot] = self._taken.get(slot, 0) + 1

    def release(self, subnet: IPv4Network) -> None:
        """Forget ``subnet``; its slots are free again (reused after the cursor wraps)."""
        for slot in self._marked.pop(subnet, ()):
            left = self._taken[slot] - 1
            if left:
                self._taken[slot] = left
            else:
                del self._taken[slot]

    def allocate(self) -> IPv4Network:
        """The next free subnet at or after the cursor; raises ``SubnetsExhausted``."""
        if not self.available:
            raise SubnetsExhausted()
        for row, index in self._walk():
            address = self._rows[row].address(index)
            if address not in self._taken:
                subnet = self._rows[row].subnet(index)
                self.mark_allocated(subnet)
                self._cursor = self._after(row, index)
                return subnet
        raise SubnetsExhausted()  # unreachable while the counts are consistent

    def grow(self, entries: Sequence[ClusterNetworkEntry]) -> None:
        """Switch to ``entries``, a superset of the current networks; the cursor stays put."""
        problems = entry_change_errors(self._entries, entries)
        if problems:
            raise ValueError(f"cluster network change refused: {'; '.join(problems)}")
        cursor = self._cursor_address()
        self._entries = list(entries)
        self._rows = [_Row.of(e) for e in entries]
        self._total = sum(r.count for r in self._rows)
        marked = list(self._marked)
        self._marked.clear()
        self._taken.clear()
        for subnet in marked:
            self.mark_allocated(subnet)
        self._cursor = self._locate(cursor)

    def _slots_of(self, subnet: IPv4Network) -> Iterator[int]:
        for row in self._rows:
            for index in row.indices(subnet):
                yield row.address(index)

    def _walk(self) -> Iterator[tuple[int, int]]:
        """Every slot once, starting at the cursor and wrapping around."""
        first_row, first_index = self._cursor
        rows = len(self._rows)
        for step in range(rows + 1):
            row = (first_row + step) % rows
            start = first_index if step == 0 else 0
            stop = self._rows[row].count if step < rows else first_index
            for index in range(start, stop):
                yield row, index

    def _after(self, row: int, index: int) -> tuple[int, int]:
        if index + 1 < self._rows[row].count:
            return row, index + 1
        return (row + 1) % len(self._rows), 0

    def _cursor_address(self) -> int:
        row, index = self._cursor
        return self._rows[row].address(index)

    def _locate(self, address: int) -> tuple[int, int]:
        for number, row in enumerate(self._rows):
            if row.base <= address <= row.last():
                return number, (address - row.base) >> row.shift
        return (0, 0)
