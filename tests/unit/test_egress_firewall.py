"""The egress firewall's compiler (``podnet.egress.firewall``): first match over ordered
Allow/Deny rules becomes one set of denied intervals, checked against the rule-by-rule
oracle on random policies."""

from __future__ import annotations

import random
from ipaddress import IPv4Address, IPv4Network

import pytest

from podnet.egress.firewall import (
    ALLOW,
    DENY,
    FirewallError,
    Rule,
    denied,
    regions,
    rules_of,
    verdict,
)


def policy(*rules: tuple[str, str]) -> dict[str, object]:
    egress = []
    for action, to in rules:
        key = "cidrSelector" if "/" in to else "dnsName"
        egress.append({"type": action, "to": {key: to}})
    return {"spec": {"egress": egress}}


def addr(text: str) -> int:
    return int(IPv4Address(text))


def test_deny_all_with_allowed_exceptions() -> None:
    rules = rules_of(policy((ALLOW, "192.0.2.0/25"), (DENY, "0.0.0.0/0")))
    assert denied(rules) == [(0, addr("192.0.1.255")), (addr("192.0.2.128"), 2**32 - 1)]
    assert verdict(rules, IPv4Address("192.0.2.5")) == (ALLOW, 0)
    assert verdict(rules, IPv4Address("198.51.100.1")) == (DENY, 1)


def test_the_first_match_wins_and_no_match_allows() -> None:
    rules = rules_of(policy((DENY, "198.51.100.0/24"), (ALLOW, "198.51.100.0/25")))
    assert denied(rules) == [(addr("198.51.100.0"), addr("198.51.100.255"))]  # Allow shadowed
    assert verdict(rules, IPv4Address("203.0.113.1")) == (ALLOW, None)
    assert [r.rule for r in regions(rules)] == [0]


def test_a_dns_rule_stands_for_the_addresses_its_name_has_now() -> None:
    rules = rules_of(policy((ALLOW, "Example.COM."), (DENY, "0.0.0.0/0")))
    assert rules[0].dns_name == "example.com"
    now = {"example.com": [IPv4Address("203.0.113.7"), IPv4Address("203.0.113.8")]}
    holes = denied(rules, now)
    assert holes == [(0, addr("203.0.113.6")), (addr("203.0.113.9"), 2**32 - 1)]
    assert denied(rules) == [(0, 2**32 - 1)]  # not resolved yet: nothing allowed


@pytest.mark.parametrize(
    "bad",
    [
        {"spec": {"egress": [{"type": "Maybe", "to": {"cidrSelector": "1.2.3.0/24"}}]}},
        {"spec": {"egress": [{"type": "Deny", "to": {}}]}},
        {
            "spec": {
                "egress": [{"type": "Deny", "to": {"cidrSelector": "1.0.0.0/8", "dnsName": "a"}}]
            }
        },
        {"spec": {"egress": ["Deny"]}},
    ],
)
def test_malformed_rules_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(FirewallError):
        rules_of(bad)


def test_the_compiled_set_agrees_with_the_rules_on_random_policies() -> None:
    chance = random.Random(21)
    for _ in range(200):
        rules = []
        for _ in range(chance.randint(1, 12)):
            prefix = chance.randint(0, 32)
            base = IPv4Address(chance.getrandbits(32))
            network = IPv4Network(f"{base}/{prefix}", strict=False)
            rules.append(Rule(chance.choice([ALLOW, DENY]), network))
        holes = denied(rules)
        probes = [chance.getrandbits(32) for _ in range(50)]
        probes += [v for r in rules if r.cidr for v in (int(r.cidr[0]), int(r.cidr[-1]))]
        for value in probes:
            inside = any(first <= value <= last for first, last in holes)
            assert inside == (verdict(rules, IPv4Address(value))[0] == DENY), (rules, value)


def test_the_api_says_whether_a_policy_is_enforced() -> None:
    from podnet.api.egressnotice import FirewallFacts, firewall_verdict

    cidr = {"spec": {"egress": [{"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"}}]}}
    named = {"spec": {"egress": [{"type": "Allow", "to": {"dnsName": "example.com"}}]}}
    assert firewall_verdict(cidr, FirewallFacts(True, 10)).enforced
    subnet = firewall_verdict(cidr, FirewallFacts(False, None))
    assert not subnet.enforced and subnet.reason == "SubnetPlugin"
    assert firewall_verdict(cidr, FirewallFacts(True, 0)).reason == "GlobalProject"
    by_name = firewall_verdict(named, FirewallFacts(True, 10))
    assert not by_name.enforced and "dnsName" in by_name.message


def test_trace_names_the_policy_and_the_rule_that_decide() -> None:
    from podnet.egress.explain import firewall_verdict as explain

    internal = [IPv4Network("10.128.0.0/14"), IPv4Network("172.30.0.0/16")]
    fw = policy((ALLOW, "192.0.2.0/25"), (DENY, "0.0.0.0/0"))
    fw["metadata"] = {"namespace": "x", "name": "default"}
    vnids = {"x": 10, "y": 11, "default": 0}
    denied = explain("x", IPv4Address("198.51.100.1"), internal, vnids, [fw])
    assert denied is not None and not denied.allowed
    assert denied.lines == ("egress firewall x/default: DENIED by rule 1 (Deny 0.0.0.0/0)",)
    allowed = explain("x", IPv4Address("192.0.2.9"), internal, vnids, [fw])
    assert allowed is not None and allowed.allowed and "rule 0 (Allow" in allowed.lines[0]
    assert explain("x", IPv4Address("10.128.3.4"), internal, vnids, [fw]) is None  # a pod
    assert explain("y", IPv4Address("198.51.100.1"), internal, vnids, [fw]) is None
    second = {**fw, "metadata": {"namespace": "x", "name": "second"}}
    both = explain("x", IPv4Address("192.0.2.9"), internal, vnids, [fw, second])
    assert both is not None and not both.allowed and "2 policies" in both.lines[0]
