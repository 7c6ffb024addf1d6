"""Fail closed in br0's rendering (pure): who gets a source identity, the quarantine of a
local port whose address has no live owner, the drop of unknown pod-network sources from
the tunnel and from tun0, and a pod's change staying one small bundle."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

from podnet.dataplane.interface import RemoteNode, pod_mac
from podnet.dataplane.ovs import pipeline
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.flowstate import FlowState
from podnet.model.network import MULTITENANT, NETWORKPOLICY, SUBNET
from podnet.policy.compile import compile_rules
from podnet.policy.model import RuleSet
from podnet.testing.nodenetwork import node_network

ONE = node_network("node-1", "198.51.100.11", "10.128.0.0/23")
TWO = node_network("node-2", "198.51.100.12", "10.128.2.0/23")
CLUSTER = IPv4Network("10.128.0.0/14")
LIVE, GLOBAL, ORPHAN = (IPv4Address(f"10.128.0.{i}") for i in (10, 11, 12))
GATEWAY_TWO = IPv4Address("10.128.2.1")


def pod(name: str, namespace: str, ip: IPv4Address, node: str = "node-1") -> dict[str, object]:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"nodeName": node},
        "status": {"phase": "Running", "podIP": str(ip)},
    }


def rules(plugin: str = MULTITENANT, networks: tuple[IPv4Network, ...] = (CLUSTER,)) -> RuleSet:
    """LIVE (project a, VNID 10) and GLOBAL (default, VNID 0) have objects; ORPHAN not."""
    netns = [{"netname": "a", "netid": 10}, {"netname": "default", "netid": 0}]
    addresses = [
        ("node-1", "198.51.100.11"),
        ("node-1", "10.128.0.1"),
        ("node-2", "198.51.100.12"),
        ("node-2", str(GATEWAY_TWO)),
    ]
    return compile_rules(
        plugin,
        [pod("live", "a", LIVE), pod("g", "default", GLOBAL)],
        [],
        netns,
        [],
        node_addresses=addresses,
        pod_networks=networks,
    )


def local(ip: IPv4Address, ofport: int) -> pipeline.LocalPod:
    return pipeline.LocalPod(f"c{ofport}/eth0", ofport, ip, pod_mac(ip))


PODS = [local(LIVE, 3), local(GLOBAL, 4), local(ORPHAN, 5)]
REMOTES = [RemoteNode("node-2", TWO.node_ip, TWO.subnet)]


def flows_of(ruleset: RuleSet) -> list[tuple[int, int, str, str]]:
    groups = pipeline.desired(ONE, REMOTES, PODS, ruleset)
    return [(f.table, f.priority, f.match, f.actions) for g in groups.values() for f in g]


def test_vnid_zero_only_for_global_pods_and_node_addresses() -> None:
    found = pipeline.vnids_of(rules())
    assert found[LIVE] == 10 and found[GLOBAL] == 0
    assert found[GATEWAY_TWO] == 0  # a node's own address in the pod network
    assert ORPHAN not in found
    assert IPv4Address("198.51.100.11") not in found  # outside the pod networks


def test_an_orphan_port_is_quarantined_and_gets_nothing() -> None:
    flows = flows_of(rules())
    mine = [f for f in flows if f"in_port={5}" in f[2] or str(ORPHAN) in f[2]]
    assert mine == [(t.POD_IN, 100, "in_port=5", "drop")]
    live = [f for f in flows if f"nw_dst={LIVE}" in f[2] and f[0] == t.LOCAL]
    assert live, "a live pod is still delivered"


def test_unknown_pod_sources_are_dropped_from_the_tunnel_and_the_host() -> None:
    flows = flows_of(rules())
    assert (t.VXLAN_IN, 120, f"ip,nw_src={CLUSTER}", "drop") in flows
    assert (t.HOST_IN, 50, f"ip,nw_src={CLUSTER}", "drop") in flows
    # above the catch-all of tun_id 0 (100), below the identities (150, 200)
    to_route = f"goto_table:{t.ROUTE}"
    assert (t.VXLAN_IN, 100, "ip,tun_id=0", to_route) in flows
    load0 = f"load:0x0->NXM_NX_REG0[],{to_route}"
    assert (t.VXLAN_IN, 200, f"ip,tun_id=0x0,nw_src={GATEWAY_TWO}", load0) in flows
    assert (t.VXLAN_IN, 200, f"ip,tun_id=0x0,nw_src={GLOBAL}", load0) in flows


def test_networkpolicy_gives_every_owned_address_an_identity_and_no_other() -> None:
    ruleset = rules(NETWORKPOLICY)
    found = pipeline.vnids_of(ruleset)
    assert set(found) == {LIVE, GLOBAL, IPv4Address("10.128.0.1"), GATEWAY_TWO}
    assert set(found.values()) == {0}
    assert (t.POD_IN, 100, "in_port=5", "drop") in flows_of(ruleset)


def test_without_pod_networks_or_in_subnet_mode_nothing_changes() -> None:
    for ruleset in (rules(networks=()), rules(SUBNET)):
        assert not ruleset.fails_closed
        flows = flows_of(ruleset)
        assert (t.POD_IN, 100, "in_port=5", "drop") not in flows
        assert not any(f[2] == f"ip,nw_src={CLUSTER}" for f in flows)


def test_a_pod_object_going_away_is_one_small_bundle() -> None:
    """Deleting ORPHAN's object (it was live) changes its port's group, its identity's
    group and the VNID groups of tables 21/80 at most: nothing else."""
    netns = [{"netname": "a", "netid": 10}, {"netname": "default", "netid": 0}]
    before = compile_rules(
        MULTITENANT,
        [pod("live", "a", LIVE), pod("g", "default", GLOBAL), pod("o", "a", ORPHAN)],
        [],
        netns,
        [],
        pod_networks=[CLUSTER],
    )
    after = compile_rules(
        MULTITENANT,
        [pod("live", "a", LIVE), pod("g", "default", GLOBAL)],
        [],
        netns,
        [],
        pod_networks=[CLUSTER],
    )
    state = FlowState(node=ONE, remotes=REMOTES)
    for p in PODS:
        state.pods[p.key] = p
    state.rules, state.rules_known = before, True
    old = state.groups()
    state.rules = after
    new = state.groups()
    changed = {c for c in old.keys() | new.keys() if old.get(c) != new.get(c)}
    assert changed == {pipeline.pod_cookie(PODS[2].key), pipeline.vnid_cookie(ORPHAN)}
    assert new[pipeline.pod_cookie(PODS[2].key)] == pipeline.quarantine_flows(PODS[2])
