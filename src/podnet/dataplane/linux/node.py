"""The node's own set-up and its routes to remote nodes (blocking; node-namespace thread).

Each part is compared the same way by ``check`` and ``setup``: a function computes what
differs, ``check`` reports it and ``setup`` fixes exactly that, so a set-up that already
matches changes nothing (no link flap, no address re-add, no new ifindex).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from podnet.dataplane.interface import DataPlaneError, NodeNetwork, NodeSetupRefused, RemoteNode
from podnet.dataplane.linux import desired, nftables, pods
from podnet.dataplane.linux.desired import (
    BRIDGE,
    VXLAN,
    PodPort,
    RemoteEntries,
)
from podnet.dataplane.linux.netlink import Link, Netlink
from podnet.dataplane.linux.nftrules import render_inet_table, render_ruleset
from podnet.dataplane.vteppeers import VtepPeer, vtep_peers

log = logging.getLogger(__name__)

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
# br_netfilter (built into many kernels, on by default in every namespace) passes bridged
# pod-to-pod frames through the inet hooks, so through conntrack, which costs a tenth of
# same-node throughput. In subnet mode podnet filters bridged traffic in the bridge family
# and NATs only routed traffic, so the node keeps both switches off. With isolation
# (multitenant, networkpolicy) the IPv4 switch is on, so that the policy table's forward
# chains see same-node traffic and conntrack lets replies through (per-namespace sysctls).
BRIDGE_NF_CALLS = (
    Path("/proc/sys/net/bridge/bridge-nf-call-iptables"),
    Path("/proc/sys/net/bridge/bridge-nf-call-ip6tables"),
)


# --- what differs --------------------------------------------------------------------


def underlay_link(nl: Netlink, node: NodeNetwork) -> Link:
    """The underlay interface: the one named in ``node`` or the one holding node_ip."""
    if node.underlay_interface:
        link = nl.link(node.underlay_interface)
        if link is None:
            raise NodeSetupRefused(f"underlay interface {node.underlay_interface} does not exist")
        return link
    index = nl.owner_of(node.node_ip)
    link = nl.link_at(index) if index is not None else None
    if link is None:
        raise NodeSetupRefused(f"node IP {node.node_ip} is on no interface of this namespace")
    return link


def mtu_problem(node: NodeNetwork, underlay: Link) -> str | None:
    """Why the underlay cannot carry the pod MTU (None if it can)."""
    overhead = node.tunnel_overhead
    if underlay.mtu >= node.mtu + overhead:
        return None
    why = f" + {overhead} for VXLAN" if overhead else ""
    return (
        f"underlay {underlay.name} MTU {underlay.mtu} is below {node.mtu + overhead} "
        f"(pod MTU {node.mtu}{why})"
    )


def link_fixes(link: Link, mtu: int, mac: str) -> dict[str, Any]:
    """Attributes (pyroute2 names) to set so ``link`` has ``mtu``, ``mac`` and is up."""
    fixes: dict[str, Any] = {}
    if link.mtu != mtu:
        fixes["mtu"] = mtu
    if link.mac.lower() != mac:
        fixes["address"] = mac
    if not link.up:
        fixes["state"] = "up"
    return fixes


def vxlan_wanted(node: NodeNetwork, underlay: Link) -> dict[str, Any]:
    """vxlan0's fixed parameters, as the kernel reports them."""
    return {
        "IFLA_VXLAN_ID": node.vni,
        "IFLA_VXLAN_PORT": node.vxlan_port,
        "IFLA_VXLAN_LOCAL": str(node.node_ip),
        "IFLA_VXLAN_LINK": underlay.index,
        "IFLA_VXLAN_LEARNING": 0,
    }


def vxlan_recreate_reasons(link: Link, node: NodeNetwork, underlay: Link) -> list[str]:
    """Why vxlan0 must be rebuilt (parameters that cannot change in place)."""
    if link.kind != "vxlan":
        return [f"{VXLAN} is a {link.kind or 'non-VXLAN'} link"]
    return [
        f"{VXLAN} {key.removeprefix('IFLA_VXLAN_').lower()} is {link.info.get(key)}, want {want}"
        for key, want in vxlan_wanted(node, underlay).items()
        if link.info.get(key) != want
    ]


def forwarding_enabled() -> bool:
    """IPv4 forwarding in this thread's namespace."""
    return IP_FORWARD.read_text().strip() == "1"


def bridge_netfilter_wrong(node: NodeNetwork) -> list[tuple[Path, str]]:
    """The br_netfilter switches of this thread's namespace that differ from what
    ``node`` needs, with the value they need (none when br_netfilter is not loaded)."""
    wrong = []
    for switch in BRIDGE_NF_CALLS:
        want = "1" if node.isolation and switch == BRIDGE_NF_CALLS[0] else "0"
        try:
            if switch.read_text().strip() != want:
                wrong.append((switch, want))
        except FileNotFoundError:
            if want == "1":
                raise NodeSetupRefused(f"{switch} is missing: br_netfilter is not loaded") from None
    return wrong


def redirects_on(device: str = BRIDGE) -> list[Path]:
    """The ``send_redirects`` switches that are on (the kernel ORs ``all`` with br0's).
    The service network is routed back out of br0, so every pod packet to a cluster IP
    would make the node send the pod an ICMP redirect, and a redirect spends the
    per-host ICMP allowance that the proxy's "port unreachable" (UDP to a service
    without endpoints) needs. (``device``: the gateway's interface, ovs: tun0.)"""
    switches = [Path(f"/proc/sys/net/ipv4/conf/{dev}/send_redirects") for dev in ("all", device)]
    return [s for s in switches if s.exists() and s.read_text().strip() != "0"]


def describe(name: str, link: Link, fixes: dict[str, Any]) -> list[str]:
    """Problems for ``fixes`` found on ``link``."""
    have = {"mtu": link.mtu, "address": link.mac, "state": "down"}
    return [f"{name} {key} is {have[key]}, want {want}" for key, want in fixes.items()]


# --- check -----------------------------------------------------------------------------


def check(nl: Netlink, node: NodeNetwork) -> list[str]:
    """Every way the kernel differs from ``node``'s set-up (empty when all matches)."""
    try:
        underlay = underlay_link(nl, node)
    except NodeSetupRefused as err:
        return [str(err)]
    problems = [p for p in [mtu_problem(node, underlay)] if p]
    problems += _bridge_problems(nl, node)
    if not forwarding_enabled():
        problems.append("net.ipv4.ip_forward is off")
    try:
        wrong = bridge_netfilter_wrong(node)
    except NodeSetupRefused as err:
        problems.append(str(err))
    else:
        problems += [f"net.bridge.{s.name} is not {want}" for s, want in wrong]
    problems += [f"net.ipv4.conf.{s.parent.name}.send_redirects is on" for s in redirects_on()]
    problems += _vxlan_problems(nl, node, underlay)
    peers = kernel_peers(nl, node, underlay)
    problems += nft_problems(node, pods.attached_ports(nl), underlay.name, peers)
    bridge = nl.link(BRIDGE)
    if bridge is not None and bridge.alias != node.version_note():
        problems.append(f"version note is {bridge.alias!r}, want {node.version_note()!r}")
    return problems


def _bridge_problems(nl: Netlink, node: NodeNetwork) -> list[str]:
    bridge = nl.link(BRIDGE)
    if bridge is None:
        return [f"{BRIDGE} is missing"]
    if bridge.kind != "bridge":
        return [f"{BRIDGE} is a {bridge.kind or 'non-bridge'} link"]
    problems = describe(BRIDGE, bridge, link_fixes(bridge, node.mtu, desired.gateway_mac(node)))
    addresses = nl.ipv4_addresses(bridge.index)
    if node.gateway not in addresses:
        problems.append(f"{BRIDGE} lacks the gateway address {node.gateway}")
    problems += [f"{BRIDGE} has a stale address {a}" for a in sorted(addresses - {node.gateway})]
    return problems


def _vxlan_problems(nl: Netlink, node: NodeNetwork, underlay: Link) -> list[str]:
    link = nl.link(VXLAN)
    if node.tunnel != "vxlan":
        return [f"{VXLAN} exists but the tunnel is {node.tunnel}"] if link else []
    if link is None:
        return [f"{VXLAN} is missing"]
    reasons = vxlan_recreate_reasons(link, node, underlay)
    mac = desired.vtep_mac(node.node_ip)
    return reasons or describe(VXLAN, link, link_fixes(link, node.mtu, mac))


def nft_problems(
    node: NodeNetwork, ports: set[PodPort], underlay: str, peers: frozenset[VtepPeer]
) -> list[str]:
    """How podnet's nftables tables differ from the ruleset rendered for ``node``."""
    have = nftables.podnet_tables()
    want = render_ruleset(node, ports, underlay, peers).tables()
    return [
        p for key, text in want.items() for p in nftables.table_problems(key, text, have.get(key))
    ]


def kernel_peers(nl: Netlink, node: NodeNetwork, underlay: Link) -> frozenset[VtepPeer]:
    """The VTEP peers the kernel's FDB names, with the MACs of podnet's neighbour entries
    on the underlay interface (none without vxlan0 or with host-gw)."""
    link = nl.link(VXLAN) if node.tunnel == "vxlan" else None
    if link is None or link.kind != "vxlan":
        return frozenset()
    return desired.vtep_peers(nl.fdb_entries(link), nl.neighbours(underlay))


# --- setup -----------------------------------------------------------------------------


def setup(nl: Netlink, node: NodeNetwork) -> None:
    """Build or repair ``node``'s set-up, changing only what differs; note written last."""
    underlay = underlay_link(nl, node)
    problem = mtu_problem(node, underlay)
    if problem:
        raise NodeSetupRefused(problem)
    if not forwarding_enabled():
        IP_FORWARD.write_text("1")
    for switch, want in bridge_netfilter_wrong(node):
        switch.write_text(want)
    bridge = _ensure_bridge(nl, node)
    for switch in redirects_on():
        switch.write_text("0")
    _ensure_gateway(nl, bridge, node)
    if node.tunnel == "vxlan":
        _ensure_vxlan(nl, node, underlay)
    elif nl.delete(VXLAN):
        log.info("removed stale %s (tunnel %s)", VXLAN, node.tunnel)
    pods.remove_orphans(nl, bridge)
    ensure_nft(node, pods.attached_ports(nl), underlay.name, kernel_peers(nl, node, underlay))
    if bridge.alias != node.version_note():
        nl.change(bridge, ifalias=node.version_note())


def _ensure_bridge(nl: Netlink, node: NodeNetwork) -> Link:
    mac = desired.gateway_mac(node)
    bridge = nl.link(BRIDGE)
    if bridge is not None and bridge.kind != "bridge":
        nl.delete(BRIDGE)
        bridge = None
    if bridge is None:
        # Created with the default MTU and then changed: only an MTU *change* pins a
        # bridge's MTU; otherwise it follows its ports and jumps to 1500 when the last
        # pod leaves.
        bridge = nl.create(BRIDGE, "bridge", address=mac)
    nl.change(bridge, **link_fixes(bridge, node.mtu, mac))
    return bridge


def _ensure_gateway(nl: Netlink, bridge: Link, node: NodeNetwork) -> None:
    addresses = nl.ipv4_addresses(bridge.index)
    if node.gateway not in addresses:
        nl.add_address(bridge.index, node.gateway)
    for stale in addresses - {node.gateway}:
        nl.delete_address(bridge.index, stale)


def _ensure_vxlan(nl: Netlink, node: NodeNetwork, underlay: Link) -> None:
    mac = desired.vtep_mac(node.node_ip)
    link = nl.link(VXLAN)
    if link is not None and vxlan_recreate_reasons(link, node, underlay):
        log.info("rebuilding %s: %s", VXLAN, vxlan_recreate_reasons(link, node, underlay))
        nl.delete(VXLAN)
        link = None
    if link is None:
        link = nl.create(
            VXLAN,
            "vxlan",
            vxlan_id=node.vni,
            vxlan_port=node.vxlan_port,
            vxlan_local=str(node.node_ip),
            vxlan_link=underlay.index,
            vxlan_learning=0,
            mtu=node.mtu,
            address=mac,
        )
    nl.change(link, **link_fixes(link, node.mtu, mac))


def ensure_nft(
    node: NodeNetwork, ports: set[PodPort], underlay: str, peers: frozenset[VtepPeer]
) -> None:
    """Replace a podnet table whose rules differ, otherwise only add and delete the
    anti-spoofing and VTEP peer elements that differ: one transaction, or none."""
    want = render_ruleset(node, ports, underlay, peers).tables()
    script = nftables.repair_script(want, nftables.podnet_tables())
    if script:
        nftables.run(script)


def ensure_peers(node: NodeNetwork, underlay: str, peers: frozenset[VtepPeer]) -> None:
    """Make the inet table's peer sets equal ``peers`` (the whole table if its rules
    differ); the bridge table and its pods are not read."""
    key = f"inet {desired.NFT_TABLE}"
    listed = nftables.list_table(key)
    have = {key: listed} if listed is not None else {}
    script = nftables.repair_script({key: render_inet_table(node, underlay, peers)}, have)
    if script:
        nftables.run(script)


# --- remote nodes ----------------------------------------------------------------------


def sync_remotes(nl: Netlink, node: NodeNetwork, remotes: list[RemoteNode]) -> None:
    """Make podnet's routes, neighbours and FDB entries match ``remotes`` exactly (with
    VXLAN, a permanent neighbour on the underlay for each peer whose MAC is checked),
    then the VTEP peers accepted on the tunnel port (one nft change). host-gw: remotes
    that are not L2 adjacent get no route and are refused at the end."""
    underlay = underlay_link(nl, node)
    chosen = desired.usable_remotes(node, remotes)
    nets = [a.network for a in nl.ipv4_addresses(underlay.index)]
    refused: list[str] = []
    if node.tunnel == "host-gw":
        refused = desired.non_adjacent(chosen, nets)
        chosen = [r for r in chosen if r.name not in refused]
    peers = vtep_peers(node, chosen, nets)
    want = desired.remote_entries(node, chosen, underlay.name, peers)
    _apply_remote(nl, node, want, underlay)
    ensure_peers(node, underlay.name, peers)
    if refused:
        raise NodeSetupRefused(
            f"host-gw needs L2 adjacency: node(s) {', '.join(refused)} are not on a subnet "
            f"of {underlay.name}"
        )


def _apply_remote(nl: Netlink, node: NodeNetwork, want: RemoteEntries, underlay: Link) -> None:
    index = {link.name: link.index for link in nl.links()}
    vxlan = nl.link(VXLAN) if VXLAN in index else None
    if node.tunnel == "vxlan" and (vxlan is None or vxlan.kind != "vxlan"):
        raise DataPlaneError(f"{VXLAN} is missing: set the node up first")
    changes = desired.remote_changes(want, _current_remote(nl, vxlan, underlay, index))
    for r in changes.routes.delete:
        nl.delete_route(r, index.get(r.dev, 0))
    for n in changes.neighbours.delete:
        nl.delete_neighbour(n, index[n.dev])
    for f in changes.fdb.delete:
        nl.delete_fdb(f, index[f.dev])
    for f in changes.fdb.add + changes.fdb.replace:
        nl.put_fdb(f, index[f.dev])
    for n in changes.neighbours.add + changes.neighbours.replace:
        nl.put_neighbour(n, index[n.dev])
    for r in changes.routes.add + changes.routes.replace:
        if r.dev not in index:
            raise DataPlaneError(f"route {r.dst}: interface {r.dev} is missing")
        nl.put_route(r, index[r.dev], replace=r in changes.routes.replace)


def _current_remote(
    nl: Netlink, vxlan: Link | None, underlay: Link, index: dict[str, int]
) -> RemoteEntries:
    """podnet's entries in the kernel: its routes anywhere, its neighbours on the
    underlay interface (peers' MACs), its neighbours and FDB on vxlan0."""
    names = {i: name for name, i in index.items()}
    routes = frozenset(nl.owned_routes(names))
    neighbours = frozenset(nl.neighbours(underlay))
    if vxlan is None or vxlan.kind != "vxlan":
        return RemoteEntries(routes=routes, neighbours=neighbours)
    return RemoteEntries(
        routes=routes,
        neighbours=neighbours | frozenset(nl.neighbours(vxlan)),
        fdb=frozenset(nl.fdb_entries(vxlan)),
    )
