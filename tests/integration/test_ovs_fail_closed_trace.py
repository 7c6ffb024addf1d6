"""Fail closed on OVS, by ``ofproto/trace``: an address without a live owner is allowed
nothing, to or from, on every path (a local port, the tunnel, the host's tun0).

The two nodes of ``test_ovs_policy_trace`` (private OVS instances in project namespaces,
three pod ports each). Hypothesis draws which wired pods still have their Pod object
(the others are orphans: a sandbox whose object is gone), their namespaces, labels,
VNIDs or NetworkPolicies, and the rule set is compiled with the cluster's pod network
(``fails_closed``). Then, for every source (the pods, orphans included, two addresses
nobody holds, the node, an outside address) and destination, OVS's verdict (traced from
the source's port, from vxlan0 with any tun_id, and from tun0 as after a service's DNAT)
must be a deny whenever an end is unowned, and must equal ``evaluate`` for the pods'
own traffic.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_ovs_policy_trace import (
    CLUSTER,
    NODES,
    OUTSIDE,
    PODS,
    Cluster,
    examples,
    labels_st,
    names_st,
    namespaces,
    node_addresses,
    node_flows,
    policy_st,
    two_nodes,
)

from podnet.dataplane.ovs import pipeline
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.oftrace import TracePacket, ovs_verdict, trace
from podnet.model.network import MULTITENANT, NETWORKPOLICY
from podnet.policy.compile import compile_rules
from podnet.policy.evaluate import evaluate
from podnet.policy.model import RuleSet

pytestmark = [pytest.mark.root]

# an address in each node's subnet that no port and no object holds
NOBODY = {name: subnet.network_address + 50 for name, (_, subnet) in NODES.items()}
PROBES = [("TCP", 80), ("UDP", 53)]
TUN_IDS = (0, 10, 11, t.UNASSIGNED_VNID)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with two_nodes() as the_cluster:
        yield the_cluster


@st.composite
def world_st(draw: st.DrawFn) -> list[dict[str, object]]:
    """The Pod objects of the wired pods that still have one (at least one is gone)."""
    alive = draw(st.lists(st.booleans(), min_size=len(PODS), max_size=len(PODS)))
    alive[draw(st.integers(0, len(PODS) - 1))] = False
    return [
        {
            "metadata": {"namespace": draw(names_st), "name": f"pod{i}", "labels": draw(labels_st)},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running", "podIP": str(ip)},
        }
        for i, (node, ip, _) in enumerate(PODS)
        if alive[i]
    ]


def _compile(
    plugin: str,
    pods: list[dict[str, object]],
    nns: list[dict[str, object]],
    policies: list[dict[str, object]],
) -> RuleSet:
    return compile_rules(
        plugin,
        pods,
        namespaces(),
        nns,
        policies,
        node_addresses=node_addresses(),
        pod_networks=[CLUSTER],
    )


@st.composite
def multitenant_rules(draw: st.DrawFn) -> RuleSet:
    netids = draw(st.dictionaries(names_st, st.sampled_from([0, 10, 11])))
    nns = [{"netname": n, "netid": v} for n, v in netids.items()]
    return _compile(MULTITENANT, draw(world_st()), nns, [])


@st.composite
def network_policy_rules(draw: st.DrawFn) -> RuleSet:
    policies = [draw(policy_st(i)) for i in range(draw(st.integers(0, 2)))]
    return _compile(NETWORKPOLICY, draw(world_st()), [], policies)


async def _violations(cluster: Cluster, rules: RuleSet) -> list[str]:
    """Every packet OVS lets through that it must not: any with an unowned end, and,
    for the pods' own traffic, any verdict other than ``evaluate``'s."""
    assert rules.fails_closed
    for name, node in cluster.nodes.items():
        await node.runner.replace_flows(t.BRIDGE, node_flows(name, rules))
    traced, vnids = cluster.traced(), pipeline.vnids_of(rules)
    wired = [ip for _, ip, _ in PODS]
    node_of = {ip: node for node, ip, _ in PODS}
    wrong: list[str] = []
    sources = [*wired, *NOBODY.values(), NODES["node-1"][0], OUTSIDE]
    for src in sources:
        for dst in [*wired, *NOBODY.values(), OUTSIDE]:
            if src == dst or (src not in wired and dst not in wired):
                continue
            for protocol, port in PROBES:
                want = evaluate(rules, src, dst, protocol, port)
                unowned = rules.unowned(src) or rules.unowned(dst)
                assert not (unowned and want.allowed), "evaluate fails closed"
                if src in wired and (dst in wired or dst == OUTSIDE):
                    tun_id = pipeline.register_vnid(vnids, src)
                    have = await ovs_verdict(traced, src, dst, protocol, port, tun_id)
                    if have.allowed != want.allowed:
                        wrong.append(
                            f"{src}->{dst} {protocol}/{port}: port path ovs "
                            f"{have.allowed}, evaluate {want.allowed}"
                        )
                if dst not in wired or not unowned:
                    continue
                # the unowned end, forged where no port checks it: from the tunnel with
                # any tun_id (the other node's address), and from tun0
                home = node_of[dst]
                other = next(n for n in NODES if n != home)
                node = cluster.nodes[home]
                ofport = next(p for n, ip, p in PODS if ip == dst)
                entries = [TracePacket(t.TUN_PORT, src, dst, protocol, port)]
                entries += [
                    TracePacket(
                        t.VXLAN_PORT, src, dst, protocol, port, tun_id=vnid, tun_src=NODES[other][0]
                    )
                    for vnid in TUN_IDS
                    if src in NODES[other][1]  # the remote node's sources only pass CLASSIFY
                ]
                for packet in entries:
                    for ct in ((), ("trk,est",)):
                        found = await trace(node.runner, t.BRIDGE, packet, ct)
                        if ofport in found.output_ports:
                            wrong.append(
                                f"{src}->{dst} {protocol}/{port} in_port="
                                f"{packet.in_port} tun_id={packet.tun_id} ct={ct}: "
                                "delivered to an unowned end"
                            )
    return wrong


def _unowned_sources_into_pods(cluster: Cluster, rules: RuleSet) -> list[str]:
    """Unowned sources (orphans' own addresses and addresses nobody holds) sent to every
    live pod from the tunnel and from tun0: none may reach it."""
    return cluster.loop.run_until_complete(_forged_into_live(cluster, rules))


async def _forged_into_live(cluster: Cluster, rules: RuleSet) -> list[str]:
    wrong = []
    unowned = [ip for ip in [*(ip for _, ip, _ in PODS), *NOBODY.values()] if rules.unowned(ip)]
    for home, dst, ofport in PODS:
        if rules.unowned(dst):
            continue
        other = next(n for n in NODES if n != home)
        node = cluster.nodes[home]
        for src in unowned:
            entries = [TracePacket(t.TUN_PORT, src, dst, "TCP", 80)]
            if src in NODES[other][1]:
                entries += [
                    TracePacket(
                        t.VXLAN_PORT, src, dst, "TCP", 80, tun_id=vnid, tun_src=NODES[other][0]
                    )
                    for vnid in TUN_IDS
                ]
            for packet in entries:
                for ct in ((), ("trk,est",), ("trk,rpl,est",)):
                    found = await trace(node.runner, t.BRIDGE, packet, ct)
                    if ofport in found.output_ports:
                        wrong.append(
                            f"{src}->{dst} in_port={packet.in_port} "
                            f"tun_id={packet.tun_id} ct={ct}: reached a live pod"
                        )
    return wrong


def check(cluster: Cluster, rules: RuleSet) -> None:
    wrong = cluster.loop.run_until_complete(_violations(cluster, rules))
    wrong += _unowned_sources_into_pods(cluster, rules)
    assert not wrong, "\n".join(wrong[:12])


@examples(8)
@given(rules=multitenant_rules())
def test_multitenant_fails_closed_in_openflow(cluster: Cluster, rules: RuleSet) -> None:
    check(cluster, rules)


@examples(8)
@given(rules=network_policy_rules())
def test_networkpolicy_fails_closed_in_openflow(cluster: Cluster, rules: RuleSet) -> None:
    check(cluster, rules)


def test_an_orphan_in_a_global_world_is_still_denied(cluster: Cluster) -> None:
    """Every project global (VNID 0) and one orphan per node: the orphans reach nothing
    and nothing reaches them, while the live pods reach each other (the check can tell)."""
    orphans = {PODS[0][1], PODS[3][1]}
    pods = [
        {
            "metadata": {"namespace": "x", "name": f"pod{i}"},
            "spec": {"nodeName": node},
            "status": {"phase": "Running", "podIP": str(ip)},
        }
        for i, (node, ip, _) in enumerate(PODS)
        if ip not in orphans
    ]
    rules = _compile(MULTITENANT, pods, [{"netname": "x", "netid": 0}], [])
    check(cluster, rules)
    live = [ip for _, ip, _ in PODS if ip not in orphans]
    traced = cluster.traced()
    reached = cluster.loop.run_until_complete(ovs_verdict(traced, live[0], live[-1], "TCP", 80))
    assert reached.allowed, "live global pods across nodes"
    from_orphan = cluster.loop.run_until_complete(
        ovs_verdict(traced, PODS[0][1], live[-1], "TCP", 80)
    )
    assert not from_orphan.allowed
