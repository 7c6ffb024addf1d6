"""The service proxy: Services and EndpointSlices watched, compiled and applied.

``ServiceSync`` watches, cluster-wide through the client's reflectors, Services (v1),
EndpointSlices (``discovery.k8s.io/v1``) and HostSubnets (every node's address) and is a
``podnet.reconcile`` target, the same loop as isolation and policy (``agent.policies``):
nothing is applied until all listings have arrived (a partial view would reject services
whose slices it has not seen yet), a burst of changes is coalesced, the changes are
applied to a ``ServiceCompiler`` in a worker thread (only the services they touch are
compiled again) and the resulting ``ServiceTable`` goes to ``DataPlane.sync_services``,
which changes only what differs. A failed apply is retried with backoff; a periodic
resync applies the same table again (a no-op in the kernel unless something drifted). A
table the data plane refuses is bisected by service: the services at fault are left out,
named in the log and the node's ``podnet.io/reconcile`` note, and the rest is forwarded.

At start (a restart with 5,000 services), each kind's first listing goes to the compiler
as soon as it arrives, in a worker thread of its own, while the other listings are still
in flight; the first pass then waits for that work and compiles the rest. The changes
queued before a listing go with it, so the compiler sees every event in order.
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from ipaddress import IPv4Address
from typing import Any

from podnet.agent.policies import WatchSource, host_ip
from podnet.agent.watchtasks import Task, loop_tasks
from podnet.client import BOOKMARK, DELETED, LISTED, WatchEvent
from podnet.dataplane.interface import DataPlane, NodeNetwork
from podnet.model.kinds import ENDPOINT_SLICE, HOST_SUBNET, SERVICE, Kind
from podnet.reconcile import ApplyRecord, Pacing, ReconcileLoop
from podnet.services.compile import ServiceCompiler
from podnet.services.model import ServiceTable

log = logging.getLogger("podnet.agent.services")

COALESCE_SECONDS = 0.01  # wait this long after a change for the rest of a burst


def pacing(resync_period: float) -> Pacing:
    """The service loop's pacing: a short coalesce, compiles in a worker thread."""
    return Pacing(resync_period, COALESCE_SECONDS, compile_in_thread=True)


KINDS: tuple[Kind, ...] = (SERVICE, ENDPOINT_SLICE, HOST_SUBNET)
Change = tuple[str, str, Any]  # (kind plural, event type, object or listing)


class ServiceSync:
    """Keeps the data plane's service proxy equal to the compiled services."""

    name = "services"

    def __init__(
        self, api: WatchSource, dataplane: DataPlane, node: NodeNetwork, pacing: Pacing, **loop: Any
    ) -> None:
        """``loop``: the ``ReconcileLoop``'s keywords (``metrics``, ``report``)."""
        self.api, self.dataplane, self.node = api, dataplane, node
        self.compiler = ServiceCompiler(node.node_name)  # touched only by the compile thread
        self.last_table: ServiceTable | None = None
        self.applied = 0  # tables applied that differ from the one before
        self.applied_at: float | None = None  # time.monotonic() of the last of them
        self._pending: list[Change] = []
        self._early: list[Future[None]] = []  # first listings taken before the first pass
        self._early_kinds: set[str] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._frozen = False  # gc.freeze() after the first compile
        self._node_ips: dict[str, IPv4Address] = {}  # HostSubnet name -> hostIP
        self.loop = ReconcileLoop(self, pacing, inputs=[kind.plural for kind in KINDS], **loop)
        self.synced = self.loop.synced
        self.ready = self.loop.ready
        self.poke = self.loop.poke

    def tasks(self) -> list[Task]:
        """(name, coroutine function) to run supervised: the loop, one watch per kind."""
        return loop_tasks("services", self.loop.run, self.watch, KINDS)

    async def watch(self, kind: Kind) -> None:
        """Queue one kind's events for the loop; the client relists on expiry."""
        async for event in self.api.watch(kind):
            self.queue(kind, event)

    def queue(self, kind: Kind, event: WatchEvent) -> None:
        """Queue one watch event of ``kind`` (bookmarks carry nothing to apply)."""
        if event.type == BOOKMARK:
            return
        if kind.plural == HOST_SUBNET.plural:
            self._take_hostsubnet(event)
        payload = event.items if event.type == LISTED else event.object
        self._pending.append((kind.plural, event.type, payload))
        if event.type == LISTED:
            self._take_early(kind.plural)
            self.loop.listed(kind.plural)
        else:
            self.loop.changed()

    def _take_early(self, plural: str) -> None:
        """Before the first pass, a kind's first listing (and what was queued before it)
        goes to the compiler now, in one worker thread (jobs in order, one at a time)."""
        if self.loop.ready() or plural in self._early_kinds or plural == HOST_SUBNET.plural:
            return
        self._early_kinds.add(plural)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="services-listing")
        pending, self._pending = self._pending, []
        self._early.append(self._executor.submit(self._take_changes, pending))

    def _take_hostsubnet(self, event: WatchEvent) -> None:
        """Keep every node's address (pods' packets to any node's port are DNATed here)."""
        found = event.items if event.type == LISTED else (event.object,)
        if event.type == LISTED:
            self._node_ips = {}
        for hostsubnet in found:
            name = str((hostsubnet.get("metadata") or {}).get("name") or "")
            ip = host_ip(hostsubnet)
            if event.type == DELETED or ip is None:
                self._node_ips.pop(name, None)
            else:
                self._node_ips[name] = IPv4Address(ip)

    # ---- the reconcile target ------------------------------------------------------------

    def take(self) -> Callable[[], ServiceTable]:
        """Take the queued changes; the step compiles them (in the loop's worker thread)."""
        pending, self._pending = self._pending, []
        return functools.partial(self._compile, pending, list(self._node_ips.values()))

    async def apply(self, desired: ServiceTable) -> None:
        """The whole table to the data plane, in one atomic change."""
        await self.dataplane.sync_services(self.node, desired)

    def keys(self, desired: ServiceTable) -> Sequence[str]:
        """Services by ``namespace/name``, in key order."""
        return desired.services()

    def without(self, desired: ServiceTable, left_out: frozenset[str]) -> ServiceTable:
        """``desired`` without the ports of the services in ``left_out``."""
        return desired.without(left_out)

    def describe(self, desired: ServiceTable) -> str:
        """Sizes: service ports and endpoints."""
        ports, endpoints = desired.size()
        return f"{ports} service ports, {endpoints} endpoints"

    async def after_apply(self, desired: ServiceTable, record: ApplyRecord) -> None:
        """Log a table that differs from the last one applied."""
        if desired is not self.last_table:
            self.applied += 1
            self.applied_at = time.monotonic()
            log.info(
                "services applied: %s; compiled in %.1f ms, applied in %.1f ms",
                record.what,
                record.compile_seconds * 1000,
                (record.seconds - record.compile_seconds) * 1000,
            )
        self.last_table = desired

    def _compile(self, changes: list[Change], node_ips: list[IPv4Address]) -> ServiceTable:
        """Runs in a worker thread, one at a time: the compiler is not shared (the first
        listings' work, ``_take_early``, is waited for before anything else)."""
        early, self._early = self._early, []
        if self._executor is not None:
            self._executor.shutdown(wait=False)  # after the first pass, no more early work
            self._executor = None
        for job in early:
            job.result()
        self.compiler.set_node_ips(node_ips)
        self._take_changes(changes)
        table = self.compiler.table()
        if not self._frozen:
            # The first table and the compiler's records live on: keep the collector's full
            # passes from walking them (they doubled the first render's 0.2 s at restart).
            gc.freeze()
            self._frozen = True
        return table

    def _take_changes(self, changes: list[Change]) -> None:
        compiler = self.compiler
        handlers = {
            SERVICE.plural: (
                compiler.replace_services,
                compiler.remove_service,
                compiler.put_service,
            ),
            ENDPOINT_SLICE.plural: (
                compiler.replace_slices,
                compiler.remove_slice,
                compiler.put_slice,
            ),
        }
        for plural, verb, payload in changes:
            if plural in handlers:
                replace, remove, put = handlers[plural]
                if verb == LISTED:
                    replace(payload)
                else:
                    (remove if verb == DELETED else put)(payload)
