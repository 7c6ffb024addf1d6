"""Applies the rendered service table (``servicetable``) to the kernel, and flushes UDP
conntrack entries of endpoints that went away.

Runs on the backend's node thread (libnftables, ``nft``, the netlink and conntrack
sockets take the thread's namespace; transactions run in-process through ``libnft``).
The table last applied is kept, so a change is one transaction with only the difference,
and no transaction at all when nothing differs. A change of elements of plain sets only
(an endpoint change: the ``endpoints`` map and its digests) goes as one netlink batch
(``nftbatch``): libnftables would first fetch all 5,000 chains. At start, or after a
failed transaction, the table is read back from the kernel first, so a restarted agent
that finds the table right changes nothing, and established connections through it are
not disturbed. The same table given again (the reconcile loop's periodic resync) is
compared with the kernel's too, so drift (a map element deleted by hand) is repaired.

UDP has no connection to end: a client that keeps sending to a cluster IP keeps its
conntrack entry, which still points to the endpoint chosen first. When a UDP endpoint
leaves the table, the entries DNATed to it are deleted, so the client's next datagram
picks a live endpoint (kube-proxy does the same).

After a large transaction or a read-back (a build, a restart, a resync) the heap's freed
memory is given back to the kernel (glibc's ``malloc_trim``): building 5,000 service
chains leaves ~200 MB of freed parse buffers in the node thread's malloc arena otherwise.
"""

from __future__ import annotations

import itertools
import logging
import socket
import time
from collections.abc import Iterable

from podnet.dataplane.interface import DataPlaneError, NodeNetwork
from podnet.dataplane.linux.libnft import NftRunner
from podnet.dataplane.linux.nftbatch import ElementBatches, element_batch
from podnet.dataplane.linux.servicenft import MANAGED, SERVICES_TABLE, TABLE_KEY, ServiceNft
from podnet.dataplane.linux.servicescript import parse_listing, transaction
from podnet.dataplane.linux.servicetable import ServiceRenderer
from podnet.services.heap import trim_heap
from podnet.services.model import ServiceTable

log = logging.getLogger(__name__)
IPS_DST_NAT = 0x20  # conntrack status bit: the original destination was rewritten
TRIM_AFTER = 256 * 1024  # characters of script after which to trim the heap


class ServiceTableSync:
    """Keeps ``table ip podnet_services`` equal to the last ``ServiceTable`` given."""

    def __init__(self) -> None:
        self._renderer: ServiceRenderer | None = None
        self._known = False  # whether _have reflects the kernel
        self._have: ServiceNft | None = None
        self._udp: frozenset[tuple[str, int]] | None = None  # UDP endpoints last applied
        self._last: ServiceTable | None = None  # the table last applied
        self.transactions = 0  # nft transactions run (a no-op sync runs none)
        self.batched = 0  # of which element batches sent without libnftables
        self._nft: NftRunner | None = None  # made on the node thread, at the first sync
        self._batches: ElementBatches | None = None  # likewise

    def sync(self, node: NodeNetwork, table: ServiceTable) -> bool:
        """Make the kernel's table equal ``table``; True when something changed. A sync
        that reads the kernel or changes it logs where its time went."""
        marks = [time.perf_counter()]
        batched = self.batched
        if self._renderer is None or self._renderer.node != node:
            self._renderer = ServiceRenderer(node)
        want = self._renderer.render(table)
        read = not self._known or table is self._last  # at start, and a resync: read it
        marks.append(time.perf_counter())
        if self._nft is None:
            self._nft, self._batches = NftRunner(), element_batches()
        if read:
            self._have = read_table(self._nft)
            self._known = True
        marks.append(time.perf_counter())
        script = transaction(self._have, want)
        udp = self._renderer.udp_endpoints()
        marks.append(time.perf_counter())
        if script:
            if read and self._last is not None:  # a resync found the kernel's table changed
                log.warning("service table drifted; repairing: %s", script[:300])
            try:
                self._run(script, want)
            except DataPlaneError:
                self._known = False
                raise
            self.transactions += 1
        self._have = want if want.chains else None  # what the kernel holds now
        marks.append(time.perf_counter())
        if self._udp is not None and self._udp - udp:
            flush_udp_conntrack(self._udp - udp)
        self._udp, self._last = udp, table
        if read or len(script) > TRIM_AFTER:
            trim_heap()
        marks.append(time.perf_counter())
        if read or script:
            spans = (f"{(b - a) * 1000:.1f}" for a, b in itertools.pairwise(marks))
            log.info(
                "service table sync (ms): render %s, read-back %s, diff %s, nft %s, "
                "conntrack+trim %s; %d lines of change%s",
                *spans,
                script.count("\n"),
                " (element batch)" if self.batched > batched else "",
            )
        return bool(script)

    def _run(self, script: str, want: ServiceNft) -> None:
        """One transaction: element changes of plain sets as a netlink batch (no
        libnftables cache of 5,000 chains to fetch), the rest through libnftables."""
        assert self._nft is not None
        plain = {name: s.type for name, s in want.sets.items() if not s.flags}
        batch = element_batch(script, TABLE_KEY, plain) if self._batches else None
        if self._batches is not None and batch is not None:
            self._batches.run(SERVICES_TABLE, batch)
            self.batched += 1
        else:
            self._nft.run(script)

    @property
    def in_process(self) -> bool:
        """Whether transactions run in libnftables (after the first one)."""
        return self._nft is not None and self._nft.in_process

    def forget(self) -> None:
        """Read the kernel again before the next change."""
        self._known = False

    def close(self) -> None:
        """Free the libnftables context (on the thread that used it)."""
        if self._nft is not None:
            self._nft.close()
            self._nft = None
        if self._batches is not None:
            self._batches.close()
            self._batches = None


def element_batches() -> ElementBatches | None:
    """The netlink socket for element batches (None: none here, libnftables does all)."""
    try:
        return ElementBatches()
    except OSError as err:
        log.info("no netfilter netlink socket (%s): element changes go through nft", err)
        return None


def read_table(nft: NftRunner) -> ServiceNft | None:
    """The service table in the kernel (None when absent), read without its rules: chain
    names, hooks and comments (the shared chains' digests; a service port's chain is
    named by its content), the definitions of the sets and maps, and the elements of
    those podnet fills one by one (``MANAGED``): not the ``endpoints`` map's, whose
    groups' digests are a set, nor those the packet path adds. Listing every rule of
    5,000 service chains would take ~10 s, the 50,000 endpoints ~1.5 s (``nft list
    sets`` fetches them too); this takes a fraction of one."""
    family = TABLE_KEY.split()[0]
    sets_text = nft.listing(f"list sets table {TABLE_KEY}\n", terse=True)
    if sets_text is None:
        return None
    terse = sets_text + (nft.listing(f"list maps {family}\n", terse=True) or "")
    elements = "".join(  # of the sets and maps that podnet fills, after their definitions
        nft.listing(f"list {found.kind} {TABLE_KEY} {found.name}\n") or ""
        for found in (parse_listing(own_blocks(terse)) or ServiceNft()).sets.values()
        if found.name in MANAGED
    )
    chains = nft.listing(f"list chains {family}\n", terse=True) or ""
    return parse_listing(own_blocks(terse + elements + chains))


def own_blocks(listing: str) -> str:
    """The blocks of ``table ip podnet_services`` in ``listing`` (several list commands'
    output, other tables' blocks among them), as one table's text."""
    head = f"table {TABLE_KEY} {{"
    kept, inside = [head], False
    for line in listing.splitlines():
        if not inside:
            inside = line.strip() == head
        elif line.rstrip() == "}":
            inside = False
        else:
            kept.append(line)
    return "\n".join([*kept, "}"]) + "\n"


def flush_udp_conntrack(gone: Iterable[tuple[str, int]]) -> int:
    """Delete the DNATed UDP conntrack entries whose reply comes from an endpoint in
    ``gone`` (address, port); returns how many. A failure is logged, not raised: the
    entries then expire on their own (30 s unreplied, 120 s for a stream)."""
    from pyroute2 import Conntrack  # imported here: the netlink families load lazily
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    targets = set(gone)
    deleted = 0
    try:
        with Conntrack() as ct:
            wanted = NFCTAttrTuple(proto=socket.IPPROTO_UDP)
            for entry in list(ct.dump_entries(tuple_orig=wanted)):
                reply = entry.tuple_reply
                if not (entry.status or 0) & IPS_DST_NAT:
                    continue
                if (reply.saddr, reply.sport) in targets:
                    ct.delete(entry)
                    deleted += 1
    except (OSError, ValueError) as exc:  # pyroute2 raises NetlinkError (an OSError)
        log.warning("flushing UDP conntrack entries of removed endpoints failed: %s", exc)
    if deleted:
        log.info("flushed %d UDP conntrack entries of removed endpoints", deleted)
    return deleted
