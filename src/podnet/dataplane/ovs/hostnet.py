"""The host's side of an ovs node (blocking; runs on the backend's node thread).

br0 itself is OVS's; what the kernel of the node holds around it is podnet's, as with the
linux data plane: tun0 (the gateway: its MAC, MTU and address; OVS creates the device),
the routes through it (the cluster networks and the service network; with host-gw each
remote subnet via its node on the underlay), forwarding on and ICMP redirects off, and the
nftables table ``inet podnet`` (masquerade of pod traffic leaving the cluster, pods kept
off the tunnel port), rendered by the linux data plane's ``nftrules``. The service proxy's
table is the linux one as it is (``services``).

Each part is compared the same way by ``problems`` and ``ensure``, so a set-up that
matches changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from podnet.dataplane.interface import NodeNetwork, NodeSetupRefused, RemoteNode
from podnet.dataplane.linux import desired, nftables
from podnet.dataplane.linux import node as linux_node
from podnet.dataplane.linux.desired import NFT_TABLE, NO_GATEWAY, RouteEntry
from podnet.dataplane.linux.netlink import Link, Netlink
from podnet.dataplane.linux.nftrules import render_inet_table
from podnet.dataplane.ovs.tables import TUN
from podnet.dataplane.ovs.underlaysetup import read_uplink
from podnet.dataplane.vteppeers import VtepPeer, vtep_peers

INET_TABLE = f"inet {NFT_TABLE}"


def uplink(nl: Netlink, node: NodeNetwork) -> Link:
    """The node's uplink: the interface holding the node IP (not br-phy, which holds it
    too for OVS's tunnels) or the one ``node`` names."""
    return read_uplink(nl, node)[0]


def gateway_mac(node: NodeNetwork) -> str:
    """tun0's MAC: the pods' gateway, ``0a:58:`` + its IP (as linux gives br0)."""
    return desired.gateway_mac(node)


def host_routes(
    node: NodeNetwork, remotes: Iterable[RemoteNode], underlay: str
) -> frozenset[RouteEntry]:
    """podnet's routes on the host: the cluster networks and the service network onto
    tun0 (OpenShift SDN's), and with host-gw each remote subnet via its node IP."""
    gw = node.gateway.ip
    onto_tun = [
        RouteEntry(net, NO_GATEWAY, TUN, False, gw)
        for net in (*node.cluster_networks, node.service_network)
    ]
    chosen = desired.usable_remotes(node, remotes) if node.tunnel == "host-gw" else []
    via_nodes = [RouteEntry(r.subnet, r.node_ip, underlay, False, gw) for r in chosen]
    return frozenset([*onto_tun, *via_nodes])


def refused_remotes(nl: Netlink, node: NodeNetwork, remotes: Iterable[RemoteNode]) -> list[str]:
    """host-gw: the remotes that are not on the underlay's L2 segment (none with vxlan)."""
    if node.tunnel != "host-gw":
        return []
    underlay = uplink(nl, node)
    nets = [a.network for a in nl.ipv4_addresses(underlay.index)]
    return desired.non_adjacent(desired.usable_remotes(node, remotes), nets)


def peers_of(nl: Netlink, node: NodeNetwork, remotes: Iterable[RemoteNode]) -> frozenset[VtepPeer]:
    """The peers that may send VXLAN, with the MACs checked on the uplink's subnets
    (none with host-gw)."""
    if node.tunnel != "vxlan":
        return frozenset()
    nets = [a.network for a in nl.ipv4_addresses(uplink(nl, node).index)]
    return vtep_peers(node, remotes, nets)


def listed_peers() -> frozenset[VtepPeer]:
    """The peers the kernel's table holds now (used while the remotes are not known)."""
    listed = nftables.list_table(INET_TABLE)
    return frozenset() if listed is None else nftables.vtep_peers_in(listed)


# --- check ---------------------------------------------------------------------------------


def problems(nl: Netlink, node: NodeNetwork, remotes: list[RemoteNode] | None) -> list[str]:
    """How the host differs from ``node``'s set-up (``remotes`` None: not known yet; their
    routes and peers are then not compared)."""
    try:
        underlay = uplink(nl, node)
    except NodeSetupRefused as err:
        return [str(err)]
    found = [p for p in [linux_node.mtu_problem(node, underlay)] if p]
    if not linux_node.forwarding_enabled():
        found.append("net.ipv4.ip_forward is off")
    found += [
        f"net.ipv4.conf.{s.parent.name}.send_redirects is on" for s in linux_node.redirects_on(TUN)
    ]
    tun = nl.link(TUN)
    if tun is None:
        return [*found, f"{TUN} is missing"]
    found += linux_node.describe(TUN, tun, linux_node.link_fixes(tun, node.mtu, gateway_mac(node)))
    addresses = nl.ipv4_addresses(tun.index)
    if node.gateway not in addresses:
        found.append(f"{TUN} lacks the gateway address {node.gateway}")
    found += [f"{TUN} has a stale address {a}" for a in sorted(addresses - {node.gateway})]
    want, have = _routes(nl, node, remotes, underlay.name)
    found += [f"route {r.dst} via {r.gateway} dev {r.dev} is missing" for r in sorted(want - have)]
    found += [f"route {r.dst} via {r.gateway} dev {r.dev} is stale" for r in sorted(have - want)]
    peers = listed_peers() if remotes is None else peers_of(nl, node, remotes)
    text = render_inet_table(node, underlay.name, peers)
    found += nftables.table_problems(INET_TABLE, text, nftables.list_table(INET_TABLE))
    return found


def _routes(
    nl: Netlink, node: NodeNetwork, remotes: list[RemoteNode] | None, underlay: str
) -> tuple[frozenset[RouteEntry], frozenset[RouteEntry]]:
    """(wanted, present) podnet routes; with ``remotes`` unknown, the present routes via
    a gateway (host-gw remotes) count as wanted."""
    names = {link.index: link.name for link in nl.links()}
    have = frozenset(nl.owned_routes(names))
    want = host_routes(node, remotes or [], underlay)
    if remotes is None:
        want |= {r for r in have if r.gateway != NO_GATEWAY and r.dev == underlay}
    return want, have


# --- set-up ----------------------------------------------------------------------------------


def ensure(nl: Netlink, node: NodeNetwork, remotes: list[RemoteNode] | None) -> None:
    """Build or repair the host's side, changing only what differs. tun0 must exist (OVS
    makes it); NodeSetupRefused if the underlay cannot carry the pod MTU."""
    underlay = uplink(nl, node)
    problem = linux_node.mtu_problem(node, underlay)
    if problem:
        raise NodeSetupRefused(problem)
    if not linux_node.forwarding_enabled():
        linux_node.IP_FORWARD.write_text("1")
    tun = nl.require(TUN)
    nl.change(tun, **linux_node.link_fixes(tun, node.mtu, gateway_mac(node)))
    for switch in linux_node.redirects_on(TUN):
        switch.write_text("0")
    addresses = nl.ipv4_addresses(tun.index)
    if node.gateway not in addresses:
        nl.add_address(tun.index, node.gateway)
    for stale in addresses - {node.gateway}:
        nl.delete_address(tun.index, stale)
    ensure_routes(nl, node, remotes, underlay)
    peers = listed_peers() if remotes is None else peers_of(nl, node, remotes)
    want = {INET_TABLE: render_inet_table(node, underlay.name, peers)}
    listed = nftables.list_table(INET_TABLE)
    script = nftables.repair_script(want, {INET_TABLE: listed} if listed is not None else {})
    if script:
        nftables.run(script)


def ensure_routes(
    nl: Netlink, node: NodeNetwork, remotes: list[RemoteNode] | None, underlay: Link
) -> None:
    """Make podnet's routes the wanted ones (only the difference)."""
    want, have = _routes(nl, node, remotes, underlay.name)
    index = {link.name: link.index for link in nl.links()}
    changes = desired.remote_changes(
        desired.RemoteEntries(routes=want), desired.RemoteEntries(routes=have)
    ).routes
    for gone in changes.delete:
        nl.delete_route(gone, index.get(gone.dev, 0))
    for entry in [*changes.add, *changes.replace]:
        nl.put_route(entry, index[entry.dev], replace=entry in changes.replace)


def sync_remotes(nl: Netlink, node: NodeNetwork, remotes: list[RemoteNode]) -> None:
    """Routes (host-gw) and the VXLAN peers for exactly ``remotes``."""
    underlay = uplink(nl, node)
    ensure_routes(nl, node, remotes, underlay)
    linux_node.ensure_peers(node, underlay.name, peers_of(nl, node, remotes))


def refuse(refused: list[str]) -> None:
    """NodeSetupRefused naming the host-gw remotes that are not L2 adjacent, if any."""
    if refused:
        raise NodeSetupRefused(
            f"host-gw needs L2 adjacency: node(s) {', '.join(refused)} are not on the "
            "uplink's subnets"
        )
