"""The shape of the compiled rule set: what a backend is handed, and how trace explains it."""

from __future__ import annotations

import random
from ipaddress import IPv4Address, IPv4Network
from itertools import pairwise
from typing import Any

import pytest

from podnet.model.network import NETWORKPOLICY
from podnet.policy.compile import compile_rules
from podnet.policy.evaluate import evaluate
from podnet.policy.explain import render_verdict
from podnet.policy.model import NamedPort, PortRange, RuleSet
from podnet.policy.ranges import merge, subtract

Obj = dict[str, Any]


def pod(ns: str, name: str, ip: str | None, **extra: Any) -> Obj:
    ports = [{"name": "http", "containerPort": 8080}, {"name": "dns", "containerPort": 53,
                                                       "protocol": "UDP"}]  # fmt: skip
    return {
        "metadata": {"namespace": ns, "name": name, "labels": {"app": name}},
        "spec": {"nodeName": "node-1", "containers": [{"ports": ports}], **extra},
        "status": {"phase": extra.pop("phase", "Running"), **({"podIP": ip} if ip else {})},
    }


PODS = [pod("x", "web", "10.128.0.10"), pod("x", "db", "10.128.0.11"),
        pod("y", "cli", "10.128.1.10")]  # fmt: skip


def compile_one(spec: Obj, pods: list[Obj] = PODS) -> RuleSet:
    policy = {"metadata": {"namespace": "x", "name": "p"}, "spec": spec}
    return compile_rules(NETWORKPOLICY, pods, [], [], [policy])


def test_skipped_pods_and_host_network() -> None:
    pods = [
        *PODS,
        pod("x", "pending", "10.128.0.20", phase="Pending"),
        pod("x", "no-ip", None),
        pod("x", "host", "10.0.0.5", hostNetwork=True),
    ]
    ruleset = compile_rules(NETWORKPOLICY, pods, [], [], [], node_ips=["10.0.0.1"])
    assert [e.key for e in ruleset.endpoints] == ["x/web", "x/db", "y/cli"]
    assert ruleset.host_ips == {IPv4Address("10.0.0.5"), IPv4Address("10.0.0.1")}
    assert evaluate(ruleset, "10.0.0.5", "10.128.0.10").src == "host 10.0.0.5"
    assert evaluate(ruleset, "8.8.8.8", "10.128.0.10").src == "external 8.8.8.8"


def test_rule_ids_targets_and_isolation() -> None:
    ruleset = compile_one({
        "podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}, {}],
        "egress": [{"to": [{"namespaceSelector": {}}]}],
    })  # fmt: skip
    assert [r.id for r in ruleset.rules] == ["x/p/ingress/0", "x/p/ingress/1", "x/p/egress/0"]
    db, web, cli = (IPv4Address(a) for a in ("10.128.0.11", "10.128.0.10", "10.128.1.10"))
    assert all(r.targets == {db} for r in ruleset.rules)
    assert ruleset.rules[0].peers.pods == {web}
    assert ruleset.rules[1].peers.every_address and ruleset.rules[1].ports.every_packet
    assert ruleset.rules[2].peers.pods == {web, db, cli}
    assert ruleset.ingress_isolated == ruleset.egress_isolated == {db}


def test_ip_blocks_become_non_overlapping_networks() -> None:
    ruleset = compile_one({"podSelector": {}, "ingress": [{"from": [
        {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24", "10.0.4.0/22"]}},
        {"ipBlock": {"cidr": "10.0.4.0/24"}},
        {"ipBlock": {"cidr": "10.0.0.0/24"}},
        {"ipBlock": {"cidr": "fd00::/8"}},
    ]}]})  # fmt: skip
    blocks = ruleset.rules[0].peers.blocks
    assert [str(b) for b in blocks] == [
        "10.0.0.0/24", "10.0.2.0/23", "10.0.4.0/24", "10.0.8.0/21", "10.0.16.0/20",
        "10.0.32.0/19", "10.0.64.0/18", "10.0.128.0/17",
    ]  # fmt: skip
    assert all(not a.overlaps(b) for a, b in pairwise(blocks))
    assert not any(b.overlaps(IPv4Network("10.0.1.0/24")) for b in blocks)


def test_interval_arithmetic() -> None:
    assert merge([(5, 9), (1, 3), (4, 4), (20, 30), (25, 26)]) == [(1, 9), (20, 30)]
    assert subtract((0, 100), [(10, 19), (15, 30), (100, 200)]) == [(0, 9), (31, 99)]
    assert subtract((5, 6), [(0, 10)]) == []


def test_ports_merge_per_protocol_and_named_ports_resolve_per_pod() -> None:
    ruleset = compile_one({"podSelector": {}, "ingress": [{"ports": [
        {"port": 80, "endPort": 81}, {"port": 81, "endPort": 85}, {"port": 86},
        {"protocol": "UDP"}, {"port": "http"}, {"port": "dns", "protocol": "UDP"},
    ]}]})  # fmt: skip
    ports = ruleset.rules[0].ports
    assert ports.ranges == (PortRange("TCP", 80, 86), PortRange("UDP", 0, 65535))
    x_pods = [IPv4Address("10.128.0.10"), IPv4Address("10.128.0.11")]  # the targets only
    assert ports.named == {
        *(NamedPort(ip, "TCP", 8080, "http") for ip in x_pods),
        *(NamedPort(ip, "UDP", 53, "dns") for ip in x_pods),
    }
    assert ruleset.size().rules == 2 + 2


@pytest.mark.parametrize("seed", range(5))
def test_fingerprint_ignores_input_order(seed: int) -> None:
    policies = [
        {"metadata": {"namespace": "x", "name": f"p{i}"},
         "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                  "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                               "ports": [{"port": "http"}, {"port": 90 + i}]}]}}
        for i in range(4)
    ]  # fmt: skip
    fresh = compile_rules(NETWORKPOLICY, PODS, [], [], policies)
    shuffled_pods, shuffled_policies = list(PODS), list(policies)
    random.Random(seed).shuffle(shuffled_pods)
    random.Random(seed).shuffle(shuffled_policies)
    again = compile_rules(NETWORKPOLICY, shuffled_pods, [], [], shuffled_policies)
    assert again == fresh
    assert again.fingerprint() == fresh.fingerprint()
    changed = compile_rules(NETWORKPOLICY, PODS, [], [], policies[:3])
    assert changed.fingerprint() != fresh.fingerprint()


def test_trace_lists_the_allowing_rules() -> None:
    ruleset = compile_one({
        "podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [{"from": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]}],
    })  # fmt: skip
    text = render_verdict(evaluate(ruleset, "10.128.1.10", "10.128.0.11", "tcp", 8080))
    assert text.splitlines() == [
        "ALLOWED: pod y/cli (10.128.1.10 on node-1) -> pod x/db (10.128.0.11 on node-1) tcp/8080",
        "mode: networkpolicy (redhat/openshift-ovs-networkpolicy)",
        "VNIDs: source none (no NetNamespace yet), destination none (no NetNamespace yet)",
        "allowed by: x/p/ingress/0",
        "why:",
        "  egress: y/cli is selected by no egress policy: all allowed",
        "  ingress: allowed by x/p/ingress/0",
    ]


def test_trace_explains_a_denial() -> None:
    ruleset = compile_one({
        "podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]},
                    {"ports": [{"port": 5432}]}],
    })  # fmt: skip
    verdict = evaluate(ruleset, "10.128.1.10", "10.128.0.11", "TCP", 8080)
    assert not verdict.allowed
    assert verdict.denied_because == (
        "ingress: x/db is isolated by x/p and no ingress rule of theirs allows "
        "pod y/cli (10.128.1.10 on node-1) tcp/8080"
    )
    text = render_verdict(verdict)
    assert "  x/p/ingress/0: 10.128.1.10 is not among its peers" in text
    assert "  x/p/ingress/1: tcp/8080 is not among its ports" in text
