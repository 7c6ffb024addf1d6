"""Remote nodes: HostSubnets turned into ``RemoteNode``s, and the loop that syncs them.

``remote_nodes`` is pure: it keeps every other node's HostSubnet that has a usable
subnet and host IP. ``RemoteNodeSync`` owns the desired set (replaced as a whole on every
HostSubnet event) and hands it to ``DataPlane.sync_remote_nodes``: bursts of events are
coalesced into one call, a failed call is retried with backoff, and a periodic resync
sends the same set again so the backend repairs drift (a route deleted by hand).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from podnet.agent.apiclient import Backoff
from podnet.dataplane.interface import DataPlane, DataPlaneError, NodeNetwork, RemoteNode

log = logging.getLogger("podnet.agent.remotes")

Obj = Mapping[str, Any]
COALESCE_SECONDS = 0.05  # wait this long after a change for the rest of a burst
RETRY_BACKOFF = Backoff(0.5, 30.0)
SYNC_TIMEOUT = 120.0


def _remote_node(hostsubnet: Obj) -> RemoteNode | None:
    """The ``RemoteNode`` of one HostSubnet, or None if it has no usable subnet/IP."""
    name = hostsubnet.get("host") or (hostsubnet.get("metadata") or {}).get("name")
    if not name or not hostsubnet.get("subnet") or not hostsubnet.get("hostIP"):
        return None
    try:
        subnet = IPv4Network(hostsubnet["subnet"])
        return RemoteNode(str(name), IPv4Address(hostsubnet["hostIP"]), subnet)
    except ValueError:
        return None


def remote_nodes(hostsubnets: Iterable[Obj], node_name: str) -> list[RemoteNode]:
    """Every other node's ``RemoteNode``, sorted by name.

    Skipped: this node's own HostSubnet, HostSubnets without a subnet (a lease still being
    assigned) and unreadable ones.
    """
    remotes = (_remote_node(hs) for hs in hostsubnets)
    return sorted((r for r in remotes if r is not None and r.name != node_name), key=_by_name)


def _by_name(remote: RemoteNode) -> str:
    return remote.name


class RemoteNodeSync:
    """Keeps the data plane's remote nodes equal to the latest HostSubnet set."""

    def __init__(
        self,
        dataplane: DataPlane,
        node: NodeNetwork,
        resync_period: float,
        coalesce: float = COALESCE_SECONDS,
    ) -> None:
        self.dataplane = dataplane
        self.node = node
        self.resync_period = resync_period
        self.coalesce = coalesce
        self.synced = asyncio.Event()  # set after each successful sync
        self._hostsubnets: dict[str, Obj] = {}
        self._changed = asyncio.Event()
        self._applied: list[RemoteNode] | None = None

    def replace(self, hostsubnets: Mapping[str, Obj]) -> None:
        """Make ``hostsubnets`` (name -> object) the desired set; a sync follows soon."""
        self._hostsubnets = dict(hostsubnets)
        self._changed.set()

    def poke(self) -> None:
        """Ask for a sync now even if nothing changed (a resync)."""
        self._changed.set()

    def desired(self) -> list[RemoteNode]:
        """The remote nodes the data plane should have now."""
        return remote_nodes(self._hostsubnets.values(), self.node.node_name)

    async def run(self) -> None:
        """Sync on every change (coalesced) and every ``resync_period``; never returns."""
        attempt = 0
        while True:
            await self._wait_for_change()
            await asyncio.sleep(self.coalesce)
            self._changed.clear()
            if await self.sync_once():
                attempt = 0
                continue
            delay = RETRY_BACKOFF.delay(attempt)
            attempt += 1
            await asyncio.sleep(delay)
            self._changed.set()

    async def sync_once(self) -> bool:
        """One ``sync_remote_nodes`` with the full desired set; False when it failed."""
        remotes = self.desired()
        try:
            async with asyncio.timeout(SYNC_TIMEOUT):
                await self.dataplane.sync_remote_nodes(self.node, remotes)
        except (DataPlaneError, TimeoutError) as exc:
            log.error("syncing %d remote nodes failed: %s", len(remotes), exc or "timed out")
            self.synced.clear()
            return False
        if remotes != self._applied:
            names = ", ".join(f"{r.name}={r.subnet}@{r.node_ip}" for r in remotes) or "none"
            log.info("remote nodes synced: %s", names)
            self._applied = remotes
        self.synced.set()
        return True

    async def _wait_for_change(self) -> None:
        try:
            async with asyncio.timeout(self.resync_period):
                await self._changed.wait()
        except TimeoutError:
            log.debug("periodic resync of remote nodes")
