"""The node agent's cluster DNS: watches feeding the zone index, and the listeners' life.

``ClusterDns`` watches Services, EndpointSlices and (for verified pod records) Pods
cluster-wide, through the client's reflectors (a listing, then every change, relisting
on expiry), and applies each event to the ``ZoneIndex`` at once, one object at a time,
so a change in the API is answered as soon as its watch event arrives. A listing
replaces the kind's objects in chunks, yielding to the event loop between them, so
queries keep being answered while 10,000 services load.

It serves on this node's pod-subnet gateway address, port 53, bound to the bridge that
address lives on, and answers only sources in the node's pod subnet
(``podnet.dns.server``), each within its per-client limits (``DnsSettings.limits``):
each node answers its own pods, as OpenShift 3.x's per-node DNS did. The listeners run
on a thread and event loop of their own (``podnet.dns.thread``), so a flood of queries
cannot delay the agent's loop; the watches stay on the agent's loop and change the
index under the handler's lock, one object at a time.

Binding fails while the bridge or address is missing (a node being set up, or a fake
data plane): the failure is logged and binding retried. When the bridge is made again
(a repaired node), its index changes and the listeners are bound again.

Until every watch has delivered its first listing, names in the zone answer SERVFAIL
(names outside it are forwarded already). The agent may hold the first listings back
until the service proxy's first apply (``after``, bounded by ``AFTER_TIMEOUT``): both
read the same 10,000 objects at start, and indexing them on the event loop while the
proxy compiles in its thread slowed the proxy's restart by the GIL they share.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from podnet.client import DELETED, LISTED, WatchEvent
from podnet.dataplane.interface import NodeNetwork
from podnet.dns.forwarder import Forwarder
from podnet.dns.handler import QueryHandler
from podnet.dns.names import ZONE
from podnet.dns.podrecords import VERIFIED
from podnet.dns.records import Key, object_key
from podnet.dns.server import DnsServer, Limits, Listen
from podnet.dns.thread import run_in_thread
from podnet.dns.upstreams import Upstreams
from podnet.dns.zone import DEFAULT_TTL, ZoneIndex
from podnet.model.kinds import ENDPOINT_SLICE, POD, SERVICE, Kind

log = logging.getLogger("podnet.dns")

Obj = dict[str, Any]
CHUNK = 500  # objects of a listing applied between two yields to the event loop
BRIDGE = "br0"  # where NodeNetwork.gateway lives
AFTER_TIMEOUT = 5.0  # the longest the first listings wait for ``after``


@dataclass(frozen=True)
class DnsSettings:
    """The agent's DNS options."""

    zone: str = ZONE
    ttl: int = DEFAULT_TTL
    port: int = 53
    device: str | None = BRIDGE
    upstream_resolv_conf: Path | None = Path("/etc/resolv.conf")
    retry: float = 5.0  # seconds between attempts to bind, and between device checks
    pod_records: str = VERIFIED  # verified (watch Pods), insecure or disabled
    limits: Limits = field(default_factory=Limits)


class WatchSource(Protocol):
    """What ``ClusterDns`` needs of the API client: ``Reflectors.watch``."""

    def watch(self, kind: Kind) -> AsyncIterator[WatchEvent]:
        """``LISTED`` with every object, then ADDED, MODIFIED and DELETED, for ever."""
        ...


@dataclass(frozen=True)
class _Kind:
    """How events of one kind reach the index: put an object, remove a key, the keys held."""

    put: Callable[[Obj], None]
    remove: Callable[[Key], None]
    held: Callable[[], list[Key]]


class ClusterDns:
    """This node's DNS server, fed by the API."""

    name = "dns"

    def __init__(
        self,
        api: WatchSource,
        node: NodeNetwork,
        settings: DnsSettings,
        after: asyncio.Event | None = None,
    ) -> None:
        """``after``: the first listings are indexed once it is set (or after
        ``AFTER_TIMEOUT``); later events at once."""
        self.api = api
        self.after = after
        self.settings = settings
        networks = (*node.cluster_networks, node.service_network)
        self.index = ZoneIndex(
            settings.zone, networks, settings.ttl, pod_records=settings.pod_records
        )
        gateway = str(node.gateway.ip)
        upstreams = Upstreams(settings.upstream_resolv_conf, exclude={gateway})
        self.forwarder = Forwarder(upstreams, per_client=settings.limits.clients.forwards)
        self.handler = QueryHandler(self.index, self.forwarder, ready=self.is_ready)
        self.index.on_change = self.handler.invalidate
        self.lock = self.handler.lock  # held for every change to the index
        listen = Listen(gateway, settings.port, settings.device, node.subnet)
        self.server = DnsServer(self.handler, listen, settings.limits)
        index = self.index
        self.kinds: dict[str, _Kind] = {
            SERVICE.plural: _Kind(
                index.put_service, index.remove_service, lambda: [*index.services]
            ),
            ENDPOINT_SLICE.plural: _Kind(
                index.put_slice, index.remove_slice, lambda: [*index.slices]
            ),
        }
        self.watched: tuple[Kind, ...] = (SERVICE, ENDPOINT_SLICE)
        if settings.pod_records == VERIFIED:  # the other modes need no Pods
            self.kinds[POD.plural] = _Kind(index.put_pod, index.remove_pod, lambda: [*index.pods])
            self.watched += (POD,)
        self.listed: set[str] = set()
        self.changes = 0  # watch events applied
        self.bound = asyncio.Event()  # set while the listeners are up

    def is_ready(self) -> bool:
        """Whether every watch has delivered its listing."""
        return len(self.listed) == len(self.kinds)

    def tasks(self) -> list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]:
        """(name, coroutine function) to run supervised: the listeners, one watch per kind."""
        found: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
            ("dns-serve", self.serve)
        ]
        for kind in self.watched:
            found.append((f"dns-watch-{kind.plural}", functools.partial(self.watch, kind)))
        return found

    # ---- the watches ---------------------------------------------------------------------

    async def watch(self, kind: Kind) -> None:
        """Apply one kind's events to the index, for ever."""
        async for event in self.api.watch(kind):
            await self.take(kind, event)

    async def take(self, kind: Kind, event: WatchEvent) -> None:
        """Apply one watch event of ``kind``."""
        target = self.kinds[kind.plural]
        if event.type == LISTED:
            if kind.plural not in self.listed:
                await self._wait_after()
            await self._replace(target, event.items)
            if kind.plural not in self.listed:
                self.listed.add(kind.plural)
                log.info("DNS: %s listed (%d)", kind.plural, len(event.items))
                if self.is_ready():
                    # The index is built: keep full collections from walking it (one
                    # over 5,000 services' records would stall answers for tens of ms).
                    gc.freeze()
        elif event.type == DELETED:
            with self.lock:
                target.remove(object_key(event.object))
        else:
            with self.lock:
                target.put(event.object)
        self.changes += 1

    async def _wait_after(self) -> None:
        if self.after is not None and not self.after.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.after.wait(), AFTER_TIMEOUT)
            self.after = None  # waited once: a late listing (a relist) does not wait again

    async def _replace(self, target: _Kind, items: tuple[Obj, ...]) -> None:
        current = {object_key(obj) for obj in items}
        lock = self.lock
        for key in target.held():
            if key not in current:
                with lock:
                    target.remove(key)
        for start in range(0, len(items), CHUNK):
            for obj in items[start : start + CHUNK]:
                with lock:  # per object: the DNS thread answers between two
                    target.put(obj)
            await asyncio.sleep(0)

    # ---- the listeners -------------------------------------------------------------------

    async def serve(self) -> None:
        """Keep the listeners bound, on the DNS thread (see ``_serve``)."""
        home = asyncio.get_running_loop()
        await run_in_thread(functools.partial(self._serve, home), "podnet-dns")

    async def _serve(self, home: asyncio.AbstractEventLoop) -> None:
        """Retry while binding fails, bind again when the bridge is made again; ``bound``
        (an event of the agent's loop, ``home``) says whether the listeners are up."""
        settings, failure = self.settings, ""

        def bound(up: bool) -> None:
            home.call_soon_threadsafe(self.bound.set if up else self.bound.clear)

        try:
            while True:
                device_index = _device_index(settings.device)
                try:
                    await self.server.start()
                except OSError as exc:
                    if str(exc) != failure:
                        log.warning("DNS cannot listen yet (%s); retrying", exc)
                    failure = str(exc)
                    await asyncio.sleep(settings.retry)
                    continue
                failure = ""
                bound(True)
                while _device_index(settings.device) == device_index:
                    await asyncio.sleep(settings.retry)
                log.warning("DNS: %s was made again; listening again", settings.device)
                bound(False)
                await self.server.stop()
        finally:
            with contextlib.suppress(RuntimeError):  # the agent's loop is closed
                bound(False)
            await self.server.stop()


def _device_index(device: str | None) -> int | None:
    if device is None:
        return None
    try:
        return socket.if_nametoindex(device)
    except OSError:
        return None
