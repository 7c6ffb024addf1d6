"""The compiled rule set grows with pods + policy rules, never with pods x pods; and it
compiles fast enough to follow changes within a second.

OpenShift SDN renders NetworkPolicy as one flow per (source IP, destination IP) pair: a
policy selecting 200 pods and allowing 200 pods costs 40,000 flows. Here the same policy
is one rule over three sets of 200 elements.
"""

from __future__ import annotations

from typing import Any

from podnet.model.network import NETWORKPOLICY
from podnet.policy.compile import compile_rules
from podnet.policy.evaluate import evaluate
from podnet.policy.model import RuleSet

Obj = dict[str, Any]


def make_pod(ns: str, i: int, labels: dict[str, str]) -> Obj:
    ip = f"10.{128 + i // 65536}.{i // 256 % 256}.{i % 256}"
    return {
        "metadata": {"namespace": ns, "name": f"pod-{i}", "labels": labels},
        "spec": {"nodeName": f"node-{i % 10}",
                 "containers": [{"ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip},
    }  # fmt: skip


def allow_policy(name: str, target: Obj, peer: Obj) -> Obj:
    spec = {"podSelector": target, "ingress": [{"from": [{"podSelector": peer}]}]}
    return {"metadata": {"namespace": "app", "name": name}, "spec": spec}


def clients_and_servers(pods: int, policies: int = 1, group: int = 10) -> RuleSet:
    """``pods`` servers and ``pods`` clients; policy k selects every server and allows the
    clients of group k (``group`` clients each), or every client for a single policy."""
    servers = [make_pod("app", i, {"role": "server"}) for i in range(pods)]
    clients = [make_pod("app", pods + i, {"role": "client", "group": str(i // group)})
               for i in range(pods)]  # fmt: skip
    server = {"matchLabels": {"role": "server"}}
    if policies == 1:
        policy_list = [allow_policy("p0", server, {"matchLabels": {"role": "client"}})]
    else:
        policy_list = [allow_policy(f"p{k}", server, {"matchLabels": {"group": str(k)}})
                       for k in range(policies)]  # fmt: skip
    return compile_rules(NETWORKPOLICY, servers + clients, [], [], policy_list)


def openshift_flows(ruleset: RuleSet) -> int:
    """OpenShift SDN's cost for the same rules: one flow per (peer pod, target pod) pair."""
    return sum(len(r.targets) * len(r.peers.pods) for r in ruleset.rules)


def test_200_by_200_is_one_rule_not_40000_flows() -> None:
    ruleset = clients_and_servers(200)
    size = ruleset.size()
    assert openshift_flows(ruleset) == 40_000
    assert len(ruleset.rules) == 1
    assert size.rules == 3  # the accept rule, and one isolation drop per direction
    assert size.set_elements == 400  # servers (targets = ingress-isolated) and clients
    client, server = "10.128.0.200", "10.128.0.10"
    assert evaluate(ruleset, client, server, "TCP", 80).allowed
    assert not evaluate(ruleset, server, "10.128.0.11", "TCP", 80).allowed


def test_growth_is_linear_in_pods() -> None:
    sizes = [clients_and_servers(n).size() for n in (100, 200, 400)]
    assert [s.rules for s in sizes] == [3, 3, 3]
    assert [s.set_elements for s in sizes] == [200, 400, 800]


def test_growth_is_linear_in_policy_rules() -> None:
    rulesets = [clients_and_servers(200, k) for k in (2, 4, 8)]
    assert [r.size().rules for r in rulesets] == [4, 6, 10]
    assert [r.size().set_elements for r in rulesets] == [220, 240, 280]  # 200 + 10 per rule
    assert [openshift_flows(r) for r in rulesets] == [4_000, 8_000, 16_000]


def large_cluster() -> tuple[list[Obj], list[Obj], list[Obj]]:
    """5,000 pods in 50 namespaces, 1,000 policies (20 per namespace) of the usual shapes."""
    pods, namespaces, policies = [], [], []
    for n in range(50):
        ns = f"team-{n}"
        namespaces.append({"metadata": {"name": ns, "labels": {"team": f"t{n % 5}"}}})
        for j in range(100):
            labels = {"app": f"app{j % 20}", "role": ("frontend", "backend", "db")[j % 3]}
            pods.append(make_pod(ns, n * 100 + j, labels))
        policies += [large_policy(ns, k) for k in range(20)]
    return pods, namespaces, policies


def large_policy(ns: str, k: int) -> Obj:
    ingress = [
        {
            "from": [
                {"podSelector": {"matchLabels": {"role": "frontend"}}},
                {
                    "namespaceSelector": {"matchLabels": {"team": f"t{k % 5}"}},
                    "podSelector": {
                        "matchExpressions": [
                            {"key": "app", "operator": "In", "values": [f"app{k}", f"app{k + 1}"]}
                        ]
                    },
                },
            ],
            "ports": [{"port": "http"}, {"port": 443}],
        }
    ]
    egress = [
        {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.128.0.0/14"]}}]},
        {"to": [{"namespaceSelector": {}}], "ports": [{"port": 53, "protocol": "UDP"}]},
    ]
    spec = {
        "podSelector": {"matchLabels": {"app": f"app{k}"}},
        "ingress": ingress,
        "egress": egress,
        "policyTypes": ["Ingress", "Egress"],
    }
    return {"metadata": {"namespace": ns, "name": f"policy-{k}"}, "spec": spec}  # fmt: skip


def test_5000_pods_1000_policies_stay_linear() -> None:
    """The benchmark-sized cluster: rules track policy rules, elements stay far below pairs.

    How long the compile takes is measured by a benchmark, not asserted by a test.
    """
    pods, namespaces, policies = large_cluster()
    ruleset = compile_rules(NETWORKPOLICY, pods, namespaces, [], policies)
    size = ruleset.size()
    assert len(ruleset.rules) == 3_000
    assert size.rules <= 2 * len(ruleset.rules) + 2
    assert size.set_elements < openshift_flows(ruleset) / 100
    assert len(ruleset.ingress_isolated) == 5_000
