"""Fail closed (issue 19): a pod-network address with no live owner is allowed nothing.

Properties over random clusters (pods on two nodes, namespaces, VNIDs, policies) and
random *unknown* addresses, checked on ``evaluate`` (what ``podnet trace`` prints) and on
the nftables rendering (the guard first in every base chain, over exactly the owned
addresses). The kernel half is ``tests/integration/test_dataplane_policy.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podnet.dataplane.linux.policytable import PolicyRenderer, address_runs
from podnet.model.network import MULTITENANT, NETWORKPOLICY, SUBNET
from podnet.policy.compile import cluster_pod_networks, compile_rules
from podnet.policy.evaluate import evaluate

Obj = dict[str, Any]
CLUSTER = IPv4Network("10.128.0.0/14")
SUBNETS = {"node-1": IPv4Network("10.128.0.0/23"), "node-2": IPv4Network("10.128.2.0/23")}
NODE_IPS = {"node-1": "192.168.50.11", "node-2": "192.168.50.12"}
OUTSIDE = IPv4Address("8.8.8.8")
NAMESPACES = ("x", "y", "z")
DENY_ALL = {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
ALLOW_APP = {
    "podSelector": {"matchLabels": {"app": "a"}},
    "ingress": [{"from": [{"namespaceSelector": {}}]}],
    "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}],
}
POLICY_SPECS = (DENY_ALL, ALLOW_APP)


def node_addresses() -> list[tuple[str, str]]:
    return [
        pair
        for node, subnet in SUBNETS.items()
        for pair in ((node, NODE_IPS[node]), (node, str(subnet[1])))
    ]


def pod(ns: str, name: str, node: str, host: int, app: str) -> Obj:
    return {
        "metadata": {"namespace": ns, "name": name, "labels": {"app": app}},
        "spec": {"nodeName": node},
        "status": {"phase": "Running", "podIP": str(SUBNETS[node][host])},
    }


@st.composite
def clusters(draw: st.DrawFn) -> tuple[str, list[Obj], list[Obj], list[Obj], list[IPv4Address]]:
    """(plugin, pods, netnamespaces, policies, unknown addresses)."""
    plugin = draw(st.sampled_from([MULTITENANT, NETWORKPOLICY]))
    hosts = draw(st.lists(st.integers(2, 40), min_size=1, max_size=8, unique=True))
    pods = [
        pod(
            draw(st.sampled_from(NAMESPACES)),
            f"p{host}",
            draw(st.sampled_from(sorted(SUBNETS))),
            host,
            draw(st.sampled_from(["a", "b"])),
        )
        for host in hosts
    ]
    netnamespaces = [
        {"netname": ns, "netid": draw(st.sampled_from([0, 10, 11]))}
        for ns in NAMESPACES
        if draw(st.booleans()) or ns != "z"  # z may have no VNID yet
    ]
    chosen = draw(
        st.lists(st.tuples(st.sampled_from(NAMESPACES), st.sampled_from([0, 1])), max_size=3)
    )
    policies = [
        {"metadata": {"namespace": ns, "name": f"p{i}"}, "spec": POLICY_SPECS[which]}
        for i, (ns, which) in enumerate(chosen)
    ]
    taken = {IPv4Address(p["status"]["podIP"]) for p in pods}
    in_subnets = st.builds(
        lambda node, host: SUBNETS[node][host],
        st.sampled_from(sorted(SUBNETS)),
        st.integers(2, 500),
    )
    elsewhere = st.builds(lambda n: CLUSTER[n], st.integers(4096, CLUSTER.num_addresses - 2))
    unknown = draw(st.lists(st.one_of(in_subnets, elsewhere), min_size=1, max_size=4))
    return plugin, pods, netnamespaces, policies, [ip for ip in unknown if ip not in taken]


def compiled(
    plugin: str, pods: list[Obj], netns: list[Obj], policies: list[Obj], nets: Any = (CLUSTER,)
) -> Any:
    namespaces = [{"metadata": {"name": n}} for n in NAMESPACES]
    return compile_rules(
        plugin, pods, namespaces, netns, policies,
        node_ips=list(NODE_IPS.values()), node_addresses=node_addresses(), pod_networks=nets,
    )  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(cluster=clusters())
def test_no_packet_from_or_to_an_unowned_address_is_allowed(cluster: Any) -> None:
    plugin, pods, netns, policies, unknown = cluster
    rules = compiled(plugin, pods, netns, policies)
    owned = [IPv4Address(p["status"]["podIP"]) for p in pods]
    gateways = [subnet[1] for subnet in SUBNETS.values()]
    others = [*owned, *gateways, OUTSIDE, IPv4Address(NODE_IPS["node-1"]), *unknown]
    for u in unknown:
        assert rules.unowned(u)
        for other in others:
            if other == u:
                continue
            for src, dst in ((u, other), (other, u)):
                verdict = evaluate(rules, src, dst, "TCP", 80)
                assert not verdict.allowed, (src, dst, verdict.reasons)
                assert "no running pod or node owns it" in verdict.denied_because


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(cluster=clusters())
def test_failing_closed_changes_nothing_between_owners(cluster: Any) -> None:
    """Pods, gateways and the outside keep the verdicts they had without the guard, and
    the nodes are positively global: a gateway reaches every pod of its node."""
    plugin, pods, netns, policies, _ = cluster
    closed = compiled(plugin, pods, netns, policies)
    open_ = compiled(plugin, pods, netns, policies, nets=())
    assert closed.fails_closed and not open_.fails_closed
    ends = [IPv4Address(p["status"]["podIP"]) for p in pods] + [SUBNETS["node-1"][1], OUTSIDE]
    for src in ends:
        for dst in ends:
            assert evaluate(closed, src, dst).allowed == evaluate(open_, src, dst).allowed
    if plugin == MULTITENANT:
        for p in pods:
            gateway = SUBNETS[p["spec"]["nodeName"]][1]
            assert evaluate(closed, gateway, p["status"]["podIP"]).allowed


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(cluster=clusters())
def test_every_base_chain_starts_with_the_guard_over_the_owned_addresses(cluster: Any) -> None:
    plugin, pods, netns, policies, _ = cluster
    rules = compiled(plugin, pods, netns, policies)
    table = PolicyRenderer("node-1").render(rules)
    base = [c for c in table.chains.values() if c.hook is not None]
    assert {c.name for c in base} >= {"input", "output"} and len(base) == 3
    hooks = {c.hook.split(" hook ")[1].split()[0] for c in base if c.hook}
    assert hooks == {"forward", "input", "output"}
    for chain in base:
        guard = [r for r in chain.rules if r.endswith(" drop") and "!= @" in r]
        assert guard and chain.rules[: len(guard)] == tuple(guard), chain
        for rule in guard:
            words = rule.split()
            networks, owned = table.sets[words[2][1:]], table.sets[words[6][1:]]
            assert networks.interval and networks.elements == (str(CLUSTER),)
            assert owned.interval and _expanded(owned.elements) == set(rules.owned)
    assert rules.owned >= {SUBNETS["node-1"][1], SUBNETS["node-2"][1]}


def _expanded(elements: Iterable[str]) -> set[IPv4Address]:
    """The addresses of interval elements (``a`` or ``a-b``)."""
    found: set[IPv4Address] = set()
    for element in elements:
        first, _, last = element.partition("-")
        found |= {
            IPv4Address(n)
            for n in range(int(IPv4Address(first)), int(IPv4Address(last or first)) + 1)
        }
    return found


@given(st.sets(st.integers(0, 300), max_size=60))
def test_address_runs_hold_exactly_the_addresses(offsets: set[int]) -> None:
    addresses = {IPv4Address("10.128.0.0") + n for n in offsets}
    runs = address_runs(addresses)
    assert _expanded(runs) == addresses
    assert len(runs) == len({n for n in offsets if n - 1 not in offsets})  # one per run


def test_subnet_mode_and_unknown_pod_networks_do_not_fail_closed() -> None:
    pods = [pod("x", "a", "node-1", 2, "a")]
    flat = compiled(SUBNET, pods, [], [])
    assert not flat.fails_closed and PolicyRenderer("node-1").render(flat).empty
    unknown = SUBNETS["node-1"][9]
    assert evaluate(flat, unknown, SUBNETS["node-1"][2]).allowed
    assert not compiled(MULTITENANT, pods, [], [], nets=()).unowned(unknown)


def test_networkpolicy_without_policies_still_renders_the_guard() -> None:
    rules = compiled(NETWORKPOLICY, [pod("x", "a", "node-1", 2, "a")], [], [])
    table = PolicyRenderer("node-1").render(rules)
    assert not table.empty and not rules.policies
    forward = table.chains["forward"].rules
    assert forward[0].startswith("ip saddr @") and forward[1].startswith("ip daddr @")


def test_a_replaced_cluster_network_moves_the_guard() -> None:
    rules = compiled(MULTITENANT, [pod("x", "a", "node-1", 2, "a")], [], [])
    wider = replace(rules, pod_networks=(IPv4Network("10.128.0.0/9"),))
    outside_old = IPv4Address("10.200.0.5")
    assert not rules.unowned(outside_old) and wider.unowned(outside_old)


def test_the_cluster_network_object_gives_the_pod_networks() -> None:
    network = {
        "clusterNetworks": [{"CIDR": "10.128.0.0/14"}, {"CIDR": "bad"}, {"CIDR": "10.200.0.0/16"}],
        "network": "10.128.0.0/14",
    }
    assert cluster_pod_networks(network) == ["10.128.0.0/14", "10.200.0.0/16"]
    assert cluster_pod_networks({}) == []
