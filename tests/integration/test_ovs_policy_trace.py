"""OVS's own verdict (``ofproto/trace``) equals ``podnet.policy.evaluate``'s, per packet.

Two nodes, each a private OVS in a project namespace (``podnet.testing.ovsnode``: unique
names, removed also on failure) with br0, vxlan0 (ofport 1), tun0 (2) and three pods on
internal ports 3-5. Each bridge gets the pipeline's flows (``pipeline.desired``) with
tables 21 and 80 from ``policyflows``. Hypothesis draws clusters (labels, namespaces,
named container ports) and NetworkPolicies (pod and namespace selectors, ipBlocks with
excepts, port ranges, named ports, ingress and egress) or multitenant VNIDs (joined,
isolated, global, unassigned); ``compile_rules`` compiles them, and for every source
(the pods, the node, an outside address), destination (the pods, an outside address),
protocol and port, ``oftrace.ovs_verdict`` (traced on the source node, and again on the
destination node after vxlan0) must agree with ``evaluate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podnet.dataplane.interface import NodeNetwork, RemoteNode, pod_mac
from podnet.dataplane.ovs import pipeline
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.daemons import binary
from podnet.dataplane.ovs.flow import flows_text
from podnet.dataplane.ovs.oftrace import TracedNode, ovs_verdict
from podnet.model.network import MULTITENANT, NETWORKPOLICY
from podnet.policy.compile import compile_rules
from podnet.policy.evaluate import evaluate
from podnet.policy.model import RuleSet
from podnet.testing.ovsnode import OvsNode, ovs_node

pytestmark = [pytest.mark.root]

Obj = dict[str, Any]
CLUSTER = IPv4Network("10.128.0.0/14")
SERVICES = IPv4Network("172.30.0.0/16")
NODES = {"node-1": (IPv4Address("10.0.1.1"), IPv4Network("10.128.0.0/24")),
         "node-2": (IPv4Address("10.0.1.2"), IPv4Network("10.128.1.0/24"))}  # fmt: skip
PODS = [(node, IPv4Address(f"{subnet.network_address + 10 + i}"), 3 + i)
        for node, (_, subnet) in NODES.items() for i in range(3)]  # fmt: skip
OUTSIDE = IPv4Address("192.168.5.5")
PROBES = [("TCP", 80), ("TCP", 81), ("TCP", 8080), ("UDP", 53), ("UDP", 80), ("SCTP", 80),
          ("ICMP", None)]  # fmt: skip
NAMED = [("http", 8080, "TCP"), ("web", 80, "TCP"), ("dns", 53, "UDP"), ("alt", 81, "TCP"),
         ("web", 80, "SCTP")]  # fmt: skip
BLOCKS = [{"cidr": "10.128.0.0/16", "except": ["10.128.0.11/32"]}, {"cidr": "10.128.1.0/24"},
          {"cidr": "192.168.5.0/24"},
          {"cidr": "0.0.0.0/0", "except": ["10.128.0.0/24"]}]  # fmt: skip


# --- the two nodes --------------------------------------------------------------------------


def node_network(name: str) -> NodeNetwork:
    node_ip, subnet = NODES[name]
    return NodeNetwork(name, node_ip, subnet, (CLUSTER,), SERVICES, 1450, isolation=True)


def local_pods(name: str) -> list[pipeline.LocalPod]:
    return [
        pipeline.LocalPod(f"pod-{ip}", ofport, ip, pod_mac(ip))
        for node, ip, ofport in PODS
        if node == name
    ]


def node_flows(name: str, rules: RuleSet) -> str:
    """Node ``name``'s flows: the pipeline's, with tables 21 and 80 from policyflows."""
    remotes = [RemoteNode(n, ip, subnet) for n, (ip, subnet) in NODES.items() if n != name]
    groups = pipeline.desired(node_network(name), remotes, local_pods(name), rules)
    flows = [f for group in groups.values() for f in group]
    return flows_text(flows)


@dataclass
class Cluster:
    loop: asyncio.AbstractEventLoop
    nodes: dict[str, OvsNode]

    def traced(self) -> list[TracedNode]:
        return [
            TracedNode(name, node.runner, NODES[name][0],
                       {p.ip: (p.ofport, p.mac) for p in local_pods(name)})
            for name, node in self.nodes.items()
        ]  # fmt: skip

    def disagreements(self, rules: RuleSet) -> list[str]:
        return self.loop.run_until_complete(self._disagreements(rules))

    async def _disagreements(self, rules: RuleSet) -> list[str]:
        for name, node in self.nodes.items():
            text = node_flows(name, rules)
            await node.runner.replace_flows(t.BRIDGE, text)
            assert read_back_differs(node, text) == "", "the switch reads flows back otherwise"
        traced, vnids = self.traced(), pipeline.vnids_of(rules)
        pods = [ip for _, ip, _ in PODS]
        wrong = []
        for src in [*pods, NODES["node-1"][0], OUTSIDE]:
            for dst in [*pods, OUTSIDE]:
                if src == dst or (src not in pods and (dst not in pods or dst.packed[2] != 0)):
                    continue  # only pods' packets, and the host's to its own node's pods
                for protocol, port in PROBES:
                    tun_id = pipeline.register_vnid(vnids, src)
                    have = await ovs_verdict(traced, src, dst, protocol, port, tun_id)
                    want = evaluate(rules, src, dst, protocol, port)
                    if have.allowed != want.allowed:
                        steps = [f"{n}: {s}" for n, tr in have.traces for s in tr.steps]
                        wrong.append(f"{src}->{dst} {protocol}/{port}: ovs {have.allowed}, "
                                     f"evaluate {want.allowed} ({want.reasons})\n  "
                                     + "\n  ".join(steps))  # fmt: skip
        return wrong


def read_back_differs(node: OvsNode, text: str) -> str:
    """What ``ovs-ofctl diff-flows`` finds between the bridge and ``text`` ("": nothing;
    a flow written in a form the switch shows otherwise would be rewritten every sync)."""
    with tempfile.NamedTemporaryFile("w", suffix=".flows") as wanted:
        wanted.write(text)
        wanted.flush()
        argv = [binary("ovs-ofctl"), "-O", "OpenFlow13", "diff-flows", t.BRIDGE, wanted.name]
        done = subprocess.run(argv, capture_output=True, text=True,
                              env=node.daemons.paths.env(), timeout=60)  # fmt: skip
    assert done.returncode in (0, 2), done.stderr  # 2: it found differences
    return done.stdout


@contextlib.contextmanager
def two_nodes() -> Iterator[Cluster]:
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()
    try:
        nodes = {}
        for name in NODES:
            node = loop.run_until_complete(stack.enter_async_context(ovs_node("ovp")))
            vxlan = {"remote_ip": "flow", "key": "flow"}
            run = loop.run_until_complete
            run(node.db.add_port(t.BRIDGE, t.VXLAN, type="vxlan", ofport=t.VXLAN_PORT,
                                 options=vxlan))  # fmt: skip
            run(node.db.add_port(t.BRIDGE, t.TUN, type="internal", ofport=t.TUN_PORT))
            for pod in local_pods(name):
                run(
                    node.db.add_port(t.BRIDGE, f"p{pod.ofport}", type="internal", ofport=pod.ofport)
                )
            nodes[name] = node
        yield Cluster(loop, nodes)
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with two_nodes() as the_cluster:
        yield the_cluster


# --- the random worlds ----------------------------------------------------------------------

names_st = st.sampled_from(["x", "y"])
labels_st = st.fixed_dictionaries({"app": st.sampled_from(["a", "b", "c"])})


@st.composite
def pods_st(draw: st.DrawFn) -> list[Obj]:
    found = []
    for i, (node, ip, _) in enumerate(PODS):
        named = draw(st.lists(st.sampled_from(NAMED), max_size=3, unique_by=lambda n: n[0]))
        ports = [{"name": n, "containerPort": p, "protocol": proto} for n, p, proto in named]
        found.append({
            "metadata": {"namespace": draw(names_st), "name": f"pod{i}", "labels": draw(labels_st)},
            "spec": {"nodeName": node, "containers": [{"name": "c", "ports": ports}]},
            "status": {"phase": "Running", "podIP": str(ip)},
        })  # fmt: skip
    return found


@st.composite
def peer_st(draw: st.DrawFn) -> Obj:
    kind = draw(st.sampled_from(["pod", "namespace", "both", "ipBlock"]))
    if kind == "ipBlock":
        return {"ipBlock": draw(st.sampled_from(BLOCKS))}
    pods = {"podSelector": {"matchLabels": draw(labels_st)}}
    spaces = {"namespaceSelector": {"matchLabels": {"team": draw(names_st)}}}
    return {"pod": pods, "namespace": spaces, "both": {**pods, **spaces}}[kind]


@st.composite
def port_st(draw: st.DrawFn) -> Obj:
    kind = draw(st.sampled_from(["number", "range", "name", "protocol"]))
    found: Obj = {}
    if draw(st.booleans()):
        found["protocol"] = draw(st.sampled_from(["TCP", "UDP", "SCTP"]))
    if kind == "number":
        found["port"] = draw(st.sampled_from([53, 80, 81, 8080]))
    elif kind == "range":
        found["port"] = draw(st.sampled_from([50, 79, 80]))
        found["endPort"] = found["port"] + draw(st.sampled_from([1, 3, 8000]))
    elif kind == "name":
        found["port"] = draw(st.sampled_from([n for n, _, _ in NAMED]))
    return found


@st.composite
def policy_st(draw: st.DrawFn, index: int) -> Obj:
    spec: Obj = {"podSelector": draw(st.sampled_from([{}, {"matchLabels": draw(labels_st)}]))}
    for key, peers in (("ingress", "from"), ("egress", "to")):
        rules = []
        for _ in range(draw(st.integers(0, 2))):
            rule: Obj = {}
            if draw(st.integers(0, 3)):
                rule[peers] = draw(st.lists(peer_st(), min_size=1, max_size=2))
            if draw(st.integers(0, 2)):
                rule["ports"] = draw(st.lists(port_st(), min_size=1, max_size=2))
            rules.append(rule)
        if rules or draw(st.booleans()) is True:  # an empty list: deny all that way
            spec[key] = rules
    types = [name for key, name in (("ingress", "Ingress"), ("egress", "Egress")) if key in spec]
    if types:
        spec["policyTypes"] = types
    return {"metadata": {"namespace": draw(names_st), "name": f"p{index}"}, "spec": spec}


def namespaces() -> list[Obj]:
    return [{"metadata": {"name": n, "labels": {"team": n}}} for n in ("x", "y")]


def node_addresses() -> list[tuple[str, str]]:
    return [(n, str(a)) for n, (ip, subnet) in NODES.items()
            for a in (ip, subnet.network_address + 1)]  # fmt: skip


@st.composite
def network_policy_rules(draw: st.DrawFn) -> RuleSet:
    policies = [draw(policy_st(i)) for i in range(draw(st.integers(1, 3)))]
    return compile_rules(NETWORKPOLICY, draw(pods_st()), namespaces(), [], policies,
                         node_addresses=node_addresses())  # fmt: skip


@st.composite
def multitenant_rules(draw: st.DrawFn) -> RuleSet:
    netids = draw(st.dictionaries(names_st, st.sampled_from([0, 10, 11])))
    netnamespaces = [{"netname": n, "netid": v} for n, v in netids.items()]
    return compile_rules(MULTITENANT, draw(pods_st()), namespaces(), netnamespaces, [],
                         node_addresses=node_addresses())  # fmt: skip


def examples(count: int) -> settings:
    return settings(
        max_examples=count, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )  # fmt: skip


@examples(25)
@given(rules=network_policy_rules())
def test_networkpolicy_verdicts_match_evaluate(cluster: Cluster, rules: RuleSet) -> None:
    wrong = cluster.disagreements(rules)
    assert not wrong, "\n".join(wrong[:10])


@examples(12)
@given(rules=multitenant_rules())
def test_multitenant_verdicts_match_evaluate(cluster: Cluster, rules: RuleSet) -> None:
    wrong = cluster.disagreements(rules)
    assert not wrong, "\n".join(wrong[:10])


def test_the_comparison_sees_a_wrong_flow(cluster: Cluster) -> None:
    """A rule set whose 80 drops a pod gives disagreements: the check can fail."""
    pods = [{"metadata": {"namespace": "x", "name": f"pod{i}", "labels": {"app": "a"}},
             "spec": {"nodeName": node, "containers": []},
             "status": {"phase": "Running", "podIP": str(ip)}}
            for i, (node, ip, _) in enumerate(PODS)]  # fmt: skip
    deny = {"metadata": {"namespace": "x", "name": "deny"}, "spec": {"podSelector": {}}}
    denied = compile_rules(NETWORKPOLICY, pods, namespaces(), [], [deny],
                           node_addresses=node_addresses())  # fmt: skip
    open_ = compile_rules(NETWORKPOLICY, pods, namespaces(), [], [],
                          node_addresses=node_addresses())  # fmt: skip
    assert not cluster.disagreements(denied)
    assert not cluster.disagreements(open_)
    # the bridges hold the open flows; judge them against the denying rule set
    wrong = cluster.loop.run_until_complete(_judged_against(cluster, open_, denied))
    assert wrong


async def _judged_against(cluster: Cluster, installed: RuleSet, judged: RuleSet) -> list[str]:
    traced = cluster.traced()
    src, dst = PODS[0][1], PODS[4][1]
    have = await ovs_verdict(traced, src, dst, "TCP", 80)
    want = evaluate(judged, src, dst, "TCP", 80)
    assert have.allowed == evaluate(installed, src, dst, "TCP", 80).allowed
    return [] if have.allowed == want.allowed else [f"{src}->{dst}"]
