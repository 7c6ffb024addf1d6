"""Isolation covers services: a pod reaches a service only where it may reach the
endpoint chosen behind it, in networkpolicy and multitenant mode, on the same node
(DNAT, then routed back out of br0, replies bridged through br_netfilter) and across
nodes.

Pods (``podnet.testing.servicelab``): ``x/a`` and ``y/b`` on node-1, ``y/c`` on node-2
(and ``default/g`` on node-2 for the global project). Each service has one endpoint, so
a verdict through the cluster IP must equal the verdict of ``evaluate`` (what ``podnet
trace`` prints) for the client and that endpoint, and the traffic to the pod IP itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from podnet.model.network import MULTITENANT, NETWORKPOLICY
from podnet.policy.compile import compile_rules
from podnet.policy.evaluate import evaluate
from podnet.policy.model import RuleSet
from podnet.testing.servicelab import PORT, Cluster, outside, service_cluster

pytestmark = [pytest.mark.root]

Obj = dict[str, Any]
PODS = {"x/a": (1, 10), "y/b": (1, 11), "y/c": (2, 10), "default/g": (2, 11)}
SERVICE_HOST = {"x/a": 20, "y/b": 21, "y/c": 22, "default/g": 23}  # cluster IP per endpoint


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with service_cluster("psvi", PODS, isolation=True) as the_cluster:
        await the_cluster.apply(*services(the_cluster))
        yield the_cluster


def services(cluster: Cluster) -> list[Any]:
    """One service per pod, in the pod's namespace, with that pod as its endpoint."""
    return [
        cluster.service(f"to-{key.split('/')[1]}", SERVICE_HOST[key], key, namespace=ns)
        for key in PODS
        for ns in [key.split("/")[0]]
    ]


def pod_objects(cluster: Cluster) -> list[Obj]:
    found = []
    for key, (node, _) in PODS.items():
        ns, name = key.split("/")
        found.append(
            {
                "metadata": {"namespace": ns, "name": name, "labels": {"pod": name}},
                "spec": {"nodeName": f"node-{node}", "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "podIP": str(cluster.ip_of[key])},
            }
        )
    return found


def namespaces() -> list[Obj]:
    return [{"metadata": {"name": n, "labels": {"ns": n}}} for n in ("x", "y", "default")]


async def enforce(cluster: Cluster, rules: RuleSet) -> None:
    for i, plane in cluster.planes.items():
        await plane.sync_policy(cluster.lab.network(i, isolation=True), rules)


async def enforce_multitenant(cluster: Cluster) -> RuleSet:
    """Projects x (VNID 10) and y (11) isolated, default (VNID 0) global, on every node."""
    netnamespaces = [
        {"metadata": {"name": "x"}, "netname": "x", "netid": 10},
        {"metadata": {"name": "y"}, "netname": "y", "netid": 11},
        {"metadata": {"name": "default"}, "netname": "default", "netid": 0},
    ]
    rules = compile_rules(MULTITENANT, pod_objects(cluster), namespaces(), netnamespaces, [])
    await enforce(cluster, rules)
    return rules


def verdicts(cluster: Cluster, rules: RuleSet) -> dict[tuple[str, str], tuple[bool, bool, bool]]:
    """(client, endpoint) -> (through the cluster IP, to the pod IP, what evaluate says)."""
    found = {}
    for client in PODS:
        for endpoint, host in SERVICE_HOST.items():
            if client == endpoint:
                continue
            vip = cluster.lab.network(1).service_network.network_address + host
            ns = cluster.netns_of[client]
            by_service = cluster.client(ns, vip).by_pod() == {endpoint: 1}
            by_ip = cluster.client(ns, cluster.ip_of[endpoint], PORT).by_pod() == {endpoint: 1}
            allowed = evaluate(rules, cluster.ip_of[client], cluster.ip_of[endpoint], "TCP", PORT)
            found[(client, endpoint)] = (by_service, by_ip, allowed.allowed)
    return found


def assert_agree(found: dict[tuple[str, str], tuple[bool, bool, bool]]) -> None:
    wrong = [f"{pair}: {seen}" for pair, seen in found.items() if len(set(seen)) != 1]
    assert not wrong, "service / pod IP / trace disagree:\n" + "\n".join(wrong)


async def test_network_policy_applies_to_the_endpoint_behind_a_cluster_ip(
    cluster: Cluster,
) -> None:
    only_from_c = {
        "metadata": {"namespace": "x", "name": "from-c"},
        "spec": {
            "podSelector": {},
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {"ns": "y"}},
                            "podSelector": {"matchLabels": {"pod": "c"}},
                        }
                    ]
                }
            ],
        },
    }
    rules = compile_rules(NETWORKPOLICY, pod_objects(cluster), namespaces(), [], [only_from_c])
    await enforce(cluster, rules)
    found = verdicts(cluster, rules)
    assert_agree(found)
    assert found[("y/b", "x/a")] == (False, False, False)  # same node: denied
    assert found[("y/c", "x/a")] == (True, True, True)  # other node: allowed
    assert found[("x/a", "y/b")] == (True, True, True)  # same node, DNAT, bridged reply
    own = cluster.lab.network(1).service_network.network_address + SERVICE_HOST["x/a"]
    assert cluster.client(cluster.netns_of["x/a"], own).by_pod() == {"x/a": 1}  # hairpin


async def test_multitenant_pods_reach_only_their_projects_and_global_services(
    cluster: Cluster,
) -> None:
    rules = await enforce_multitenant(cluster)
    found = verdicts(cluster, rules)
    assert_agree(found)
    assert found[("x/a", "y/b")][0] is False  # another project's service, same node
    assert found[("x/a", "y/c")][0] is False  # and on the other node
    assert found[("y/b", "y/c")][0] is True  # its own project's
    assert found[("x/a", "default/g")][0] is True  # VNID 0 is reached by all
    assert found[("default/g", "x/a")][0] is True  # and reaches all


async def test_a_node_port_is_no_way_around_isolation(cluster: Cluster) -> None:
    """x/a (node-1) to node-2's port of a service whose endpoint y/b is back on node-1:
    masqueraded there, it would reach y/b from node-2's address, which every project
    admits. Other nodes' pods get node-2's own endpoints only: none here."""
    await enforce_multitenant(cluster)
    to_b = cluster.service("np-b", 30, "y/b", namespace="y", node_port=30030)
    to_c = cluster.service("np-c", 31, "y/c", namespace="y", node_port=30031)
    await cluster.apply(*services(cluster), to_b, to_c)
    node_2 = cluster.lab.node_ip(2)
    assert cluster.client(cluster.netns_of["x/a"], node_2, 30030).by_pod() == {}
    assert cluster.client(cluster.netns_of["x/a"], node_2, 30031).by_pod() == {}
    assert cluster.client(cluster.netns_of["y/b"], node_2, 30031).by_pod() == {"y/c": 1}
    from_outside = cluster.client(outside(cluster.lab), node_2, 30030)
    assert from_outside.by_pod() == {"y/b": 1}  # the outside still gets every endpoint
