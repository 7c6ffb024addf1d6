"""Remote nodes: HostSubnets turned into ``RemoteNode``s, and the target that syncs them.

``remote_nodes`` is pure: it keeps every other node's HostSubnet that has a usable
subnet and host IP, with the underlay MAC the node published (``podnet.io/underlay-mac``,
copied there by the master; a node without one is checked by address alone, and named
in a warning whenever the set changes). ``RemoteNodeSync`` owns the desired set (replaced
as a whole on every HostSubnet event) and is the ``podnet.reconcile`` target that hands
it to ``DataPlane.sync_remote_nodes``: bursts of events are coalesced into one call, a
failed call is retried with backoff, a periodic resync sends the same set again so the
backend repairs drift (a route deleted by hand), and a remote the data plane refuses (a
subnet overlapping another, host-gw without L2 adjacency) is left out by bisection while
the others are routed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from podnet.dataplane.interface import DataPlane, NodeNetwork, RemoteNode
from podnet.dataplane.vteppeers import unpublished
from podnet.model.underlaymac import annotated_mac
from podnet.reconcile import ApplyRecord, Pacing, ReconcileLoop, ReconcileMetrics

log = logging.getLogger("podnet.agent.remotes")

Obj = Mapping[str, Any]
COALESCE_SECONDS = 0.05  # wait this long after a change for the rest of a burst


def _remote_node(hostsubnet: Obj) -> RemoteNode | None:
    """The ``RemoteNode`` of one HostSubnet, or None if it has no usable subnet/IP."""
    name = hostsubnet.get("host") or (hostsubnet.get("metadata") or {}).get("name")
    if not name or not hostsubnet.get("subnet") or not hostsubnet.get("hostIP"):
        return None
    try:
        subnet = IPv4Network(hostsubnet["subnet"])
        ip = IPv4Address(hostsubnet["hostIP"])
        return RemoteNode(str(name), ip, subnet, annotated_mac(hostsubnet))
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

    name = "remote-nodes"

    def __init__(
        self,
        dataplane: DataPlane,
        node: NodeNetwork,
        resync_period: float,
        coalesce: float = COALESCE_SECONDS,
        metrics: ReconcileMetrics | None = None,
        report: Callable[[ApplyRecord], None] | None = None,
    ) -> None:
        self.dataplane = dataplane
        self.node = node
        self._hostsubnets: dict[str, Obj] = {}
        self._applied: list[RemoteNode] | None = None
        pacing = Pacing(resync_period, coalesce)
        self.loop = ReconcileLoop(
            self, pacing, inputs=("hostsubnets",), metrics=metrics, report=report
        )
        self.synced = self.loop.synced  # set after each successful sync
        self.run = self.loop.run
        self.poke = self.loop.poke  # ask for a sync now even if nothing changed

    def replace(self, hostsubnets: Mapping[str, Obj]) -> None:
        """Make ``hostsubnets`` (name -> object, a listing folded with its changes) the
        desired set; a sync follows soon."""
        self._hostsubnets = dict(hostsubnets)
        self.loop.listed("hostsubnets")

    def desired(self) -> list[RemoteNode]:
        """The remote nodes the data plane should have now."""
        return remote_nodes(self._hostsubnets.values(), self.node.node_name)

    # ---- the reconcile target -------------------------------------------------------------

    def take(self) -> Callable[[], list[RemoteNode]]:
        """The desired set is cheap to compute: no thread needed."""
        return self.desired

    async def apply(self, desired: list[RemoteNode]) -> None:
        """One ``sync_remote_nodes`` with the full desired set."""
        await self.dataplane.sync_remote_nodes(self.node, desired)

    def keys(self, desired: list[RemoteNode]) -> Sequence[str]:
        """Remote nodes by name."""
        return [r.name for r in desired]

    def without(self, desired: list[RemoteNode], left_out: frozenset[str]) -> list[RemoteNode]:
        """The remotes not named in ``left_out``."""
        return [r for r in desired if r.name not in left_out]

    def describe(self, desired: list[RemoteNode]) -> str:
        """How many remote nodes."""
        return f"{len(desired)} remote nodes"

    async def after_apply(self, desired: list[RemoteNode], record: ApplyRecord) -> None:
        """Log the set when it changed."""
        if desired != self._applied:
            names = ", ".join(f"{r.name}={r.subnet}@{r.node_ip}" for r in desired) or "none"
            log.info("remote nodes synced: %s", names)
            if self.node.tunnel == "vxlan" and (old := unpublished(desired)):
                log.warning(
                    "remote nodes without a published underlay MAC (%s), their VXLAN is "
                    "checked by address alone: %s",
                    "an agent from before podnet.io/underlay-mac?",
                    ", ".join(old),
                )
            self._applied = desired
