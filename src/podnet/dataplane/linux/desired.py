"""The desired kernel state of a node, as pure functions of the agent's plain values.

Nothing here touches the kernel: the ``linux`` backend renders these values to apply them
and compares the same values with what it reads back, so a check and a repair never
disagree about what "right" means.

- Remote nodes: flannel's per-node entries. VXLAN: a permanent neighbour (remote subnet
  ``.0`` → remote VTEP MAC), an FDB entry (VTEP MAC → remote node IP) and an onlink route
  (remote subnet via ``.0`` on ``vxlan0``). host-gw: a route (remote subnet via remote node
  IP on the underlay interface).
- VTEP MACs come from node IPs (``0e:58:`` + the four IP bytes), so nodes need not
  exchange them; pod MACs use ``0a:58:`` so the two schemes never collide.
- Host veth names come from a hash of ``container_id`` and ``ifname`` (``wiring``).
- The nftables tables are rendered in ``podnet.dataplane.linux.nftrules``.
- Tunnel safety: a node takes VXLAN only from its peers (the remote nodes' underlay
  addresses, the ``vtep_peers`` set, kept equal to the FDB's destinations) arriving on the
  underlay interface, each with its published underlay MAC as the Ethernet source where
  that is checked (``vtep_macs``; ``vtep_ip_only`` the others, see ``vteppeers``), and
  pods never reach any node's tunnel port. A peer with a MAC also gets a permanent
  neighbour entry on the underlay interface, so no ARP reply can move its address.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import Generic, TypeVar

from podnet.dataplane import wiring
from podnet.dataplane.interface import NodeNetwork, PodAttachment, PodNetwork, RemoteNode, pod_mac
from podnet.dataplane.vteppeers import VtepPeer, with_mac

# shared with ovs, kept here under their old names for linux's modules
HOST_VETH_PREFIX = wiring.HOST_VETH_PREFIX
host_veth_name = wiring.host_veth_name
is_host_veth_name = wiring.is_host_veth_name
usable_remotes = wiring.usable_remotes
non_adjacent = wiring.non_adjacent

BRIDGE = "br0"
VXLAN = "vxlan0"
ROUTE_PROTO = 80  # rtnetlink protocol marking podnet's routes and neighbour entries
NFT_TABLE = "podnet"  # in families inet and bridge
POD_PORTS_SET = "pod_ports"
VTEP_PEERS_SET = "vtep_peers"  # in the inet table: who may send us VXLAN
VTEP_MACS_SET = "vtep_macs"  # (peer IP, peer MAC): the Ethernet source its VXLAN must have
VTEP_IP_ONLY_SET = "vtep_ip_only"  # peers accepted by address alone
ALIAS_TAG = "podnet/1"
IFALIAS_MAX = 255

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


# --- naming and addresses ------------------------------------------------------------


def vtep_mac(node_ip: IPv4Address) -> str:
    """The MAC of a node's ``vxlan0``: ``0e:58:`` followed by the node IP's four bytes."""
    return "0e:58:" + ":".join(f"{b:02x}" for b in node_ip.packed)


def gateway_mac(node: NodeNetwork) -> str:
    """br0's fixed MAC (else a bridge takes its lowest port's MAC, which changes)."""
    return pod_mac(node.gateway.ip)


# --- pod identity kept in the host veth's ifalias ---------------------------------------


def pod_alias(pod: PodNetwork) -> str:
    """The identity written to the host veth's ifalias, so a restarted agent can rebuild
    its view from the kernel. The sandbox path is dropped if the alias would not fit."""
    head = f"{ALIAS_TAG} {pod.container_id} {pod.ifname} {pod.address} {pod.gateway}"
    alias = f"{head} {pod.netns}"
    return alias if len(alias.encode()) <= IFALIAS_MAX else f"{head} -"


def parse_pod_alias(alias: str, host_ifname: str, mtu: int) -> PodAttachment | None:
    """The attachment recorded in ``alias`` (None if it is not one of ours)."""
    parts = alias.split(" ", 5)
    if len(parts) != 6 or parts[0] != ALIAS_TAG:
        return None
    _, container_id, ifname, address, gateway, sandbox = parts
    try:
        iface, gw = IPv4Interface(address), IPv4Address(gateway)
    except ValueError:
        return None
    return PodAttachment(
        container_id=container_id,
        host_ifname=host_ifname,
        ifname=ifname,
        mac=pod_mac(iface.ip),
        sandbox="" if sandbox == "-" else sandbox,
        address=iface,
        gateway=gw,
        mtu=mtu,
    )


@dataclass(frozen=True, order=True)
class PodPort:
    """One anti-spoofing entry: frames from ``host_ifname`` must carry ``mac`` and ``ip``."""

    host_ifname: str
    mac: str
    ip: IPv4Address

    @classmethod
    def of(cls, attachment: PodAttachment) -> PodPort:
        return cls(attachment.host_ifname, attachment.mac, attachment.address.ip)

    def element(self) -> str:
        """The nft set element (``ifname . ether_addr . ipv4_addr``), as nft prints it."""
        return f'"{self.host_ifname}" . {self.mac} . {self.ip}'


# --- remote nodes ----------------------------------------------------------------------


NO_GATEWAY = IPv4Address(0)  # a route straight onto its device (scope link)


@dataclass(frozen=True, order=True)
class RouteEntry:
    """A route podnet owns (protocol ``ROUTE_PROTO``, main table); ``gateway`` is
    ``NO_GATEWAY`` for a route onto the device itself."""

    dst: IPv4Network
    gateway: IPv4Address
    dev: str
    onlink: bool
    prefsrc: IPv4Address | None


@dataclass(frozen=True, order=True)
class NeighEntry:
    """A permanent IPv4 neighbour entry on ``dev``."""

    ip: IPv4Address
    mac: str
    dev: str


@dataclass(frozen=True, order=True)
class FdbEntry:
    """A VXLAN forwarding entry: frames to ``mac`` are tunnelled to ``dst``."""

    mac: str
    dst: IPv4Address
    dev: str


@dataclass(frozen=True)
class RemoteEntries:
    """Everything the kernel must hold for the remote nodes."""

    routes: frozenset[RouteEntry] = frozenset()
    neighbours: frozenset[NeighEntry] = frozenset()
    fdb: frozenset[FdbEntry] = frozenset()


def remote_entries(
    node: NodeNetwork,
    remotes: Iterable[RemoteNode],
    underlay: str,
    peers: Iterable[VtepPeer] = (),
) -> RemoteEntries:
    """The routes, neighbours and FDB entries for ``remotes`` under ``node.tunnel``, and
    with VXLAN a permanent neighbour on ``underlay`` for each of ``peers`` with a MAC."""
    chosen = usable_remotes(node, remotes)
    service = service_route(node)
    if node.tunnel == "host-gw":
        routes = {_host_gw_route(node, r, underlay) for r in chosen}
        return RemoteEntries(routes=frozenset({service, *routes}))
    return RemoteEntries(
        routes=frozenset({service, *(_vxlan_route(node, r) for r in chosen)}),
        neighbours=frozenset(
            {
                *(NeighEntry(r.subnet.network_address, vtep_mac(r.node_ip), VXLAN) for r in chosen),
                *underlay_neighbours(peers, underlay),
            }
        ),
        fdb=frozenset(FdbEntry(vtep_mac(r.node_ip), r.node_ip, VXLAN) for r in chosen),
    )


def underlay_neighbours(peers: Iterable[VtepPeer], underlay: str) -> frozenset[NeighEntry]:
    """A permanent neighbour entry on the underlay interface for each peer whose MAC is
    known: the node sends to that MAC whatever ARP says, and an ARP reply forged for the
    peer's address changes nothing."""
    return frozenset(NeighEntry(p.ip, p.mac, underlay) for p in with_mac(peers) if p.mac)


def service_route(node: NodeNetwork) -> RouteEntry:
    """The service network, on the bridge without a gateway (OpenShift SDN routes it to
    tun0). The service proxy rewrites a cluster IP in prerouting and output, but the
    kernel needs a route before it gets there: without one, a node's own connection to a
    cluster IP fails with "network unreachable", and a pod's packet to a service without
    endpoints meets "no route to host" instead of the proxy's reset. Nothing is ever
    sent on this route: every service address is DNATed or rejected first."""
    return RouteEntry(node.service_network, NO_GATEWAY, BRIDGE, False, node.gateway.ip)


def _vxlan_route(node: NodeNetwork, remote: RemoteNode) -> RouteEntry:
    return RouteEntry(remote.subnet, remote.subnet.network_address, VXLAN, True, node.gateway.ip)


def _host_gw_route(node: NodeNetwork, remote: RemoteNode, underlay: str) -> RouteEntry:
    return RouteEntry(remote.subnet, remote.node_ip, underlay, False, node.gateway.ip)


@dataclass(frozen=True)
class Diff(Generic[V]):
    """What to change so that ``current`` becomes ``desired``."""

    add: list[V]
    replace: list[V]
    delete: list[V]

    @property
    def empty(self) -> bool:
        return not (self.add or self.replace or self.delete)


def diff(desired: Mapping[K, V], current: Mapping[K, list[V]]) -> Diff[V]:
    """Compare keyed entries. ``current`` may hold several entries per key (the kernel
    can); a key's surplus entries are deleted, a wrong single entry is replaced."""
    add: list[V] = []
    replace: list[V] = []
    delete: list[V] = []
    for key, want in desired.items():
        have = current.get(key, [])
        if not have:
            add.append(want)
        elif want not in have:
            replace.append(want)
            delete.extend(have[1:])
        else:
            delete.extend(h for h in have if h != want)
    for key, have in current.items():
        if key not in desired:
            delete.extend(have)
    return Diff(add, replace, delete)


def by_key(entries: Iterable[V], key: Callable[[V], K]) -> dict[K, list[V]]:
    """Entries grouped by ``key``."""
    out: dict[K, list[V]] = {}
    for entry in entries:
        out.setdefault(key(entry), []).append(entry)
    return out


def _route_key(e: RouteEntry) -> IPv4Network:
    return e.dst


def _neigh_key(e: NeighEntry) -> tuple[str, IPv4Address]:
    return (e.dev, e.ip)


def _fdb_key(e: FdbEntry) -> tuple[str, str]:
    return (e.dev, e.mac)


@dataclass(frozen=True)
class RemoteChanges:
    """What to change in the kernel so its remote-node entries become the desired ones."""

    routes: Diff[RouteEntry]
    neighbours: Diff[NeighEntry]
    fdb: Diff[FdbEntry]


def remote_changes(want: RemoteEntries, have: RemoteEntries) -> RemoteChanges:
    """Routes are keyed by destination, neighbours by (device, IP), FDB entries by
    (device, MAC): one desired entry per key, anything else under that key goes."""
    return RemoteChanges(
        routes=diff({_route_key(e): e for e in want.routes}, by_key(have.routes, _route_key)),
        neighbours=diff(
            {_neigh_key(e): e for e in want.neighbours}, by_key(have.neighbours, _neigh_key)
        ),
        fdb=diff({_fdb_key(e): e for e in want.fdb}, by_key(have.fdb, _fdb_key)),
    )


def vtep_peers(fdb: Iterable[FdbEntry], underlay: Iterable[NeighEntry] = ()) -> frozenset[VtepPeer]:
    """The peers that may send us VXLAN: the destinations of podnet's FDB entries (one
    per remote node, VTEP MAC derived from its IP), each with the MAC of podnet's
    permanent neighbour entry for it on the underlay interface (``underlay``), if any. So
    the kernel itself records the peer set, and a restarted agent compares the two
    without asking the API."""
    macs = {n.ip: n.mac.lower() for n in underlay}
    ips = {e.dst for e in fdb if e.mac.lower() == vtep_mac(e.dst)}
    return frozenset(VtepPeer(ip, macs.get(ip)) for ip in ips)
