"""The linux backend's pure parts: entries, MACs, names, identity, ruleset text, parsing."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Interface, IPv4Network

import pytest

from podnet.dataplane.interface import NodeNetwork, PodNetwork, RemoteNode, pod_mac
from podnet.dataplane.linux import desired, nftables
from podnet.dataplane.linux.desired import (
    FdbEntry,
    NeighEntry,
    PodPort,
    RouteEntry,
    host_veth_name,
    parse_pod_alias,
    pod_alias,
    remote_entries,
    vtep_mac,
)
from podnet.dataplane.linux.nftrules import render_ruleset
from podnet.dataplane.vteppeers import VtepPeer

CLUSTER = IPv4Network("10.128.0.0/14")
IP = IPv4Address
PEER = IP("203.0.113.12")
PEER_MAC = "02:00:00:00:00:12"
PEERS = [VtepPeer(PEER, PEER_MAC)]


def node(tunnel: str = "vxlan", **overrides: object) -> NodeNetwork:
    values: dict[str, object] = {
        "node_name": "node-1",
        "node_ip": IP("203.0.113.11"),
        "subnet": IPv4Network("10.128.0.0/23"),
        "cluster_networks": (CLUSTER,),
        "service_network": IPv4Network("172.30.0.0/16"),
        "mtu": 1450,
        "tunnel": tunnel,
    }
    values.update(overrides)
    return NodeNetwork(**values)  # type: ignore[arg-type]


def remote(name: str, ip: str, subnet: str) -> RemoteNode:
    return RemoteNode(name, IP(ip), IPv4Network(subnet))


def pod(container_id: str = "abc", netns: str = "/run/netns/p1") -> PodNetwork:
    return PodNetwork(
        container_id=container_id,
        netns=netns,
        ifname="eth0",
        address=IPv4Interface("10.128.0.5/23"),
        gateway=IP("10.128.0.1"),
        mtu=1450,
    )


def port(i: int) -> PodPort:
    ip = IP(f"10.128.0.{i}")
    return PodPort(host_veth_name(f"c{i}", "eth0"), pod_mac(ip), ip)


# --- names and MACs ---------------------------------------------------------------------


def test_vtep_mac_comes_from_the_node_ip_and_differs_from_pod_macs() -> None:
    assert vtep_mac(IP("203.0.113.11")) == "0e:58:cb:00:71:0b"
    assert vtep_mac(IP("10.128.0.5")) != pod_mac(IP("10.128.0.5"))
    assert desired.gateway_mac(node()) == "0a:58:0a:80:00:01"


def test_host_veth_names_are_short_stable_and_distinct() -> None:
    name = host_veth_name("abc", "eth0")
    assert name == host_veth_name("abc", "eth0")
    assert name != host_veth_name("abc", "eth1") != host_veth_name("abd", "eth0")
    assert len(name) <= 15 and name.startswith("pn")
    assert desired.is_host_veth_name(name)
    assert not desired.is_host_veth_name("pn-x1-eth0")


def test_pod_identity_round_trips_through_the_alias() -> None:
    the_pod = pod()
    found = parse_pod_alias(pod_alias(the_pod), "pnx", 1450)
    assert found is not None
    assert (found.container_id, found.ifname, found.address, found.gateway) == (
        "abc",
        "eth0",
        the_pod.address,
        the_pod.gateway,
    )
    assert found.sandbox == "/run/netns/p1" and found.mac == "0a:58:0a:80:00:05"


def test_a_too_long_alias_drops_the_sandbox() -> None:
    alias = pod_alias(pod(netns="/run/netns/" + "x" * 300))
    assert len(alias) <= 255
    found = parse_pod_alias(alias, "pnx", 1450)
    assert found is not None and found.sandbox == ""


@pytest.mark.parametrize("alias", ["", "something else", "podnet/1 a b c d e", "podnet/9 a"])
def test_foreign_aliases_are_not_pods(alias: str) -> None:
    assert parse_pod_alias(alias, "pnx", 1450) is None


# --- remote nodes ------------------------------------------------------------------------


def test_vxlan_entries_follow_flannel() -> None:
    want = remote_entries(node(), [remote("node-2", "203.0.113.12", "10.128.2.0/23")], "eth0")
    mac = vtep_mac(IP("203.0.113.12"))
    gw = IP("10.128.2.0")
    assert want.routes == {
        RouteEntry(IPv4Network("10.128.2.0/23"), gw, "vxlan0", True, IP("10.128.0.1")),
        desired.service_route(node()),
    }
    assert want.neighbours == {NeighEntry(gw, mac, "vxlan0")}
    assert want.fdb == {FdbEntry(mac, IP("203.0.113.12"), "vxlan0")}


def test_host_gw_entries_are_routes_via_the_node_ip() -> None:
    want = remote_entries(
        node("host-gw"), [remote("node-2", "203.0.113.12", "10.128.2.0/23")], "eth0"
    )
    assert want.routes == {
        RouteEntry(
            IPv4Network("10.128.2.0/23"), IP("203.0.113.12"), "eth0", False, IP("10.128.0.1")
        ),
        desired.service_route(node("host-gw")),
    }
    assert not want.neighbours and not want.fdb


def test_usable_remotes_skip_this_node_and_second_claims() -> None:
    chosen = desired.usable_remotes(
        node(),
        [
            remote("node-1", "203.0.113.11", "10.128.0.0/23"),  # this node
            remote("z-stale", "203.0.113.40", "10.128.2.0/23"),
            remote("node-2", "203.0.113.12", "10.128.2.0/23"),
            remote("own-ip", "203.0.113.11", "10.128.6.0/23"),
        ],
    )
    assert [r.name for r in chosen] == ["node-2"]


def test_non_adjacent_nodes_are_named() -> None:
    remotes = [
        remote("near", "203.0.113.12", "10.128.2.0/23"),
        remote("far", "198.51.100.7", "10.128.4.0/23"),
    ]
    assert desired.non_adjacent(remotes, [IPv4Network("203.0.113.0/24")]) == ["far"]


def test_diff_adds_replaces_and_deletes_only_what_differs() -> None:
    want = {"a": 1, "b": 2, "c": 3}
    have = {"a": [1], "b": [9], "c": [3, 4], "d": [5]}
    result = desired.diff(want, have)
    assert (result.add, result.replace, sorted(result.delete)) == ([], [2], [4, 5])
    assert desired.diff(want, {"a": [1], "b": [2], "c": [3]}).empty
    assert desired.diff(want, {}).add == [1, 2, 3]


def test_remote_changes_fix_a_moved_node_and_drop_a_gone_one() -> None:
    two = remote("node-2", "203.0.113.12", "10.128.2.0/23")
    three = remote("node-3", "203.0.113.13", "10.128.4.0/23")
    moved = remote("node-2", "203.0.113.22", "10.128.2.0/23")
    have = remote_entries(node(), [two, three], "eth0")
    changes = desired.remote_changes(remote_entries(node(), [moved], "eth0"), have)
    assert [f.dst for f in changes.fdb.add] == [IP("203.0.113.22")]
    assert {f.dst for f in changes.fdb.delete} == {IP("203.0.113.12"), IP("203.0.113.13")}
    assert [n.mac for n in changes.neighbours.replace] == [vtep_mac(IP("203.0.113.22"))]
    assert [r.dst for r in changes.routes.delete] == [IPv4Network("10.128.4.0/23")]
    assert not changes.routes.add and not changes.routes.replace
    assert desired.remote_changes(have, have) == desired.remote_changes(have, have)
    same = desired.remote_changes(have, have)
    assert same.routes.empty and same.neighbours.empty and same.fdb.empty


# --- ruleset -----------------------------------------------------------------------------

LISTED = """table ip other {
\tchain x {
\t}
}
table inet podnet {
\tset cluster_networks {
\t\ttype ipv4_addr
\t\tflags interval
\t\telements = { 10.128.0.0/14 }
\t}

\tset no_masquerade {
\t\ttype ipv4_addr
\t\tflags interval
\t\telements = { 10.128.0.0/14, 172.30.0.0/16 }
\t}

\tset vtep_peers {
\t\ttype ipv4_addr
\t\telements = { 203.0.113.12 }
\t}

\tset vtep_macs {
\t\ttype ipv4_addr . ether_addr
\t\telements = { 203.0.113.12 . 02:00:00:00:00:12 }
\t}

\tset vtep_ip_only {
\t\ttype ipv4_addr
\t}

\tchain raw_prerouting {
\t\ttype filter hook prerouting priority raw; policy accept;
\t\tip daddr 203.0.113.11 udp dport 4789 notrack
\t}

\tchain raw_output {
\t\ttype filter hook output priority raw; policy accept;
\t\tip saddr 203.0.113.11 udp dport 4789 notrack
\t}

\tchain input {
\t\ttype filter hook input priority filter; policy accept;
\t\tudp dport 4789 iifname != "eth0" drop
\t\tudp dport 4789 ip saddr != @vtep_peers drop
\t\tudp dport 4789 ip saddr != @vtep_ip_only ip saddr . ether saddr != @vtep_macs drop
\t\tmeta nfproto ipv6 udp dport 4789 drop
\t\tip daddr 203.0.113.11 udp dport 4789 accept
\t}

\tchain forward {
\t\ttype filter hook forward priority filter; policy accept;
\t\tudp dport 4789 ip saddr @cluster_networks ip daddr != @cluster_networks drop
\t}

\tchain postrouting {
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\tip saddr @cluster_networks ip daddr != @no_masquerade masquerade
\t}
}
table bridge podnet {
\tset pod_ports {
\t\ttype ifname . ether_addr . ipv4_addr
\t\telements = { "PORT3",
\t\t\t     "PORT2" }
\t}

\tchain prerouting {
\t\ttype filter hook prerouting priority filter; policy accept;
\t\tiifname "pn*" jump from_pod
\t}

\tchain from_pod {
\t\tiifname . ether saddr . ip saddr @pod_ports accept
\t\tARP_RULE
\t\tdrop
\t}
}
"""


ARP_RULE = (
    "iifname . ether saddr . arp saddr ip @pod_ports "
    "iifname . arp saddr ether . arp saddr ip @pod_ports accept"
)


def listed() -> dict[str, str]:
    text = (
        LISTED.replace("ARP_RULE", ARP_RULE)
        .replace('"PORT3"', port(3).element())
        .replace('"PORT2"', port(2).element())
    )
    return nftables.split_tables(text)


def test_the_rendered_ruleset_is_what_nft_lists() -> None:
    tables = listed()
    assert set(tables) == {"ip other", "inet podnet", "bridge podnet"}
    rendered = render_ruleset(node(), [port(2), port(3)], "eth0", PEERS)
    for key, text in rendered.tables().items():
        assert nftables.table_problems(key, text, tables[key]) == []


def test_table_problems_name_what_differs() -> None:
    tables = listed()
    rendered = render_ruleset(node(), [port(2), port(4)], "eth0", PEERS).tables()
    problems = nftables.table_problems(
        "bridge podnet", rendered["bridge podnet"], tables["bridge podnet"]
    )
    assert len(problems) == 2
    assert "lacks" in problems[0] and port(4).element() in problems[0]
    assert "stale" in problems[1] and port(3).element() in problems[1]
    other = render_ruleset(node(vxlan_port=8472), [], "eth0", PEERS).tables()["inet podnet"]
    assert nftables.table_problems("inet podnet", other, tables["inet podnet"]) == [
        "nft table inet podnet differs from the rendered ruleset"
    ]
    assert nftables.table_problems("inet podnet", other, None) == [
        "nft table inet podnet is missing"
    ]


def test_table_view_ignores_layout_counters_and_element_order() -> None:
    a = "table t x {\n\tchain c {\n\t\tcounter packets 5 bytes 300 drop\n\t}\n}\n"
    b = "table t x {\n  chain c {\n    counter packets 0 bytes 0 drop\n  }\n}\n"
    assert nftables.table_view(a) == nftables.table_view(b)


def test_host_gw_has_no_vxlan_rules_and_nat_skips_cluster_and_services() -> None:
    text = render_ruleset(node("host-gw"), [], "eth0", PEERS).inet
    assert "vtep_peers" not in text and "notrack" not in text
    assert "ip saddr @cluster_networks udp dport 4789 drop" in text, "pods kept off the port"
    assert "ip saddr @cluster_networks ip daddr != @no_masquerade masquerade" in text
    assert "elements = { 10.128.0.0/14,\n\t\t\t     172.30.0.0/16 }" in text


def test_adjacent_cluster_networks_are_merged() -> None:
    nets = (IPv4Network("10.130.0.0/15"), IPv4Network("10.128.0.0/15"))
    text = render_ruleset(node(cluster_networks=nets), [], "eth0").inet
    assert "elements = { 10.128.0.0/14 }" in text


def test_an_empty_pod_set_has_no_elements_line() -> None:
    assert "elements" not in render_ruleset(node(), [], "eth0").bridge


def test_elements_parse_back_and_encode_for_the_kernel() -> None:
    p = port(2)
    assert nftables.parse_element(p.element()) == p
    assert nftables.parse_element("garbage") is None
    key = nftables.element_key(p)
    assert len(key) == 16 + 8 + 4
    assert key[:16] == p.host_ifname.encode().ljust(16, b"\0")
    assert key[16:24] == bytes.fromhex("0a580a800002") + b"\0\0"
    assert key[24:] == IP("10.128.0.2").packed


def test_pod_ports_script_is_one_transaction_of_deletes_then_adds() -> None:
    script = nftables.pod_ports_script([port(2)], [port(3)])
    lines = script.splitlines()
    assert lines[0].startswith("delete element bridge podnet pod_ports {")
    assert port(3).element() in lines[0]
    assert lines[1] == f"add element bridge podnet pod_ports {{ {port(2).element()} }}"


def test_vtep_peers_are_the_fdb_destinations_in_podnet_s_scheme() -> None:
    ours = FdbEntry(vtep_mac(PEER), PEER, "vxlan0")
    foreign = FdbEntry("02:00:00:00:00:01", IP("203.0.113.99"), "vxlan0")
    assert desired.vtep_peers([ours, foreign]) == {VtepPeer(PEER)}
    # the MAC is the one of podnet's permanent neighbour entry on the underlay
    neighbour = NeighEntry(PEER, PEER_MAC.upper(), "eth0")
    assert desired.vtep_peers([ours, foreign], [neighbour]) == set(PEERS)


def test_repair_script_edits_only_dynamic_sets_when_the_rules_match() -> None:
    tables = listed()
    other = [VtepPeer(IP("203.0.113.13"))]  # no MAC: accepted by address alone
    want = render_ruleset(node(), [port(2), port(3)], "eth0", other).tables()
    script = nftables.repair_script(want, tables)
    assert script.splitlines() == [
        "delete element inet podnet vtep_peers { 203.0.113.12 }",
        "add element inet podnet vtep_peers { 203.0.113.13 }",
        f"delete element inet podnet vtep_macs {{ 203.0.113.12 . {PEER_MAC} }}",
        "add element inet podnet vtep_ip_only { 203.0.113.13 }",
    ]
    assert nftables.vtep_peers_in(want["inet podnet"]) == set(other)
    assert nftables.vtep_peers_in(tables["inet podnet"]) == set(PEERS)
    same = render_ruleset(node(), [port(2), port(3)], "eth0", PEERS).tables()
    assert nftables.repair_script(same, tables) == ""
    moved = render_ruleset(node(), [port(2), port(3)], "eth1", PEERS).tables()
    script = nftables.repair_script(moved, tables)
    assert script.startswith("table inet podnet\ndelete table inet podnet\n")
    assert "bridge" not in script, "the bridge table matches: left alone"
    missing = nftables.repair_script(same, {})
    assert missing.count("delete table") == 2
