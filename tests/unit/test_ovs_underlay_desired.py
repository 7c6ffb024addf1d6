"""The underlay's desired state and its comparisons (pure; the real thing is in
``tests/integration/test_ovs_underlay.py``)."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import cast

import pytest

from podnet.dataplane.interface import NodeSetupRefused
from podnet.dataplane.linux.netlink import Link
from podnet.dataplane.ovs import tables
from podnet.dataplane.ovs.flow import Kind, flows_text, kind_of
from podnet.dataplane.ovs.flowsync import same_flows
from podnet.dataplane.ovs.ofctl import FakeFlowRunner
from podnet.dataplane.ovs.ovsdb import Ovsdb, Port
from podnet.dataplane.ovs.underlay import (
    PEERS_COOKIE,
    UNDERLAY_BRIDGE,
    UNDERLAY_COOKIE,
    KernelView,
    OvsRoute,
    Underlay,
    bridge_config,
    choose_uplink,
    kernel_drift,
    mtu_problem,
    next_hop,
    ovs_routes,
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
from podnet.dataplane.ovs.underlaysetup import Kernel, UnderlaySetup
from podnet.dataplane.vteppeers import VtepPeer
from podnet.testing.nodenetwork import node_network

MAC = "5a:45:ef:9b:31:f1"
ADDRESS = IPv4Interface("192.168.100.11/24")
UNDERLAY = Underlay("pn-eth0", MAC, 1500, ADDRESS, IPv4Address("192.168.100.250"))
ROUTE_SHOW = """Route Table:
Cached: 127.0.0.1/32 dev lo SRC 127.0.0.1 local
Cached: 192.168.100.11/32 dev br-phy SRC 192.168.100.11 local
User: 192.168.100.0/24 dev br-phy SRC 192.168.100.11
Cached: 192.168.100.0/24 dev pn-eth0 SRC 192.168.100.11
User: 0.0.0.0/0 dev br-phy GW 192.168.100.250 SRC 192.168.100.11
User: 10.9.0.0/16 dev br-other SRC 10.9.0.1
User: fd00::/64 dev br-phy SRC fd00::1
Cached: 0.0.0.0/0 dev pn-eth0 GW 192.168.100.250 SRC 192.168.100.11
"""
# what `ovs-ofctl --no-stats --no-names dump-flows br-phy` printed for these flows (OVS 3.1)
C = f" cookie={UNDERLAY_COOKIE:#x}, priority="
DUMPED = (
    f"{C}100,in_port=LOCAL actions=output:1\n"
    f"{C}100,udp,in_port=1,nw_dst=192.168.100.11,tp_dst=4789 actions=LOCAL\n"
    f"{C}100,arp,in_port=1,arp_tpa=192.168.100.11,arp_op=2 actions=LOCAL\n"
    f"{C}0 actions=drop\n"
)


def link(name: str, index: int, **changes: object) -> Link:
    values: dict[str, object] = {
        "index": index,
        "name": name,
        "kind": "",
        "mtu": 1500,
        "mac": MAC,
        "up": True,
        "master": 0,
        "alias": "",
    }
    values.update(changes)
    return Link(**values)  # type: ignore[arg-type]


def test_vxlan0_takes_peer_and_vnid_from_each_flow() -> None:
    assert vxlan_options(UNDERLAY) == {"remote_ip": "flow", "key": "flow", "dst_port": "4789"}
    assert vxlan_options(replace(UNDERLAY, vxlan_port=8472))["dst_port"] == "8472"
    assert bridge_config(UNDERLAY) == {"hwaddr": MAC}


def test_br_phy_passes_only_vxlan_to_the_node_and_arp_replies() -> None:
    flows = phy_flows(UNDERLAY)
    assert same_flows(DUMPED, flows)
    assert {kind_of(f.cookie) for f in flows} == {Kind.NODE}
    text = flows_text(flows)
    assert "tp_dst=4789" in text and "nw_dst=192.168.100.11" in text and "arp_op=2" in text
    assert "NORMAL" not in text  # the kernel already gets every frame on the uplink
    other = phy_flows(replace(UNDERLAY, address=IPv4Interface("192.168.100.12/24")))
    assert not same_flows(DUMPED, other)


def test_ovs_routes_mirror_the_uplinks_subnet_and_gateway() -> None:
    assert ovs_routes(UNDERLAY) == [
        OvsRoute(IPv4Network("192.168.100.0/24")),
        OvsRoute(IPv4Network("0.0.0.0/0"), IPv4Address("192.168.100.250")),
    ]
    assert ovs_routes(replace(UNDERLAY, gateway=None)) == [OvsRoute(ADDRESS.network)]
    assert OvsRoute(IPv4Network("0.0.0.0/0"), IPv4Address("10.0.0.1")).args() == [
        "0.0.0.0/0",
        UNDERLAY_BRIDGE,
        "10.0.0.1",
    ]


def test_user_routes_through_br_phy_are_parsed_and_compared() -> None:
    found = parse_user_routes(ROUTE_SHOW)
    assert found == sorted(ovs_routes(UNDERLAY))  # not Cached, not IPv6, not br-other
    assert route_changes(found, UNDERLAY) == ([], [])
    stale = OvsRoute(IPv4Network("10.1.0.0/16"))
    add, delete = route_changes([stale, OvsRoute(ADDRESS.network)], UNDERLAY)
    assert add == [OvsRoute(IPv4Network("0.0.0.0/0"), IPv4Address("192.168.100.250"))]
    assert delete == [stale]
    assert parse_user_routes("Route Table:\n") == []


def test_kernel_view_of_br_phy() -> None:
    good = KernelView(link(UNDERLAY_BRIDGE, 7), frozenset({(ADDRESS, True)}))
    assert kernel_drift(good, UNDERLAY) == []
    assert kernel_drift(KernelView(None), UNDERLAY) == [f"{UNDERLAY_BRIDGE} has no interface"]
    bad = KernelView(
        link(UNDERLAY_BRIDGE, 7, up=False, mtu=1400, mac="0a:00:00:00:00:01"),
        frozenset({(ADDRESS, False), (IPv4Interface("10.0.0.1/8"), True)}),
        (ADDRESS.network,),
    )
    drift = kernel_drift(bad, UNDERLAY)
    assert drift == [
        f"{UNDERLAY_BRIDGE} is down",
        f"{UNDERLAY_BRIDGE} MAC 0a:00:00:00:00:01, want {MAC}",
        f"{UNDERLAY_BRIDGE} MTU 1400, want 1500",
        f"{UNDERLAY_BRIDGE} lacks {ADDRESS} noprefixroute",
        f"{UNDERLAY_BRIDGE} has 10.0.0.1/8",
        f"{UNDERLAY_BRIDGE} has {ADDRESS}",  # the same address with a prefix route
        f"kernel route {ADDRESS.network} through {UNDERLAY_BRIDGE}",
    ]


def test_br_phy_holds_the_uplink_alone_on_ofport_1() -> None:
    assert port_drift([Port("pn-eth0", "", 1)], UNDERLAY) == []
    assert port_drift([], UNDERLAY) == [f"pn-eth0 is not a port of {UNDERLAY_BRIDGE}"]
    assert port_drift([Port("pn-eth0", "", 2), Port("x", "internal", 3)], UNDERLAY) == [
        f"{UNDERLAY_BRIDGE} has port x",
        "pn-eth0 is ofport 2 type ''",
    ]


def test_vxlan0_drift() -> None:
    good = Port(tables.VXLAN, "vxlan", tables.VXLAN_PORT, options=vxlan_options(UNDERLAY))
    assert vxlan_drift(good, UNDERLAY) == []
    assert vxlan_drift(None, UNDERLAY) == [f"{tables.VXLAN} is missing"]
    assert vxlan_drift(replace(good, ofport=5), UNDERLAY)
    assert vxlan_drift(replace(good, options={"remote_ip": "192.168.100.12"}), UNDERLAY)
    assert vxlan_drift(replace(good, type="geneve"), UNDERLAY)


def test_the_uplink_is_the_node_ips_interface_but_br_phy() -> None:
    node = node_network("n1", "192.168.100.11", "10.128.0.0/23")
    links = [link(UNDERLAY_BRIDGE, 3), link("eth1", 4), link("pn-eth0", 5)]
    addresses = {3: {ADDRESS}, 4: {IPv4Interface("10.0.0.1/8")}, 5: {ADDRESS}}
    assert choose_uplink(node, links, addresses) == (links[2], ADDRESS)
    named = replace(node, underlay_interface="eth1")
    with pytest.raises(NodeSetupRefused, match="not on eth1"):
        choose_uplink(named, links, addresses)
    with pytest.raises(NodeSetupRefused, match=f"any interface but {UNDERLAY_BRIDGE}"):
        choose_uplink(node, links, {3: {ADDRESS}})


def test_the_uplink_must_carry_the_pod_mtu_plus_vxlan() -> None:
    assert mtu_problem(UNDERLAY, 1450) is None
    problem = mtu_problem(UNDERLAY, 1451)
    assert problem is not None and "MTU 1500 is below 1501" in problem
    assert UNDERLAY.native and not replace(UNDERLAY, datapath="system").native


NEIGH_SHOW = """IP                                            MAC                 Bridge
==========================================================================
192.168.100.12                                7e:41:0b:e7:b8:a1   br-phy
10.128.2.10                                   0a:58:0a:80:02:0a   br0
fe80::1                                       7e:41:0b:e7:b8:a2   br-phy
"""


def test_tunnel_neighbours_on_br_phy_are_parsed() -> None:
    assert parse_tunnel_neighbours(NEIGH_SHOW) == {IPv4Address("192.168.100.12")}
    assert parse_tunnel_neighbours("") == set()


def test_probes_ask_once_per_unknown_next_hop() -> None:
    peer, other = IPv4Address("192.168.100.12"), IPv4Address("192.168.100.13")
    far, farther = IPv4Address("10.20.0.5"), IPv4Address("10.20.0.6")
    assert next_hop(UNDERLAY, peer) == peer
    assert next_hop(UNDERLAY, far) == UNDERLAY.gateway  # off the subnet: the gateway's MAC
    assert next_hop(replace(UNDERLAY, gateway=None), far) is None
    found = probes(UNDERLAY, [other, peer, far, farther, peer], known={peer})
    assert list(found) == [far, other]  # one probe for the gateway, none for a known hop
    assert found[other] == [
        "-generate",
        tables.BRIDGE,
        "in_port=controller,dl_type=0x88b5",
        f"set_field:{other}->tun_dst,output:{tables.VXLAN_PORT}",
    ]
    assert probes(replace(UNDERLAY, gateway=None), [far], known=set()) == {}


PEER = IPv4Address("192.168.100.12")
PEER_MAC = "02:00:00:00:00:12"


def test_br_phy_checks_a_peer_s_mac_on_its_vxlan_and_arp_replies() -> None:
    """Issue 19, finding 7: a checked peer's VXLAN and ARP replies pass only with its
    MAC; a peer accepted by address alone adds no flow (br0's tun_src check remains)."""
    flows = peer_flows(UNDERLAY, [VtepPeer(PEER, PEER_MAC), VtepPeer(IPv4Address("10.0.0.9"))])
    assert {f.cookie for f in flows} == {PEERS_COOKIE} != {UNDERLAY_COOKIE}
    by_action = {(f.priority, f.actions): f.match for f in flows if f.match.startswith("udp")}
    assert by_action[(110, "LOCAL")] == (
        f"udp,in_port=1,dl_src={PEER_MAC},nw_src={PEER},nw_dst=192.168.100.11,tp_dst=4789"
    )
    assert (
        by_action[(105, "drop")] == f"udp,in_port=1,nw_src={PEER},nw_dst=192.168.100.11,tp_dst=4789"
    )
    arp = [f for f in flows if f.match.startswith("arp")]
    assert [f.actions for f in sorted(arp)] == ["drop", "LOCAL"]
    assert all(f"arp_spa={PEER}" in f.match for f in arp)
    assert peer_flows(UNDERLAY, [VtepPeer(PEER)]) == []


async def test_peer_flows_are_kept_by_ensure_and_changed_only_when_they_differ() -> None:
    switch = FakeFlowRunner()
    setup = UnderlaySetup(cast(Ovsdb, None), switch, cast(Kernel, None))
    await switch.replace_flows(UNDERLAY_BRIDGE, flows_text(phy_flows(UNDERLAY)))
    peers = [VtepPeer(PEER, PEER_MAC)]
    assert await setup.ensure_peers(UNDERLAY, peers)
    assert not await setup.ensure_peers(UNDERLAY, peers)
    assert await setup._flows_ok(UNDERLAY), "the base flows are compared without the peers'"
    assert await setup.ensure_peers(UNDERLAY, [])
    assert same_flows(await switch.dump_flows(UNDERLAY_BRIDGE), phy_flows(UNDERLAY))
    netdev_only = replace(UNDERLAY, datapath="system")
    assert not await setup.ensure_peers(netdev_only, peers), "no br-phy on the kernel datapath"
