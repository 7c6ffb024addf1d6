"""Applies and checks a node's underlay (see ``underlay.py``): br-phy, its flows, its
interface's address, OVS's user routes and vxlan0.

``UnderlaySetup`` reads what is there first and changes only what differs, so a second
``ensure`` (a restarted agent) changes nothing: no port re-added, no flow rewritten, no
address or route touched. ``ensure`` after ``ovs-vswitchd`` restarted puts back what OVS
forgot (br-phy's flows, its user routes). ``check`` reports the differences without
changing anything. The node IP on the uplink is never touched.

Netlink work runs wherever the caller's ``Kernel`` runs it: on a socket in the node's
namespace (the data plane's node thread, or a ``NodeKernel``).
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Awaitable, Callable, Iterable
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import Any, Final, Protocol

from podnet.dataplane.interface import (
    DataPlaneError,
    DataPlaneRejected,
    NodeNetwork,
    NodeSetupRefused,
)
from podnet.dataplane.linux.netlink import Link, Netlink, nl_call
from podnet.dataplane.linux.workers import NamespaceWorker
from podnet.dataplane.ovs import tables
from podnet.dataplane.ovs.flow import Flow, flows_text
from podnet.dataplane.ovs.ofctl import FlowRunner, parse_flow
from podnet.dataplane.ovs.ovsdb import Ovsdb
from podnet.dataplane.ovs.underlay import (
    PEERS_COOKIE,
    UNDERLAY_BRIDGE,
    UPLINK_PORT,
    KernelView,
    OvsRoute,
    Underlay,
    bridge_config,
    choose_uplink,
    kernel_drift,
    mtu_problem,
    parse_tunnel_neighbours,
    parse_user_routes,
    peer_flows,
    phy_flows,
    port_drift,
    probes,
    route_changes,
    vxlan_drift,
    vxlan_options,
)
from podnet.dataplane.vteppeers import VtepPeer

AF_INET: Final = 2
MAIN_TABLE: Final = 254
IFA_F_NOPREFIXROUTE: Final = 0x200
ROUTE_WAIT: Final = 5.0  # seconds for OVS to learn br-phy's new address from netlink
ROUTE_RETRY: Final = 0.02
Kernel = Callable[[Callable[[Netlink], Any]], Awaitable[Any]]


class Switch(FlowRunner, Protocol):
    """What the underlay needs of ``ovs-vswitchd``: flows and unixctl (``OfctlRunner``)."""

    async def appctl(self, command: str, *args: str) -> str:
        """Run unixctl ``command``; its reply (DataPlaneRejected if refused)."""


# --- the kernel side (blocking, on the setup's netlink socket) ------------------------


def _ipv4(msg: Any) -> IPv4Interface:
    ip = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
    return IPv4Interface(f"{ip}/{msg['prefixlen']}")


def _addresses(nl: Netlink, index: int | None = None) -> list[Any]:
    filters: dict[str, Any] = {} if index is None else {"index": index}
    msgs = nl_call("listing addresses", nl.ipr.addr, "dump", family=AF_INET, **filters)
    return [m for m in msgs if index is None or m["index"] == index]


def _main_routes(nl: Netlink) -> list[Any]:
    msgs = nl_call("listing routes", nl.ipr.route, "dump", family=AF_INET)
    return [m for m in msgs if m.get_attr("RTA_TABLE") == MAIN_TABLE]


def read_uplink(nl: Netlink, node: NodeNetwork) -> tuple[Link, IPv4Interface, IPv4Address | None]:
    """The uplink, the node IP with its prefix, and the uplink's default gateway."""
    addresses: dict[int, set[IPv4Interface]] = {}
    for msg in _addresses(nl):
        addresses.setdefault(int(msg["index"]), set()).add(_ipv4(msg))
    link, address = choose_uplink(node, nl.links(), addresses)
    gateways = [
        m.get_attr("RTA_GATEWAY")
        for m in _main_routes(nl)
        if m["dst_len"] == 0 and m.get_attr("RTA_OIF") == link.index
    ]
    return link, address, IPv4Address(gateways[0]) if gateways and gateways[0] else None


def read_kernel(nl: Netlink) -> KernelView:
    """br-phy's interface as the kernel shows it."""
    link = nl.link(UNDERLAY_BRIDGE)
    if link is None:
        return KernelView(None)
    addresses = frozenset(
        (_ipv4(m), bool((m.get_attr("IFA_FLAGS") or m["flags"]) & IFA_F_NOPREFIXROUTE))
        for m in _addresses(nl, link.index)
    )
    routes = tuple(
        IPv4Network(f"{m.get_attr('RTA_DST') or '0.0.0.0'}/{m['dst_len']}")
        for m in _main_routes(nl)
        if m.get_attr("RTA_OIF") == link.index
    )
    return KernelView(link, addresses, routes)


def fix_kernel(nl: Netlink, underlay: Underlay) -> list[str]:
    """Make br-phy's interface what ``kernel_drift`` wants; what was changed."""
    view = read_kernel(nl)
    drift = kernel_drift(view, underlay)
    if view.link is None or not drift:
        return drift
    link = view.link
    fixes: dict[str, Any] = {"state": "up"} if not link.up else {}
    if link.mtu != underlay.mtu:
        fixes["mtu"] = underlay.mtu
    nl.change(link, **fixes)
    want = (underlay.address, True)
    for address, _ in view.addresses - {want}:
        nl.delete_address(link.index, address)  # also removes its prefix route, if any
    if want not in view.addresses:
        ip, plen = str(underlay.address.ip), underlay.address.network.prefixlen
        nl_call(
            f"adding {underlay.address} noprefixroute to {UNDERLAY_BRIDGE}",
            nl.ipr.addr,
            "add",
            index=link.index,
            address=ip,
            prefixlen=plen,
            IFA_FLAGS=IFA_F_NOPREFIXROUTE,
            tolerate=(errno.EEXIST,),
        )
    for route in read_kernel(nl).routes:
        nl_call(
            f"deleting route {route} through {UNDERLAY_BRIDGE}",
            nl.ipr.route,
            "del",
            dst=str(route),
            oif=link.index,
            table=MAIN_TABLE,
            tolerate=(errno.ESRCH, errno.ENOENT),
        )
    return drift


# --- the whole set-up ----------------------------------------------------------------------


class NodeKernel:
    """A ``Kernel`` for callers without a node thread of their own: netlink functions run
    on one thread of the namespace this was constructed in, on one socket opened there."""

    def __init__(self) -> None:
        self._worker = NamespaceWorker("podnet-underlay")
        self._netlink: Netlink | None = None

    async def __call__(self, fn: Callable[[Netlink], Any]) -> Any:
        return await asyncio.wrap_future(self._worker.submit(lambda: fn(self._open())))

    def _open(self) -> Netlink:
        if self._netlink is None:
            self._netlink = Netlink.open()
        return self._netlink

    def close(self) -> None:
        def release() -> None:
            if self._netlink is not None:
                self._netlink.close()

        self._worker.submit(release).result(5.0)
        self._worker.stop()


class UnderlaySetup:
    """Applies (``ensure``) and checks (``check``) one node's ``Underlay``. OVSDB and
    OpenFlow go through ``db`` and ``switch``; netlink work through ``kernel``, which runs
    a function on a socket in the node's namespace (``NodeKernel``, or the data plane's
    node thread)."""

    def __init__(self, db: Ovsdb, switch: Switch, kernel: Kernel) -> None:
        self.db, self.switch, self._kernel = db, switch, kernel

    async def discover(self, node: NodeNetwork, datapath: str) -> Underlay:
        """The desired underlay of ``node`` from the kernel's uplink; NodeSetupRefused if
        the node IP is nowhere or the uplink's MTU is too small for the pod MTU."""
        link, address, gateway = await self._kernel(lambda nl: read_uplink(nl, node))
        underlay = Underlay(
            link.name, link.mac, link.mtu, address, gateway, node.vxlan_port, datapath
        )
        problem = mtu_problem(underlay, node.mtu)
        if problem is not None:
            raise NodeSetupRefused(problem)
        return underlay

    async def check(self, underlay: Underlay) -> list[str]:
        """How the node differs from ``underlay`` ([] when it does not); changes nothing."""
        drift = vxlan_drift(await self.db.port(tables.VXLAN), underlay)
        if not underlay.native:
            return drift
        if await self.db.port(UNDERLAY_BRIDGE) is None:
            return [*drift, f"{UNDERLAY_BRIDGE} is missing"]
        drift += port_drift(await self.db.ports(UNDERLAY_BRIDGE), underlay)
        if not await self._flows_ok(underlay):
            drift.append(f"{UNDERLAY_BRIDGE} flows differ")
        drift += kernel_drift(await self._kernel(read_kernel), underlay)
        add, delete = route_changes(await self._routes(), underlay)
        drift += [f"OVS route {' '.join(r.args())} missing" for r in add]
        drift += [f"OVS route {' '.join(r.args())} not wanted" for r in delete]
        return drift

    async def ensure(self, underlay: Underlay) -> list[str]:
        """Make the node match ``underlay``; what was changed ([]: it matched)."""
        changed = []
        if underlay.native:
            changed += await self._ensure_bridge(underlay)
            changed += await self._kernel(lambda nl: fix_kernel(nl, underlay))
            changed += await self._ensure_routes(underlay)
        if vxlan_drift(await self.db.port(tables.VXLAN), underlay):
            await self.db.add_port(
                tables.BRIDGE,
                tables.VXLAN,
                type="vxlan",
                ofport=tables.VXLAN_PORT,
                options=vxlan_options(underlay),
            )
            changed.append(f"{tables.VXLAN} set")
        return changed

    async def prime(self, underlay: Underlay, remotes: Iterable[IPv4Address]) -> list[IPv4Address]:
        """Make OVS ARP now for the next hop of each remote node it has no MAC for, so the
        first packet to it is not dropped on a neighbour-cache miss (after ``ensure`` on a
        new node or a restarted ``ovs-vswitchd``). Returns the remotes probed; the replies
        arrive asynchronously (``tnl/neigh/show``)."""
        if not underlay.native:
            return []
        known = parse_tunnel_neighbours(await self.switch.appctl("tnl/neigh/show"))
        sent = probes(underlay, remotes, known)
        for args in sent.values():
            await self.switch.appctl("ofproto/trace-packet-out", *args)
        return list(sent)

    async def remove(self) -> None:
        """Remove br-phy (its interface and address go with it) and OVS's user routes
        through it; the uplink is the kernel's alone again. vxlan0 goes with br0."""
        for route in parse_user_routes(await self.switch.appctl("ovs/route/show")):
            await self.switch.appctl("ovs/route/del", str(route.prefix))
        await self.db.delete_bridge(UNDERLAY_BRIDGE)

    async def _ensure_bridge(self, underlay: Underlay) -> list[str]:
        changed = []
        view: KernelView = await self._kernel(read_kernel)
        mac_ok = view.link is not None and view.link.mac.lower() == underlay.mac.lower()
        if await self.db.port(UNDERLAY_BRIDGE) is None or not mac_ok:
            await self.db.ensure_bridge(UNDERLAY_BRIDGE, underlay.datapath, bridge_config(underlay))
            changed.append(f"{UNDERLAY_BRIDGE} set")
        ports = await self.db.ports(UNDERLAY_BRIDGE)
        if port_drift(ports, underlay):
            for port in ports:
                if port.name != underlay.uplink:
                    await self.db.delete_port(UNDERLAY_BRIDGE, port.name)
            await self.db.add_port(UNDERLAY_BRIDGE, underlay.uplink, ofport=UPLINK_PORT)
            changed.append(f"{underlay.uplink} on {UNDERLAY_BRIDGE}")
        base, peers = await self._flows()
        if sorted(base) != sorted(phy_flows(underlay)):
            # the peers' flows are kept: the remote nodes may not be known yet (a restart)
            text = flows_text([*phy_flows(underlay), *peers])
            await self.switch.replace_flows(UNDERLAY_BRIDGE, text)
            changed.append(f"{UNDERLAY_BRIDGE} flows")
        return changed

    async def ensure_peers(self, underlay: Underlay, peers: Iterable[VtepPeer]) -> bool:
        """Make br-phy's peer flows those of ``peers`` (one bundle, only if they differ);
        whether anything changed. Nothing to do without br-phy (the kernel datapath)."""
        if not underlay.native:
            return False
        want = peer_flows(underlay, peers)
        if sorted((await self._flows())[1]) == sorted(want):
            return False
        text = f"delete cookie={PEERS_COOKIE:#x}/-1\n" + "".join(f"add {f.text()}\n" for f in want)
        await self.switch.bundle(UNDERLAY_BRIDGE, text)
        return True

    async def _flows_ok(self, underlay: Underlay) -> bool:
        return sorted((await self._flows())[0]) == sorted(phy_flows(underlay))

    async def _flows(self) -> tuple[list[Flow], list[Flow]]:
        """br-phy's flows: (the others, the peers')."""
        dumped = await self.switch.dump_flows(UNDERLAY_BRIDGE)
        flows = [parse_flow(line) for line in dumped.splitlines() if line.strip()]
        return (
            [f for f in flows if f.cookie != PEERS_COOKIE],
            [f for f in flows if f.cookie == PEERS_COOKIE],
        )

    async def _routes(self) -> list[OvsRoute]:
        return parse_user_routes(await self.switch.appctl("ovs/route/show"))

    async def _ensure_routes(self, underlay: Underlay) -> list[str]:
        add, delete = route_changes(await self._routes(), underlay)
        for route in delete:
            await self.switch.appctl("ovs/route/del", str(route.prefix))
        for route in add:
            await self._add_route(route)
        return [f"OVS route {' '.join(r.args())}" for r in (*delete, *add)]

    async def _add_route(self, route: OvsRoute) -> None:
        """``ovs/route/add``; OVS refuses it until it has seen br-phy's address (netlink
        reaches it asynchronously), so a refusal is retried for ``ROUTE_WAIT`` seconds."""
        deadline = time.monotonic() + ROUTE_WAIT
        while True:
            try:
                await self.switch.appctl("ovs/route/add", *route.args())
                return
            except DataPlaneRejected as error:
                if time.monotonic() > deadline:
                    raise DataPlaneError(
                        f"OVS refused route {' '.join(route.args())} for {ROUTE_WAIT}s: {error}"
                    ) from error
            await asyncio.sleep(ROUTE_RETRY)
