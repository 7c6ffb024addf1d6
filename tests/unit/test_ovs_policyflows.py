"""Tables 21 and 80 from the RuleSet (``policyflows``) and their parts (port blocks,
conjunction ids), without a switch.

The flows are checked for shape here (counts linear in pods + policies, determinism,
a policy change touching only its groups, multitenant VNID groups); that they decide as
``evaluate`` does is checked on real OVS in tests/integration/test_ovs_policy_trace.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from ipaddress import IPv4Network
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.dataplane.ovs import conjunction
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.conjunction import Conjunctions, conjunction_ids, members
from podnet.dataplane.ovs.flow import Flow, Kind, flows_text, kind_of
from podnet.dataplane.ovs.networkpolicy import Kept, NetworkPolicyFlows
from podnet.dataplane.ovs.policyflows import (
    Groups,
    LocalView,
    policy_flows,
    policy_groups,
    rule_conjunctions,
    vnid_cookie,
)
from podnet.dataplane.ovs.portmasks import FULL_MASK, port_blocks, port_matches
from podnet.model.network import MULTITENANT, NETWORKPOLICY, SUBNET
from podnet.policy.compile import compile_rules
from podnet.policy.model import PolicyRule, PortRange, RuleSet

Obj = dict[str, Any]


# --- port blocks ----------------------------------------------------------------------------


@settings(deadline=None)
@given(st.integers(0, FULL_MASK), st.integers(0, FULL_MASK))
def test_port_blocks_cover_exactly_the_range(a: int, b: int) -> None:
    first, last = min(a, b), max(a, b)
    blocks = port_blocks(first, last)
    assert len(blocks) <= 30
    covered = 0
    for value, mask in blocks:
        size = (~mask & FULL_MASK) + 1
        assert value & ~mask & FULL_MASK == 0  # aligned
        assert first <= value and value + size - 1 <= last
        covered += size
    assert covered == last - first + 1  # no overlap (all inside), no gap


def test_port_matches_text() -> None:
    assert port_matches(PortRange("TCP", 0, 65535)) == ["tcp"]
    assert port_matches(PortRange("UDP", 53, 53)) == ["udp,tp_dst=53"]
    assert port_matches(PortRange("SCTP", 80, 95)) == ["sctp,tp_dst=0x50/0xfff0"]
    assert port_matches(PortRange("TCP", 79, 81)) == [
        "tcp,tp_dst=79", "tcp,tp_dst=0x50/0xfffe"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="bad port range"):
        port_blocks(10, 9)


# --- conjunction ids ------------------------------------------------------------------------


@settings(deadline=None)
@given(st.sets(st.text(min_size=1, max_size=8), max_size=30), st.text(min_size=1, max_size=8))
def test_conjunction_ids_are_stable_and_distinct(ids: set[str], extra: str) -> None:
    found = conjunction_ids(ids)
    assert len(set(found.values())) == len(ids)
    assert all(1 <= v < 1 << 32 for v in found.values())
    more = conjunction_ids(ids | {extra})
    assert {k: more[k] for k in ids} == found  # another rule renumbers no one


def test_conjunction_ids_probe_past_collisions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conjunction, "_digest", lambda rule_id: 7)
    assert conjunction_ids(["b", "a", "c"]) == {"a": 7, "b": 8, "c": 9}


def test_conjunctions_merge_shared_members_and_keep_them() -> None:
    conj = Conjunctions(21, 200)
    cookies = {"ip,nw_src=10.0.0.1": 5, "tcp": 6}.__getitem__
    one = members(["ip,nw_src=10.0.0.1"], cookies, 2, 1, 2)
    two = members(["ip,nw_src=10.0.0.1"], cookies, 1, 1, 3) + members(["tcp"], cookies, 1, 3, 3)
    both = conj.render({"a": lambda: one, "b": lambda: two})
    assert [f.text() for f in both] == [
        "cookie=0x5,table=21,priority=200,ip,nw_src=10.0.0.1 "
        "actions=conjunction(1,1/3),conjunction(2,1/2)",
        "cookie=0x6,table=21,priority=200,tcp actions=conjunction(1,3/3)",
    ]
    asked: list[str] = []

    def rebuilt() -> list[tuple[str, int, str]]:
        asked.append("a")
        return one

    again = conj.render({"a": rebuilt})  # b gone, a kept
    assert not asked  # a kept conjunction is not rebuilt
    assert [f.text() for f in again] == [
        "cookie=0x5,table=21,priority=200,ip,nw_src=10.0.0.1 actions=conjunction(2,1/2)"
    ]
    assert conj.render({}) == []


# --- rule sets ------------------------------------------------------------------------------


def pod(i: int, node: str, ns: str = "x", app: str = "a") -> Obj:
    ports = [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    return {
        "metadata": {"namespace": ns, "name": f"pod{i}", "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "ports": ports}]},
        "status": {"phase": "Running", "podIP": f"10.128.{i // 200}.{10 + i % 200}"},
    }


def allow_from(name: str, app: str, peer_app: str, port: Any = 80, ns: str = "x") -> Obj:
    return {
        "metadata": {"namespace": ns, "name": name},
        "spec": {
            "podSelector": {"matchLabels": {"app": app}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": peer_app}}}],
                         "ports": [{"port": port}, {"port": "http"}]}],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                        "ports": [{"port": 1000, "endPort": 2000, "protocol": "UDP"}]}],
        },
    }  # fmt: skip


NAMESPACES = [{"metadata": {"name": n}} for n in ("x", "y")]


def world(pods: int, policies: int, local: int | None = None) -> tuple[LocalView, RuleSet]:
    """``pods`` pods (the first ``local`` on node-1), ``policies`` policies."""
    local = pods if local is None else local
    objs = [pod(i, "node-1" if i < local else "node-2", app="abc"[i % 3]) for i in range(pods)]
    pols = [allow_from(f"p{j}", "abc"[j % 3], "abc"[(j + 1) % 3], 80 + j) for j in range(policies)]
    rules = compile_rules(NETWORKPOLICY, objs, NAMESPACES, [], pols,
                          node_addresses=[("node-1", "10.0.1.1")])  # fmt: skip
    return view_of(rules), rules


def view_of(rules: RuleSet, node: str = "node-1") -> LocalView:
    ports = {e.ip: 3 + i for i, e in enumerate(e for e in rules.endpoints if e.node == node)}
    return LocalView(node, ports, rules.resident(node))


@settings(deadline=None, max_examples=40)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 6), st.integers(0, 3),
                          st.integers(0, 30)), min_size=2, max_size=6))  # fmt: skip
def test_a_kept_render_equals_a_fresh_one(steps: list[tuple[int, int, int, int]]) -> None:
    """Renders through one node's kept state, world after world (pods, policies, their
    ports and local pods changing), give exactly what a render from scratch gives. A rule
    equal to one of an earlier world is handed over as that same object, as the
    incremental compiler does, so the kept per-rule targets are used (and must be right
    when the local pods changed under them)."""
    kept = Kept()
    seen: dict[PolicyRule, PolicyRule] = {}
    for pods, policies, port_shift, local in steps:
        objs = [pod(i, "node-1" if i < local else "node-2", app="abc"[i % 3]) for i in range(pods)]
        peer = "abc"[port_shift % 3]
        pols = [allow_from(f"p{j}", "abc"[j % 3], peer, 80 + j % 3 + port_shift)
                for j in range(policies)]  # fmt: skip
        rules = compile_rules(NETWORKPOLICY, objs, NAMESPACES, [], pols)
        policies = tuple(replace(p, rules=tuple(seen.setdefault(r, r) for r in p.rules))
                         for p in rules.policies)  # fmt: skip
        rules = replace(rules, policies=policies)
        view = view_of(rules)
        again = NetworkPolicyFlows(view, rules, kept).flows()
        fresh = NetworkPolicyFlows(view, rules).flows()
        assert flows_text(again) == flows_text(fresh)
    assert flows_text(policy_flows(view, rules)) == flows_text(fresh)  # policy_groups keeps too


def test_subnet_passes_everything() -> None:
    flows = policy_flows(LocalView("n", {}), None)
    assert [(f.table, f.priority, f.match, f.actions) for f in flows] == [
        (t.EGRESS_POLICY, 0, "", "goto_table:30"),
        (t.ISOLATION, 0, "", "output:NXM_NX_REG2[]"),
    ]
    rules = compile_rules(SUBNET, [pod(0, "n")], NAMESPACES, [], [])
    assert policy_flows(LocalView("n", {}), rules) == flows


def test_flows_grow_linearly_in_pods_and_policies() -> None:
    counts = {(p, k): len(policy_flows(*world(p, k))) for p in (30, 60, 120) for k in (3, 6, 12)}
    # one policy more is a fixed number of flows, whatever the pods
    per_policy = {counts[p, 6] - counts[p, 3] for p in (30, 60, 120)}
    assert per_policy == {counts[30, 12] - counts[30, 6] - (counts[30, 6] - counts[30, 3])}
    # twice the pods (all local, all peers) at most twice the flows: never pods x pods
    for k in (3, 6, 12):
        assert counts[120, k] - counts[60, k] == 2 * (counts[60, k] - counts[30, k])
    assert counts[120, 12] < 120 * 40 // 4  # 120 pods x 40 peers would be pairs


@settings(deadline=None)  # the machine may be busy: no wall-clock limit
@given(st.integers(1, 40), st.integers(0, 8))
def test_flow_count_is_bounded_by_pods_plus_rules(pods: int, policies: int) -> None:
    view, rules = world(pods, policies, local=pods // 2)
    flows = policy_flows(view, rules)
    rules_here = sum(1 for r in rules.rules if r.targets & set(view.pods))
    peers = len({ip for r in rules.rules for ip in r.peers.pods})
    ports = 64  # distinct port blocks and named entries of these policies stay few
    assert len(flows) <= 4 * len(view.pods) + 2 * peers + ports + rules_here + 20


def test_same_input_same_flows() -> None:
    view, rules = world(20, 5, local=12)
    again = compile_rules(
        NETWORKPOLICY,
        list(reversed([pod(i, "node-1" if i < 12 else "node-2", app="abc"[i % 3])
                       for i in range(20)])),
        NAMESPACES, [],
        list(reversed([allow_from(f"p{j}", "abc"[j % 3], "abc"[(j + 1) % 3], 80 + j)
                       for j in range(5)])),
        node_addresses=[("node-1", "10.0.1.1")],
    )  # fmt: skip
    assert flows_text(policy_flows(view, rules)) == flows_text(policy_flows(view_of(again), again))


def conj_ids_in(flows: Iterable[Flow]) -> set[int]:
    flows = list(flows)
    return {int(i) for f in flows for i in re.findall(r"conjunction\((\d+),", f.actions)} | {
        int(m) for f in flows for m in re.findall(r"conj_id=(\d+)", f.match)
    }


def changed_groups(before: Groups, after: Groups) -> set[int]:
    return {c for c in before.keys() | after.keys() if before.get(c) != after.get(c)}


def test_a_policy_change_touches_only_its_groups() -> None:
    objs = [pod(i, "node-1" if i < 10 else "node-2", app="abc"[i % 3]) for i in range(20)]
    pols = [allow_from(f"p{j}", "abc"[j % 3], "abc"[(j + 1) % 3], 80 + j) for j in range(6)]
    changed = allow_from("p2", "c", "a", 4242)  # p2 with other ports and peers
    addresses = [("node-1", "10.0.1.1")]
    old = compile_rules(NETWORKPOLICY, objs, NAMESPACES, [], pols, node_addresses=addresses)
    new = compile_rules(NETWORKPOLICY, objs, NAMESPACES, [], [*pols[:2], changed, *pols[3:]],
                        node_addresses=addresses)  # fmt: skip
    before, after = policy_groups(view_of(old), old), policy_groups(view_of(new), new)
    p2_ids = {
        conj_id
        for rules in (old, new)
        for rule_id, (_, conj_id) in rule_conjunctions(view_of(rules), rules).items()
        if rule_id.startswith("x/p2/")
    }
    others = {c: conj_ids_in(fs) - p2_ids for c, fs in before.items() if c in after}
    touched = changed_groups(before, after)
    assert touched
    for group in touched:
        mentions = conj_ids_in(before.get(group, [])) | conj_ids_in(after.get(group, []))
        assert mentions & p2_ids, f"group {group:#x} changed without naming p2"
        if group in others:  # the other policies' conjunctions there are unchanged
            assert conj_ids_in(after[group]) - p2_ids == others[group]
    assert all(kind_of(c) != Kind.ISOLATION for c in touched)


def test_a_port_change_rewrites_only_port_flows() -> None:
    """The conjunction keeps its id, so its peers' and targets' flows stay as they are."""
    objs = [pod(i, "node-1" if i < 10 else "node-2", app="abc"[i % 3]) for i in range(20)]
    pols = [allow_from(f"p{j}", "abc"[j % 3], "abc"[(j + 1) % 3], 80 + j) for j in range(6)]
    old = compile_rules(NETWORKPOLICY, objs, NAMESPACES, [], pols)
    moved = [*pols[:2], allow_from("p2", "c", "a", 4242), *pols[3:]]
    new = compile_rules(NETWORKPOLICY, objs, NAMESPACES, [], moved)
    before, after = policy_groups(view_of(old), old), policy_groups(view_of(new), new)
    touched = changed_groups(before, after)
    matches = sorted(f.match for c in touched for f in before.get(c, []) + after.get(c, []))
    assert matches == ["tcp,tp_dst=4242", "tcp,tp_dst=82"]


def test_rules_with_equal_peers_and_ports_share_one_conjunction() -> None:
    objs = [pod(i, "node-1", app="abc"[i % 3]) for i in range(9)]
    same = [allow_from("p-a", "a", "c", 80), allow_from("p-b", "b", "c", 80)]
    rules = compile_rules(NETWORKPOLICY, objs, NAMESPACES, [], same)
    found = rule_conjunctions(view_of(rules), rules)
    assert found["x/p-a/ingress/0"] == found["x/p-b/ingress/0"]
    assert found["x/p-a/egress/0"] == found["x/p-b/egress/0"]
    conj = [f for f in policy_flows(view_of(rules), rules) if f.match.startswith("conj_id=")]
    assert len(conj) == 2  # one per direction, for two policies
    other = compile_rules(NETWORKPOLICY, objs, NAMESPACES, [], [same[0]])
    assert rule_conjunctions(view_of(other), other)["x/p-a/egress/0"] == found["x/p-a/egress/0"]


def test_isolated_pod_drops_and_conntrack_passes() -> None:
    view, rules = world(6, 1)
    flows = policy_flows(view, rules)
    text = flows_text(flows)
    target = next(iter(sorted(rules.ingress_isolated)))
    assert f"table=80,priority=100,ip,nw_dst={target} actions=drop" in text
    assert "table=80,priority=400,ip,ct_state=-trk actions=ct(table=80)" in text
    assert "table=21,priority=302,ip,ct_state=+rpl+trk actions=goto_table:30" in text
    assert "table=80,priority=250,ip,nw_src=10.0.1.1 actions=output:NXM_NX_REG2[]" in text
    conj = [f for f in flows if f.match.startswith("conj_id=")]
    assert len(conj) == len(set(rule_conjunctions(view, rules).values())) == 2
    assert all("ct(commit" in f.actions for f in conj)
    # the ingress rule: targets, peers and ports (80 and the named port 8080)
    assert "tcp,tp_dst=80 actions=conjunction(" in text
    assert re.search(r"tcp,nw_dst=10\.128\.0\.\d+,tp_dst=8080 actions=conjunction\(\d+,3/3\)", text)
    # the egress rule: ipBlock minus except as networks, UDP 1000-2000 as blocks
    assert "table=21,priority=200,ip,nw_dst=10.0.0.0/16 actions=conjunction(" in text
    assert "udp,tp_dst=0x3e8/0xfff8" in text
    assert "172.30.0.0/16" not in text
    services = replace(view, service_network=IPv4Network("172.30.0.0/16"))
    assert "table=21,priority=250,ip,nw_dst=172.30.0.0/16 actions=goto_table:30" in flows_text(
        policy_flows(services, rules)
    )


# --- multitenant ----------------------------------------------------------------------------


def multitenant(netids: dict[str, int]) -> RuleSet:
    objs = [pod(0, "node-1", "x"), pod(1, "node-1", "y"), pod(2, "node-1", "z"),
            pod(3, "node-2", "w")]  # fmt: skip
    spaces = [{"metadata": {"name": n}} for n in "xyzw"]
    nets = [{"netname": n, "netid": v} for n, v in netids.items()]
    return compile_rules(MULTITENANT, objs, spaces, nets, [])


def test_multitenant_flows_per_vnid_of_local_pods() -> None:
    rules = multitenant({"x": 10, "y": 11, "w": 12})  # z has none: unassigned
    groups = policy_groups(view_of(rules), rules)
    text = flows_text([f for fs in groups.values() for f in fs])
    assert "table=80,priority=210,reg0=0 actions=output:NXM_NX_REG2[]" in text
    assert "table=80,priority=200,reg1=0 actions=output:NXM_NX_REG2[]" in text
    assert "table=80,priority=100,reg0=0xa,reg1=0xa actions=output" in text
    assert "table=80,priority=0 actions=drop" in text
    assert vnid_cookie(12) not in groups  # no local pod has it
    assert f"{t.UNASSIGNED_VNID:#x}" not in text  # unassigned meets only VNID 0


def test_multitenant_join_and_isolate_change_only_vnid_groups() -> None:
    isolated, joined = multitenant({"x": 10, "y": 11}), multitenant({"x": 10, "y": 10})
    before = policy_groups(view_of(isolated), isolated)
    after = policy_groups(view_of(joined), joined)
    assert changed_groups(before, after) == {vnid_cookie(11)}
    made_global = multitenant({"x": 10, "y": 0})
    assert changed_groups(before, policy_groups(view_of(made_global), made_global)) == {
        vnid_cookie(11)
    }


def test_a_project_with_the_unassigned_value_is_refused() -> None:
    rules = multitenant({"x": t.UNASSIGNED_VNID})
    with pytest.raises(ValueError, match="reserved for pods without a VNID"):
        policy_groups(view_of(rules), rules)


def test_unknown_plugin_is_refused() -> None:
    rules = replace(multitenant({}), plugin="bogus")
    with pytest.raises(ValueError, match="unknown network plugin"):
        policy_groups(view_of(rules), rules)


def test_a_hashed_key_is_its_value_as_a_key() -> None:
    """Equal values made apart are one key (rules of two policies with equal peers and
    ports share one conjunction); unequal ones are two."""
    one, same = (
        conjunction.HashedKey((frozenset({1, 2}), (3,))),
        conjunction.HashedKey((frozenset({2, 1}), (3,))),
    )
    other = conjunction.HashedKey((frozenset({1, 2}), (4,)))
    assert {one: "a"}.get(same) == "a" and one == same
    assert len({one, same, other}) == 2 and one != other
