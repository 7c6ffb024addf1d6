"""Host-local IPAM store, on disk exactly as the reference host-local plugin keeps it.

Under ``<data_dir>/<network>/``, shared with ``/usr/lib/cni/host-local``: one file per
address (O_EXCL, mode 0600) holding ``<containerID>\\r\\n<ifname>`` (old plugins wrote
the ID only: such a file matches (ID, any ifname) when no file matches the exact pair, the
reference's rule); ``last_reserved_ip.<range set index>``, the round-robin cursor; and
``lock``, flock'ed around every operation by us and by the reference.

Concurrency: a ``threading.Lock`` orders a store's threads; the flock, on a fresh open of
``lock`` per operation, orders other stores, processes and the Go binary. O_EXCL is the
final arbiter: an address is never handed out twice, whatever the in-memory view says.

Speed: allocation starts after the cursor and usually succeeds at the first O_EXCL. A
store keeps a view (name <-> owner, ``podnet.ipam.dirview``) that inotify keeps exact:
each operation, ADD included, re-reads only the files changed since its last one (by
anyone), so every operation is exact without reading every file as the reference's ADD
and DEL do, even if a name was freed and reused, or rewritten in place, behind the view's
back. ADD must be exact too: a pair's reservation that the view attributes to someone
else would get the pair a second address instead of its own. Without inotify (or when
it loses track) the view is rebuilt by reading every file, as the reference does.

Deliberate deviations from the reference:

- ADD for a (container ID, ifname) holding an address in a range set returns it (the
  reference fails: "duplicate allocation is not allowed"), so a retried ADD is harmless;
  a different requested IP for that set is an ``IpamConflict``.
- Network and IPv4 broadcast addresses and every gateway of the set are never handed
  out, even when rangeStart/rangeEnd include them.
- All range sets are reserved under one flock hold; a failure removes only the files
  this call created (the reference releases every address of the container).
- Allocation is IPv4 only; ``release`` also removes the pair's IPv6 files but returns
  only IPv4 addresses.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Collection, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Interface, ip_address
from pathlib import Path

from podnet.ipam.atomic import (
    create_exclusive,
    overwrite,
    remove_stale_temps,
    replace,
    sync_dir,
)
from podnet.ipam.config import (
    IPAddress,
    IpamConfigError,
    IpamError,
    RangeSet,
    validate_network_name,
)
from podnet.ipam.dirview import CURSOR_PREFIX, LOCK_NAME, DirIndex, DirWatch
from podnet.ipam.requested import assign_requested, ipv4_sets, v4
from podnet.ipam.reservations import (
    FILE_MODE,
    IpamLockTimeout,
    checked_id,
    flock,
    ipv4s,
    owner_line,
    parse_owner,
    read_at,
    well_formed,
)

DIR_MODE = 0o755


class IpamExhausted(IpamError):
    """No free address in a range set (permanent until something is released)."""

    def __init__(self, range_set: RangeSet, range_set_index: int) -> None:
        super().__init__(f"no IP addresses available in range set: {range_set}")
        self.range_set_index = range_set_index


class IpamConflict(IpamError):
    """A requested IP is taken (or reserved), or differs from the one already held."""


@dataclass(frozen=True)
class Allocation:
    """One address handed out: with its prefix, its range's gateway, and the range set."""

    address: IPv4Interface
    gateway: IPv4Address
    range_set_index: int


@dataclass
class _Claim:
    """One ADD in progress: the owner line, what the pair held, what this call created."""

    owner: str
    held: list[IPv4Address]
    created: list[str] = field(default_factory=list)
    avoid: set[str] = field(default_factory=set)  # names not to take round-robin


class HostLocalStore:
    """Allocate and release addresses of one network in a host-local data dir.

    Thread-safe and process-safe; keep one instance per network for the fast path.
    """

    def __init__(self, data_dir: Path, network: str, *, lock_timeout: float = 30.0) -> None:
        self.path = Path(data_dir) / validate_network_name(network)
        self.lock_timeout = lock_timeout
        self._mutex = threading.Lock()
        self._index = DirIndex()
        self._watch: DirWatch | None = None  # keeps the view exact (see dirview)
        self._pending: set[str] = set()  # changed by others, seen after our own change
        self._touched: set[str] = set()  # changed by the current operation
        _STORES.add(self)

    def allocate(
        self,
        container_id: str,
        ifname: str,
        range_sets: Sequence[RangeSet],
        requested: Sequence[IPAddress] = (),
        avoid: Collection[IPv4Address] = (),
    ) -> list[Allocation]:
        """One address per range set, all or nothing.

        ``requested`` IPs go to the range set holding them (one per set); the others are
        taken round-robin after ``last_reserved_ip.<index>``, skipping ``avoid`` (addresses
        resting after their release: ``podnet.ipam.cooldown``). A pair that already holds an
        address in a set gets that address back (idempotent re-ADD). Raises
        ``IpamExhausted``, ``IpamConflict`` or ``IpamConfigError``; on any failure the
        files this call created are removed.
        """
        owner = owner_line(container_id, ifname)
        sets = ipv4_sets(range_sets)
        wanted = assign_requested(sets, requested)
        with self._locked() as dfd:
            claim = _Claim(
                owner, self._held(dfd, container_id, ifname), avoid={str(ip) for ip in avoid}
            )
            try:
                return [
                    self._allocate_one(dfd, claim, i, rset, wanted.get(i))
                    for i, rset in enumerate(sets)
                ]
            except BaseException:
                for name in claim.created:
                    self._remove(dfd, name)
                raise

    def release(self, container_id: str, ifname: str) -> list[IPv4Address]:
        """Remove every file held by the pair; return the IPv4 addresses freed.

        Releasing what is not allocated is fine and returns ``[]``. ``ifname=""`` names
        the container's legacy ID-only files (``allocations`` reports them that way).
        """
        checked_id(container_id, ifname, legacy=True)
        with self._locked() as dfd:
            names = self._match(container_id, ifname)
            for name in names:
                self._remove(dfd, name)
        return ipv4s(names)

    def find(self, container_id: str, ifname: str) -> list[IPv4Address]:
        """The IPv4 addresses the pair holds (what ``release`` would free)."""
        checked_id(container_id, ifname, legacy=True)
        with self._locked():
            return ipv4s(self._match(container_id, ifname))

    def allocations(self) -> list[tuple[IPv4Address, str, str]]:
        """Every well-formed IPv4 reservation as (ip, container ID, ifname), by address.

        Damaged files (``damaged``) are left out: they name no owner to release."""
        with self._locked():
            texts = {n: t for n, t in self._index.owner_of.items() if well_formed(t)}
        return [(ip, *parse_owner(texts[str(ip)])) for ip in ipv4s(texts)]

    def damaged(self) -> dict[IPv4Address, str]:
        """IPv4 reservation files that name no owner (empty or garbled), with their text.

        Their address stays taken (never handed out twice) until ``repair`` or
        ``discard`` decides, from what the node knows, whose it is."""
        with self._locked():
            texts = {n: t for n, t in self._index.owner_of.items() if not well_formed(t)}
        return {ip: texts[str(ip)] for ip in ipv4s(texts)}

    def repair(self, ip: IPv4Address, container_id: str, ifname: str) -> bool:
        """Rewrite the damaged file of ``ip`` for its owner (a live attachment has that
        address); False if the file is no longer damaged."""
        owner = owner_line(container_id, ifname)
        with self._locked() as dfd:
            if not self._still_damaged(dfd, str(ip)):
                return False
            replace(dfd, str(ip), owner.encode(), FILE_MODE)
            self._index.put(str(ip), owner)
            self._touched.add(str(ip))
        return True

    def discard(self, ip: IPv4Address) -> bool:
        """Remove the damaged file of ``ip`` (no live attachment has that address); False
        if it is no longer damaged."""
        with self._locked() as dfd:
            if not self._still_damaged(dfd, str(ip)):
                return False
            self._remove(dfd, str(ip))
        return True

    def _still_damaged(self, dfd: int, name: str) -> bool:
        text = read_at(dfd, name)
        return text is not None and not well_formed(text)

    @contextmanager
    def _locked(self) -> Iterator[int]:
        """Hold the thread mutex and the directory flock, bring the view up to date (as
        exact as reading every file); yield the directory's fd."""
        deadline = time.monotonic() + self.lock_timeout
        if not self._mutex.acquire(timeout=self.lock_timeout):
            raise IpamLockTimeout(f"timed out waiting for another thread using {self.path}")
        with ExitStack() as stack:
            stack.callback(self._mutex.release)
            dfd = self._open_dir()
            stack.callback(os.close, dfd)
            lock_fd = os.open(
                LOCK_NAME, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE, dir_fd=dfd
            )
            stack.callback(os.close, lock_fd)  # closing drops the flock
            flock(lock_fd, deadline, self.path / LOCK_NAME)
            self._sync(dfd)
            yield dfd
            if self._touched:
                sync_dir(dfd)  # the names this operation linked or unlinked are durable
            self._settle()

    def _sync(self, dfd: int) -> None:
        """Re-read what changed since our last operation, or rebuild the view by reading
        every file when that is unknown (the first time, no inotify, inotify lost track)."""
        changes = self._watch.changes() if self._watch is not None else None
        if changes is None:
            remove_stale_temps(dfd)  # only a killed writer leaves one: we hold the flock
            self._rewatch()  # before reading: nothing changed from here on is missed
            self._index.rebuild(dfd, read_at)
        else:
            self._index.update(dfd, read_at, changes | self._pending)
        self._pending = set()
        self._touched = set()

    def _settle(self) -> None:
        """Set this operation's own changes aside (the view has them), keep the others."""
        changes = self._watch.changes() if self._watch is not None else None
        if changes is not None:
            self._pending |= changes - self._touched

    def _rewatch(self) -> None:
        if self._watch is not None:
            self._watch.close()
        try:
            self._watch = DirWatch(self.path)
        except OSError:
            self._watch = None  # no inotify (or none left): read files instead

    def _match(self, container_id: str, ifname: str) -> list[str]:
        return self._index.match(checked_id(container_id, ifname, legacy=True), ifname)

    def _open_dir(self) -> int:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            return os.open(self.path, flags)
        except FileNotFoundError:
            os.makedirs(self.path, mode=DIR_MODE, exist_ok=True)
            return os.open(self.path, flags)

    def _held(self, dfd: int, container_id: str, ifname: str) -> list[IPv4Address]:
        """Addresses the pair holds per the view, each confirmed by reading its file."""
        names = self._match(container_id, ifname)
        confirmed = [n for n in names if read_at(dfd, n) == self._index.owner_of[n]]
        return ipv4s(confirmed)

    def _allocate_one(
        self, dfd: int, claim: _Claim, index: int, rset: RangeSet, want: IPv4Address | None
    ) -> Allocation:
        mine = next((ip for ip in claim.held if rset.contains(ip)), None)
        if mine is not None:
            if want is not None and want != mine:
                raise IpamConflict(
                    f"{parse_owner(claim.owner)[0]} already holds {mine} in range set {rset};"
                    f" cannot also take requested IP {want}"
                )
            return _allocation(rset, mine, index)
        if want is not None:
            ip = self._reserve_requested(dfd, claim.owner, rset, want)
        else:
            ip = self._reserve_next(dfd, claim, index, rset)
        claim.created.append(str(ip))
        self._write_cursor(dfd, index, ip)
        return _allocation(rset, ip, index)

    def _reserve_requested(
        self, dfd: int, owner: str, rset: RangeSet, ip: IPv4Address
    ) -> IPv4Address:
        if ip in rset.skipped():
            raise IpamConflict(
                f"requested IP {ip} is a gateway, network or broadcast address of range set {rset}"
            )
        if not self._try_create(dfd, str(ip), owner):
            raise IpamConflict(f"requested IP address {ip} is not available in range set {rset}")
        return ip

    def _reserve_next(self, dfd: int, claim: _Claim, index: int, rset: RangeSet) -> IPv4Address:
        taken = self._index.owner_of  # every name listed under the lock just now
        for ip, _ in rset.candidates(self._read_cursor(dfd, index)):
            name = str(ip)
            if name in claim.avoid:
                continue
            if name not in taken and self._try_create(dfd, name, claim.owner):
                return v4(ip)
        raise IpamExhausted(rset, index)

    def _try_create(self, dfd: int, name: str, owner: str) -> bool:
        """Create the reservation file exclusively and whole (never seen empty, even
        after a crash; see ``podnet.ipam.atomic``); False if it already exists."""
        if not create_exclusive(dfd, name, owner.encode(), FILE_MODE):
            return False
        self._index.put(name, owner)
        self._touched.add(name)
        return True

    def _remove(self, dfd: int, name: str) -> None:
        self._index.drop(name)
        self._touched.add(name)
        with suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dfd)

    def _read_cursor(self, dfd: int, index: int) -> IPAddress | None:
        text = read_at(dfd, f"{CURSOR_PREFIX}{index}")
        try:
            return ip_address(text) if text else None
        except ValueError:
            return None  # unreadable cursor: start at rangeStart, as the reference does

    def _write_cursor(self, dfd: int, index: int, ip: IPv4Address) -> None:
        overwrite(dfd, f"{CURSOR_PREFIX}{index}", str(ip).encode(), FILE_MODE)


_STORES: weakref.WeakSet[HostLocalStore] = weakref.WeakSet()


def _reset_after_fork() -> None:
    # A thread of the parent may have held a mutex at fork time; it does not exist here.
    for store in list(_STORES):
        store._mutex, store._index = threading.Lock(), DirIndex()
        store._watch, store._pending = None, set()


os.register_at_fork(after_in_child=_reset_after_fork)


def _allocation(rset: RangeSet, ip: IPv4Address, index: int) -> Allocation:
    r = rset.range_for(ip)
    if r is None:  # callers only pass addresses of the set
        raise IpamConfigError(f"{ip} is not in range set {rset}")
    return Allocation(IPv4Interface((ip, r.subnet.prefixlen)), v4(r.gateway), index)
