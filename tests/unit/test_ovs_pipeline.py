"""br0's desired flows (``podnet.dataplane.ovs.pipeline``): deterministic, one cookie per
object, a change to one object changes only its group, counts linear in pods and nodes."""

from __future__ import annotations

import dataclasses
from ipaddress import IPv4Address, IPv4Network

from podnet.dataplane.interface import NodeNetwork, RemoteNode, pod_mac
from podnet.dataplane.ovs import pipeline
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.flow import Flow, Kind, flows_text, kind_of
from podnet.dataplane.ovs.flowstate import FlowState, as_read_back, parse_dump
from podnet.dataplane.ovs.pipeline import Groups, LocalPod
from podnet.model.network import MULTITENANT, SUBNET
from podnet.policy.model import RuleSet, VnidIsolation
from podnet.testing.nodenetwork import node_network

NODE = node_network("node-1", "198.51.100.11", "10.128.0.0/23")
REMOTES = [
    RemoteNode("node-2", IPv4Address("198.51.100.12"), IPv4Network("10.128.2.0/23")),
    RemoteNode("node-3", IPv4Address("198.51.100.13"), IPv4Network("10.128.4.0/23")),
]


def pod(host: int, ofport: int | None = None) -> LocalPod:
    ip = NODE.subnet.network_address + host
    return LocalPod(f"c{host}/eth0", ofport or host, ip, pod_mac(ip))


def multitenant(vnids: dict[str, int], unassigned: tuple[str, ...] = ()) -> RuleSet:
    isolation = VnidIsolation(
        tuple(sorted((IPv4Address(ip), v) for ip, v in vnids.items())),
        frozenset(IPv4Address(ip) for ip in unassigned),
    )
    return RuleSet(MULTITENANT, (), frozenset(), isolation=isolation)


def changed(old: Groups, new: Groups) -> set[int]:
    """The cookies of the pipeline's own groups (not the policy tables' groups, from
    ``policyflows``) whose flows differ between two renderings."""
    cookies = {c for c in old.keys() | new.keys() if old.get(c) != new.get(c)}
    return {c for c in cookies if not policy_group(old.get(c) or new[c])}


def policy_group(flows: list[Flow]) -> bool:
    return all(f.table in (t.EGRESS_POLICY, t.ISOLATION) for f in flows)


def every_flow(groups: Groups) -> list[Flow]:
    return [flow for flows in groups.values() for flow in flows]


def in_table(groups: Groups, table: int) -> list[Flow]:
    return [f for f in every_flow(groups) if f.table == table]


def test_rendering_is_deterministic_whatever_the_input_order() -> None:
    pods = [pod(5), pod(6), pod(7)]
    a = pipeline.desired(NODE, REMOTES, pods, None)
    b = pipeline.desired(NODE, list(reversed(REMOTES)), list(reversed(pods)), None)
    assert a == b
    assert flows_text(every_flow(a)) == flows_text(every_flow(b))


def test_every_flow_carries_its_groups_cookie_and_groups_are_distinct_objects() -> None:
    rules = multitenant({"10.128.0.5": 10, "10.128.2.7": 11})
    groups = pipeline.desired(NODE, REMOTES, [pod(5), pod(6)], rules)
    for group, flows in groups.items():
        assert flows and all(f.cookie == group for f in flows)
    kinds = sorted(kind_of(c) for c in groups)
    assert kinds.count(Kind.NODE) == 1
    assert kinds.count(Kind.REMOTE_NODE) == 2
    assert kinds.count(Kind.POD) == 2
    vnids = {pipeline.vnid_cookie(IPv4Address(ip)) for ip in ("10.128.0.5", "10.128.2.7")}
    assert vnids <= groups.keys(), "one group per pod with a VNID, local or not"
    texts = [f.text() for f in every_flow(groups)]
    assert len(texts) == len(set(texts))


def test_a_pod_change_touches_only_its_group() -> None:
    before = pipeline.desired(NODE, REMOTES, [pod(5), pod(6)], None)
    moved = pipeline.desired(NODE, REMOTES, [pod(5), pod(6, ofport=9)], None)
    assert changed(before, moved) == {pipeline.pod_cookie("c6/eth0")}
    added = pipeline.desired(NODE, REMOTES, [pod(5), pod(6), pod(7)], None)
    assert changed(before, added) == {pipeline.pod_cookie("c7/eth0")}
    removed = pipeline.desired(NODE, REMOTES, [pod(5)], None)
    assert changed(before, removed) == {pipeline.pod_cookie("c6/eth0")}


def test_a_remote_node_change_touches_only_its_group() -> None:
    before = pipeline.desired(NODE, REMOTES, [pod(5)], None)
    moved = RemoteNode("node-3", IPv4Address("198.51.100.33"), REMOTES[1].subnet)
    after = pipeline.desired(NODE, [REMOTES[0], moved], [pod(5)], None)
    assert changed(before, after) == {pipeline.remote_cookie("node-3")}
    # this node itself, and a second claim to a subnet, are left out (as linux does)
    itself = RemoteNode("node-1", NODE.node_ip, NODE.subnet)
    stale = RemoteNode("node-9", IPv4Address("198.51.100.99"), REMOTES[0].subnet)
    assert pipeline.desired(NODE, [*REMOTES, itself, stale], [pod(5)], None) == before


def test_a_project_joining_another_touches_only_its_pods_groups() -> None:
    pods = [pod(5), pod(6)]
    apart = multitenant({"10.128.0.5": 10, "10.128.0.6": 11, "10.128.2.7": 11})
    joined = multitenant({"10.128.0.5": 10, "10.128.0.6": 10, "10.128.2.7": 10})
    moved = changed(
        pipeline.desired(NODE, REMOTES, pods, apart), pipeline.desired(NODE, REMOTES, pods, joined)
    )
    assert moved == {
        pipeline.pod_cookie("c6/eth0"),
        pipeline.vnid_cookie(IPv4Address("10.128.0.6")),
        pipeline.vnid_cookie(IPv4Address("10.128.2.7")),
    }


def test_counts_are_linear_in_pods_nodes_and_vnids() -> None:
    def count(pods: int, remotes: int, vnids: int) -> int:
        local = [pod(10 + k) for k in range(pods)]
        nodes = [
            RemoteNode(f"n{k}", IPv4Address(f"198.51.101.{k}"), IPv4Network(f"10.129.{k}.0/24"))
            for k in range(remotes)
        ]
        rules = multitenant({f"10.130.{k // 250}.{k % 250}": 5 for k in range(vnids)})
        return len(every_flow(pipeline.desired(NODE, nodes, local, rules)))

    base = count(0, 0, 0)
    assert count(10, 0, 0) - base == 10 * 5
    assert count(100, 0, 0) - base == 100 * 5
    assert count(0, 10, 0) - base == 10 * 4
    assert count(0, 0, 100) - base == 100 * 3
    assert count(100, 10, 100) - base == 100 * 5 + 10 * 4 + 100 * 3


def test_pod_flows_check_the_source_and_load_the_vnid() -> None:
    rules = multitenant({"10.128.0.5": 0x2A}, unassigned=("10.128.0.6",))
    groups = pipeline.desired(NODE, [], [pod(5), pod(6), pod(7)], rules)
    pod_in = {f.match: f.actions for f in in_table(groups, t.POD_IN) if f.priority}
    mac5 = pod_mac(IPv4Address("10.128.0.5"))
    ip5 = pod_in[f"ip,in_port=5,dl_src={mac5},nw_src=10.128.0.5"]
    assert ip5 == f"load:0x2a->NXM_NX_REG0[],goto_table:{t.EGRESS_POLICY}"
    arp5 = pod_in[f"arp,in_port=5,dl_src={mac5},arp_spa=10.128.0.5,arp_sha={mac5}"]
    assert arp5.startswith("load:0x2a->NXM_NX_REG0[]")
    unassigned = [a for m, a in pod_in.items() if m.startswith("ip,in_port=6,")]
    assert unassigned == [
        f"load:{t.UNASSIGNED_VNID:#x}->NXM_NX_REG0[],goto_table:{t.EGRESS_POLICY}"
    ]
    unlisted = [a for m, a in pod_in.items() if m.startswith("ip,in_port=7,")]
    assert unlisted == [f"load:0x0->NXM_NX_REG0[],goto_table:{t.EGRESS_POLICY}"]
    assert [f for f in in_table(groups, t.POD_IN) if f.priority == 0] == [
        Flow(t.POD_IN, 0, "", "drop", pipeline.node_cookie())
    ], "anything else from a pod (another MAC or IP) is dropped"
    back = {f.match: f.actions for f in in_table(groups, t.HOST_IN) if f.priority == 150}
    assert (
        back["ip,nw_src=10.128.0.5"] == f"load:0x2a->NXM_NX_REG0[],resubmit(,{t.EGRESS_POLICY})"
    ), "a local pod's packet back from a service's DNAT meets its egress policy again"
    local = {f.match: f.actions for f in in_table(groups, t.LOCAL) if f.priority}
    assert local["ip,nw_dst=10.128.0.5"] == (
        f"load:0x2a->NXM_NX_REG1[],load:0x5->NXM_NX_REG2[],set_field:{mac5}->eth_dst,"
        f"goto_table:{t.ISOLATION}"
    )


def test_the_tunnel_takes_only_known_nodes_and_checks_the_vnid() -> None:
    rules = multitenant({"10.128.2.7": 0x2A}, unassigned=("10.128.2.8",))
    groups = pipeline.desired(NODE, REMOTES, [], rules)
    classify = {f.match: f.actions for f in in_table(groups, t.CLASSIFY)}
    from_two = "in_port=1,tun_src=198.51.100.12"
    assert classify[f"ip,{from_two},nw_src=10.128.2.0/23"] == (
        f"set_field:0a:58:0a:80:00:01->eth_dst,goto_table:{t.VXLAN_IN}"
    ), "readdressed to this node's gateway"
    assert classify["in_port=1"] == "drop", "an unknown sender, or a source off its subnet"
    vxlan_in = {(f.priority, f.match): f.actions for f in in_table(groups, t.VXLAN_IN)}
    assert vxlan_in[(200, "ip,tun_id=0x2a,nw_src=10.128.2.7")].startswith(
        "load:0x2a->NXM_NX_REG0[]"
    )
    assert vxlan_in[(150, "ip,nw_src=10.128.2.7")] == "drop", "another VNID for a known pod"
    assert vxlan_in[(200, "ip,nw_src=10.128.2.8")].startswith(f"load:{t.UNASSIGNED_VNID:#x}->")
    assert vxlan_in[(100, "ip,tun_id=0")] == f"goto_table:{t.ROUTE}", "non-pod sources: VNID 0"
    remote = {f.match: f.actions for f in in_table(groups, t.REMOTE) if f.priority}
    assert remote["ip,nw_dst=10.128.4.0/23"] == (
        "move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:198.51.100.13->tun_dst,output:1"
    )


def test_host_gw_routes_remote_subnets_through_tun0_and_takes_no_tunnel() -> None:
    node = dataclasses.replace(NODE, tunnel="host-gw")
    groups = pipeline.desired(node, REMOTES, [pod(5)], None)
    remote = {f.match: f.actions for f in in_table(groups, t.REMOTE) if f.priority}
    assert remote == {f"ip,nw_dst={r.subnet}": f"output:{t.TUN_PORT}" for r in REMOTES}
    assert not [f for f in every_flow(groups) if "tun_src" in f.match or "tun_dst" in f.actions]


def test_route_sends_the_gateway_services_and_the_outside_to_tun0() -> None:
    groups = pipeline.desired(NODE, REMOTES, [], None)
    route = {f.match: f.actions for f in in_table(groups, t.ROUTE)}
    assert route["ip,nw_dst=10.128.0.1"] == f"output:{t.TUN_PORT}"
    assert route["ip,nw_dst=172.30.0.0/16"] == f"goto_table:{t.SERVICE}"
    assert route["ip,nw_dst=10.128.0.0/23"] == f"goto_table:{t.LOCAL}"
    assert route["ip,nw_dst=10.128.0.0/14"] == f"goto_table:{t.REMOTE}"
    assert route["ip"] == f"goto_table:{t.EGRESS}"
    replies = route[f"ip,ct_state=+trk+rpl,ct_mark={pipeline.VIA_HOST}"]
    assert replies == f"set_field:0a:58:0a:80:00:01->eth_dst,output:{t.TUN_PORT}", (
        "a service's replies go back through the host"
    )
    assert in_table(groups, t.EGRESS) == [Flow(t.EGRESS, 0, "", "output:2", pipeline.node_cookie())]


def test_subnet_mode_has_no_vnid_flows() -> None:
    flat = RuleSet(SUBNET, (), frozenset())
    groups = pipeline.desired(NODE, REMOTES, [pod(5)], flat)
    assert groups == pipeline.desired(NODE, REMOTES, [pod(5)], None)
    assert not [
        c for c, flows in groups.items() if not policy_group(flows) and kind_of(c) == Kind.ISOLATION
    ]


def test_a_changed_network_changes_only_the_node_group() -> None:
    before = pipeline.desired(NODE, [], [pod(5)], None)
    other: NodeNetwork = dataclasses.replace(NODE, service_network=IPv4Network("172.31.0.0/16"))
    assert changed(before, pipeline.desired(other, [], [pod(5)], None)) == {pipeline.node_cookie()}


def test_a_catch_all_flow_is_alone_at_its_priority() -> None:
    """Two flows of one priority that both match a packet leave the choice to OVS: a
    table's default (empty match) must not share its priority with any other flow."""
    rules = multitenant({"10.128.0.5": 0x2A}, unassigned=("10.128.2.8",))
    flows = every_flow(pipeline.desired(NODE, REMOTES, [pod(5), pod(6)], rules))
    for default in (f for f in flows if not f.match):
        same = [f for f in flows if (f.table, f.priority) == (default.table, default.priority)]
        assert same == [default], same


# --- flowstate: what a restarted plane keeps until the agent tells it ---------------------


def test_a_restarted_state_adopts_what_it_was_not_told_yet() -> None:
    rules = multitenant({"10.128.0.5": 10, "10.128.2.7": 10})
    before = FlowState(NODE, list(REMOTES), {p.key: p for p in [pod(5)]}, rules, True)
    on_switch = parse_dump(
        "".join(f" {as_read_back(flow).text().replace(',', ', ', 2)}\n" for flow in before.flows())
    )
    restarted = FlowState(NODE, None, {p.key: p for p in [pod(5), pod(6)]}, adopted=on_switch)
    groups = restarted.groups()
    own = before.groups()
    for kept in (pipeline.remote_cookie("node-2"), pipeline.pod_cookie("c5/eth0")):
        assert groups[kept] == on_switch[kept] and sorted(groups[kept]) == sorted(own[kept])
    assert (
        groups[pipeline.vnid_cookie(IPv4Address("10.128.2.7"))]
        == on_switch[pipeline.vnid_cookie(IPv4Address("10.128.2.7"))]
    ), "the rules' groups are kept as found"
    new_pod = groups[pipeline.pod_cookie("c6/eth0")]
    assert new_pod == pipeline.pod_flows(pod(6), t.UNASSIGNED_VNID), "a new pod meets VNID 0"
    fresh = FlowState(NODE, None, {p.key: p for p in [pod(6)]}).groups()
    assert fresh[pipeline.pod_cookie("c6/eth0")] == pipeline.pod_flows(pod(6), 0), (
        "a new node isolates nothing before its first policy sync, as linux"
    )


def test_flows_are_written_as_the_switch_reads_them_back() -> None:
    one = Flow(80, 50, "ip", "ct(commit,exec(set_field:0x4/0x4->ct_mark)),output:2", 1)
    assert as_read_back(one).actions == "ct(commit,exec(load:0x1->NXM_NX_CT_MARK[2])),output:2"
    two = Flow(80, 50, "ip", "ct(commit,exec(set_field:0x6/0x6->ct_mark))", 1)
    assert as_read_back(two) == two


def test_parts_are_rendered_again_exactly_when_their_inputs_change() -> None:
    rules = multitenant({"10.128.0.5": 10})
    state = FlowState(NODE, list(REMOTES), {p.key: p for p in [pod(5)]}, rules, True)
    first = state.groups()
    assert state.groups() == first
    vnid = pipeline.vnid_cookie(IPv4Address("10.128.0.5"))
    assert state.groups()[vnid] is first[vnid], "the same rule set: not rendered again"
    state.rules = multitenant({"10.128.0.5": 11})  # another rule set: rendered again
    assert state.groups()[vnid] != first[vnid]
    state.pods[pod(6).key] = pod(6)
    assert pipeline.pod_cookie(pod(6).key) in state.groups()
    state.remotes = [REMOTES[0]]
    assert pipeline.remote_cookie("node-3") not in state.groups()
