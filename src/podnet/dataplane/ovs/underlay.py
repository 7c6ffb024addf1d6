"""VXLAN between nodes on OVS's userspace datapath: the underlay bridge ``br-phy``.

On the userspace (``netdev``) datapath OVS builds and strips VXLAN headers itself ("native
tunnelling"). To send, it looks the remote node IP up in its own route table
(``ovs/route/show``) and needs the answer to be an OVS bridge; the frame then leaves
through that bridge's flows. To receive, a UDP packet to a local tunnel address that a
bridge outputs to its ``LOCAL`` port is decapsulated (``tnl_pop``) and enters ``br0``
through ``vxlan0``. The remote VTEP's MAC comes from ARP replies OVS snoops on that bridge
(``tnl/neigh/show``).

The node keeps its IP where it is: the kernel's uplink (the interface holding the node
IP) keeps its address and routes, and the node's own traffic never touches OVS. The
uplink also becomes the one port of ``br-phy`` (OVS reads and sends on it through a packet
socket beside the kernel). ``br-phy``'s own interface gets the uplink's MAC and the node IP
*without a prefix route* (``noprefixroute``): OVS takes its tunnels' source address from
it, the kernel routes nothing through it. OVS's route table gets user routes through
``br-phy``: the uplink's subnet and, where the kernel's default route leaves through the
uplink, the same default gateway. ``br-phy``'s flows pass only what tunnelling needs:

- from ``LOCAL`` (OVS's encapsulated packets and ARP requests) out of the uplink;
- VXLAN to the node IP from the uplink to ``LOCAL``, where it is decapsulated;
- ARP replies to the node IP to ``LOCAL``, where OVS snoops the sender's MAC;
- nothing else (the kernel receives everything itself on the uplink).

Above those, the peers' flows (``peer_flows``, a cookie of their own, set with the remote
nodes): a peer whose MAC is checked (``podnet.dataplane.vteppeers``) gets its VXLAN and
its ARP replies to ``LOCAL`` only with that MAC as the Ethernet source (and, for ARP, as
the sender's hardware address); the same from its address with any other MAC is dropped.
So a host that forges a peer's address cannot inject, nor move OVS's neighbour entry for
it (the equivalent of linux's permanent neighbour entries). br0 checks ``tun_src`` on
top, for every peer.

OVS forgets its user routes and flows when ``ovs-vswitchd`` restarts, so ``ensure`` is
also the restore. It also forgets the remote VTEPs' MACs, and drops the first packet to
each while it ARPs; ``probes`` make it ARP beforehand. With the kernel datapath
(``system``) the kernel builds the tunnel and only ``vxlan0`` is needed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import Final

from podnet.dataplane.interface import (
    VXLAN_OVERHEAD,
    NodeNetwork,
    NodeSetupRefused,
)
from podnet.dataplane.linux.netlink import Link
from podnet.dataplane.ovs import tables
from podnet.dataplane.ovs.flow import Flow, Kind, cookie
from podnet.dataplane.ovs.ovsdb import Port
from podnet.dataplane.vteppeers import VtepPeer, with_mac

UNDERLAY_BRIDGE: Final = "br-phy"  # the name OVS's userspace-tunnelling guide uses
UPLINK_PORT: Final = 1  # the uplink's ofport on br-phy
UNDERLAY_COOKIE: Final = cookie(Kind.NODE, UNDERLAY_BRIDGE)
PEERS_COOKIE: Final = cookie(Kind.NODE, f"{UNDERLAY_BRIDGE}/peers")
PEER_CHECKED: Final = 110  # a peer's address with its MAC: above the base flows
PEER_FORGED: Final = 105  # a peer's address with another MAC
_USER_ROUTE = re.compile(r"^User: (\S+) dev (\S+)(?: GW (\S+))?")
_NEIGHBOUR = re.compile(r"^(\d+\.\d+\.\d+\.\d+)\s+([0-9a-f:]{17})\s+(\S+)$")
PROBE_FLOW: Final = "in_port=controller,dl_type=0x88b5"  # a frame no pipeline forwards


@dataclass(frozen=True)
class Underlay:
    """One node's desired underlay: its uplink, the node IP with the uplink's prefix, the
    uplink's default gateway (None: the default route does not leave through it)."""

    uplink: str
    mac: str
    mtu: int
    address: IPv4Interface
    gateway: IPv4Address | None = None
    vxlan_port: int = 4789
    datapath: str = "netdev"

    @property
    def native(self) -> bool:
        """Whether OVS builds the tunnel itself (userspace datapath) and needs br-phy."""
        return self.datapath == "netdev"


@dataclass(frozen=True, order=True)
class OvsRoute:
    """A user route in OVS's route table through br-phy."""

    prefix: IPv4Network
    gateway: IPv4Address | None = None

    def args(self) -> list[str]:
        """``ovs/route/add`` arguments."""
        gateway = [str(self.gateway)] if self.gateway else []
        return [str(self.prefix), UNDERLAY_BRIDGE, *gateway]


@dataclass(frozen=True)
class KernelView:
    """What the node's kernel shows of br-phy's interface: the link (None if missing),
    its IPv4 addresses with whether each has ``noprefixroute``, and main-table routes
    through it."""

    link: Link | None
    addresses: frozenset[tuple[IPv4Interface, bool]] = frozenset()
    routes: tuple[IPv4Network, ...] = ()


# --- desired state (pure) -------------------------------------------------------------


def vxlan_options(underlay: Underlay) -> dict[str, str]:
    """vxlan0's options on br0: the remote node and the VNID come from each flow."""
    return {"remote_ip": "flow", "key": "flow", "dst_port": str(underlay.vxlan_port)}


def bridge_config(underlay: Underlay) -> dict[str, str]:
    """br-phy's other_config: the uplink's MAC, so the underlay sees one MAC per node."""
    return {"hwaddr": underlay.mac}


def phy_flows(underlay: Underlay) -> list[Flow]:
    """br-phy's flows, written as ``dump-flows`` shows them (so a dump compares equal)."""
    ip, port = underlay.address.ip, UPLINK_PORT
    return [
        Flow(0, 100, "in_port=LOCAL", f"output:{port}", UNDERLAY_COOKIE),
        Flow(
            0,
            100,
            f"udp,in_port={port},nw_dst={ip},tp_dst={underlay.vxlan_port}",
            "LOCAL",
            UNDERLAY_COOKIE,
        ),
        Flow(0, 100, f"arp,in_port={port},arp_tpa={ip},arp_op=2", "LOCAL", UNDERLAY_COOKIE),
        Flow(0, 0, "", "drop", UNDERLAY_COOKIE),
    ]


def peer_flows(underlay: Underlay, peers: Iterable[VtepPeer]) -> list[Flow]:
    """br-phy's flows for the peers whose MAC is checked (see the module doc), written as
    ``dump-flows`` shows them."""
    ip, port, flows = underlay.address.ip, UPLINK_PORT, []
    vxlan = f"nw_dst={ip},tp_dst={underlay.vxlan_port}"
    reply = f"arp_tpa={ip},arp_op=2"
    for peer in with_mac(peers):
        mac, src = peer.mac, f"in_port={port},dl_src={peer.mac}"
        flows += [
            Flow(0, PEER_CHECKED, f"udp,{src},nw_src={peer.ip},{vxlan}", "LOCAL", PEERS_COOKIE),
            Flow(
                0, PEER_FORGED, f"udp,in_port={port},nw_src={peer.ip},{vxlan}", "drop", PEERS_COOKIE
            ),
            Flow(
                0,
                PEER_CHECKED,
                f"arp,{src},arp_spa={peer.ip},{reply},arp_sha={mac}",
                "LOCAL",
                PEERS_COOKIE,
            ),
            Flow(
                0,
                PEER_FORGED,
                f"arp,in_port={port},arp_spa={peer.ip},{reply}",
                "drop",
                PEERS_COOKIE,
            ),
        ]
    return flows


def ovs_routes(underlay: Underlay) -> list[OvsRoute]:
    """OVS's user routes: the uplink's subnet, and its default gateway if it has one."""
    routes = [OvsRoute(underlay.address.network)]
    if underlay.gateway is not None:
        routes.append(OvsRoute(IPv4Network("0.0.0.0/0"), underlay.gateway))
    return routes


def mtu_problem(underlay: Underlay, pod_mtu: int) -> str | None:
    """Why the uplink cannot carry the pod MTU over VXLAN (None if it can)."""
    if underlay.mtu >= pod_mtu + VXLAN_OVERHEAD:
        return None
    return (
        f"underlay {underlay.uplink} MTU {underlay.mtu} is below {pod_mtu + VXLAN_OVERHEAD}"
        f" (pod MTU {pod_mtu} + {VXLAN_OVERHEAD} for VXLAN)"
    )


def choose_uplink(
    node: NodeNetwork, links: Iterable[Link], addresses: Mapping[int, set[IPv4Interface]]
) -> tuple[Link, IPv4Interface]:
    """The uplink (named in ``node``, or the interface holding the node IP that is not
    br-phy) and the node IP with its prefix; NodeSetupRefused if there is none."""
    for link in links:
        if link.name == UNDERLAY_BRIDGE or (
            node.underlay_interface and link.name != node.underlay_interface
        ):
            continue
        for address in addresses.get(link.index, set()):
            if address.ip == node.node_ip:
                return link, address
    where = node.underlay_interface or "any interface but " + UNDERLAY_BRIDGE
    raise NodeSetupRefused(f"node IP {node.node_ip} is not on {where}")


# --- what differs (pure) -----------------------------------------------------------------


def parse_user_routes(text: str) -> list[OvsRoute]:
    """The IPv4 user routes through br-phy in ``ovs/route/show`` output."""
    routes = []
    for line in text.splitlines():
        found = _USER_ROUTE.match(line.strip())
        if found is None or found[2] != UNDERLAY_BRIDGE or ":" in found[1]:
            continue
        gateway = IPv4Address(found[3]) if found[3] and ":" not in found[3] else None
        routes.append(OvsRoute(IPv4Network(found[1]), gateway))
    return sorted(routes)


def route_changes(
    found: Iterable[OvsRoute], underlay: Underlay
) -> tuple[list[OvsRoute], list[OvsRoute]]:
    """The user routes to add and to delete."""
    have, want = set(found), set(ovs_routes(underlay))
    return sorted(want - have), sorted(have - want)


def kernel_drift(view: KernelView, underlay: Underlay) -> list[str]:
    """How br-phy's interface differs from what tunnelling needs ([] if it does not)."""
    if view.link is None:
        return [f"{UNDERLAY_BRIDGE} has no interface"]
    link, drift = view.link, []
    if not link.up:
        drift.append(f"{UNDERLAY_BRIDGE} is down")
    if link.mac.lower() != underlay.mac.lower():
        drift.append(f"{UNDERLAY_BRIDGE} MAC {link.mac}, want {underlay.mac}")
    if link.mtu != underlay.mtu:
        drift.append(f"{UNDERLAY_BRIDGE} MTU {link.mtu}, want {underlay.mtu}")
    want = (underlay.address, True)
    if want not in view.addresses:
        drift.append(f"{UNDERLAY_BRIDGE} lacks {underlay.address} noprefixroute")
    drift += [f"{UNDERLAY_BRIDGE} has {a}" for a in sorted(a for a, _ in view.addresses - {want})]
    drift += [f"kernel route {r} through {UNDERLAY_BRIDGE}" for r in view.routes]
    return drift


def port_drift(ports: Iterable[Port], underlay: Underlay) -> list[str]:
    """How br-phy's ports differ from the uplink alone on ofport 1."""
    found = {p.name: p for p in ports}
    drift = [
        f"{UNDERLAY_BRIDGE} has port {name}" for name in sorted(found) if name != underlay.uplink
    ]
    uplink = found.get(underlay.uplink)
    if uplink is None:
        drift.append(f"{underlay.uplink} is not a port of {UNDERLAY_BRIDGE}")
    elif uplink.ofport != UPLINK_PORT or uplink.type:
        drift.append(f"{underlay.uplink} is ofport {uplink.ofport} type {uplink.type!r}")
    return drift


def vxlan_drift(port: Port | None, underlay: Underlay) -> list[str]:
    """How vxlan0 differs from a flow-based VXLAN port on ofport 1 ([] if it does not)."""
    if port is None:
        return [f"{tables.VXLAN} is missing"]
    want = vxlan_options(underlay)
    if port.type != "vxlan" or port.options != want or port.ofport != tables.VXLAN_PORT:
        return [f"{tables.VXLAN} is {port.type} ofport {port.ofport} {port.options}, want {want}"]
    return []


def parse_tunnel_neighbours(text: str) -> set[IPv4Address]:
    """The IPv4 next hops OVS knows a MAC for on br-phy, from ``tnl/neigh/show``."""
    found = (_NEIGHBOUR.match(line.strip()) for line in text.splitlines())
    return {IPv4Address(m[1]) for m in found if m is not None and m[3] == UNDERLAY_BRIDGE}


def next_hop(underlay: Underlay, remote: IPv4Address) -> IPv4Address | None:
    """Whose MAC OVS needs to reach node IP ``remote``: the node itself on the uplink's
    subnet, else the gateway (None: OVS has no route to it)."""
    return remote if remote in underlay.address.network else underlay.gateway


def probes(
    underlay: Underlay, remotes: Iterable[IPv4Address], known: set[IPv4Address]
) -> dict[IPv4Address, list[str]]:
    """For each next hop OVS has no MAC for, one remote behind it and the
    ``ofproto/trace-packet-out`` arguments that make OVS ARP for that next hop: a generated
    trace has side effects (the ARP request) but sends no packet."""
    wanted: dict[IPv4Address, IPv4Address] = {}
    for remote in sorted(set(remotes)):
        hop = next_hop(underlay, remote)
        if hop is not None and hop not in known:
            wanted.setdefault(hop, remote)
    send = f"output:{tables.VXLAN_PORT}"
    return {
        r: ["-generate", tables.BRIDGE, PROBE_FLOW, f"set_field:{r}->tun_dst,{send}"]
        for r in wanted.values()
    }
