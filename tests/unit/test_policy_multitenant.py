"""Multitenant isolation: the VNID rule, on one node and across nodes, as full matrices.

Projects p1, p2, p3 each hold pods a (node-1) and b (node-2); ``default`` holds pod d.
Rows are sources, columns destinations, in the order of ``KEYS``; 1 allowed, 0 denied.
"""

from __future__ import annotations

import textwrap
from typing import Any

from podnet.model.network import MULTITENANT, NETWORKPOLICY, SUBNET
from podnet.policy.compile import compile_rules
from podnet.policy.evaluate import evaluate
from podnet.policy.explain import render_reachability, render_verdict
from podnet.policy.model import RuleSet

KEYS = ["default/d", "p1/a", "p1/b", "p2/a", "p2/b", "p3/a", "p3/b"]
IPS = {key: f"10.128.0.{10 + i}" for i, key in enumerate(KEYS)}
NODE_IP = "10.0.0.1"
GATEWAY_IP = "10.128.0.1"
EXTERNAL_IP = "192.0.2.7"
ISOLATED = {"default": 0, "p1": 10, "p2": 11, "p3": 12}
Obj = dict[str, Any]


def make_pod(key: str) -> Obj:
    ns, name = key.split("/")
    return {
        "metadata": {"namespace": ns, "name": name, "labels": {"pod": name}},
        "spec": {"nodeName": "node-1" if name in ("a", "d") else "node-2"},
        "status": {"phase": "Running", "podIP": IPS[key]},
    }


def compile_tenants(vnids: dict[str, int], plugin: str = MULTITENANT, **extra: Any) -> RuleSet:
    netns = [{"netname": ns, "netid": vnid} for ns, vnid in vnids.items()]
    pods = [make_pod(k) for k in KEYS if k.split("/")[0] in vnids or extra.get("all_pods")]
    namespaces = [{"metadata": {"name": ns}} for ns in ISOLATED]
    policies = extra.get("policies", [])
    return compile_rules(plugin, pods, namespaces, netns, policies, node_ips=[NODE_IP, GATEWAY_IP])


def matrix(ruleset: RuleSet) -> str:
    rows = []
    for src in KEYS:
        bits = "".join(
            "1" if evaluate(ruleset, IPS[src], IPS[dst], "TCP", 80).allowed else "0" for dst in KEYS
        )
        rows.append(f"{src:9} {bits[0]} {bits[1:3]} {bits[3:5]} {bits[5:7]}")
    return "\n".join(rows)


def expected(text: str) -> str:
    return textwrap.dedent(text).strip()


def test_isolated_projects() -> None:
    assert matrix(compile_tenants(ISOLATED)) == expected("""
        default/d 1 11 11 11
        p1/a      1 11 00 00
        p1/b      1 11 00 00
        p2/a      1 00 11 00
        p2/b      1 00 11 00
        p3/a      1 00 00 11
        p3/b      1 00 00 11
    """)


def test_joined_projects_share_a_vnid() -> None:
    joined = {**ISOLATED, "p2": 10}  # oc adm pod-network join-projects --to=p1 p2
    assert matrix(compile_tenants(joined)) == expected("""
        default/d 1 11 11 11
        p1/a      1 11 11 00
        p1/b      1 11 11 00
        p2/a      1 11 11 00
        p2/b      1 11 11 00
        p3/a      1 00 00 11
        p3/b      1 00 00 11
    """)


def test_global_project_reaches_and_is_reached_by_all() -> None:
    made_global = {**ISOLATED, "p3": 0}  # make-projects-global p3
    assert matrix(compile_tenants(made_global)) == expected("""
        default/d 1 11 11 11
        p1/a      1 11 00 11
        p1/b      1 11 00 11
        p2/a      1 00 11 11
        p2/b      1 00 11 11
        p3/a      1 11 11 11
        p3/b      1 11 11 11
    """)


def test_isolating_again_after_a_join() -> None:
    isolated_again = {**ISOLATED, "p2": 13}
    assert matrix(compile_tenants(isolated_again)) == matrix(compile_tenants(ISOLATED))


def test_node_gateway_and_outside_count_as_vnid_zero() -> None:
    ruleset = compile_tenants(ISOLATED)
    for other in (NODE_IP, GATEWAY_IP, EXTERNAL_IP):
        for key in KEYS:
            assert evaluate(ruleset, other, IPS[key], "TCP", 80).allowed
            assert evaluate(ruleset, IPS[key], other, "UDP", 53).allowed
    verdict = evaluate(ruleset, NODE_IP, IPS["p1/a"])
    assert (verdict.src_vnid, verdict.dst_vnid) == (0, 10)
    assert verdict.src == f"host {NODE_IP}"


def test_host_network_pods_are_the_node() -> None:
    host_pod = make_pod("p1/a") | {"spec": {"hostNetwork": True, "nodeName": "node-1"}}
    host_pod["status"] = {"phase": "Running", "podIP": "10.0.0.9"}
    netns = [{"netname": ns, "netid": vnid} for ns, vnid in ISOLATED.items()]
    ruleset = compile_rules(MULTITENANT, [host_pod, make_pod("p2/a")], [], netns, [])
    assert [e.key for e in ruleset.endpoints] == ["p2/a"]
    assert evaluate(ruleset, "10.0.0.9", IPS["p2/a"]).allowed
    assert evaluate(ruleset, "10.0.0.9", IPS["p2/a"]).src_vnid == 0


def test_project_without_vnid_meets_only_vnid_zero() -> None:
    ruleset = compile_tenants({"default": 0, "p1": 10}, all_pods=True)
    assert ruleset.isolation is not None
    unassigned = {str(ip) for ip in ruleset.isolation.unassigned}
    assert unassigned == {IPS[k] for k in KEYS if k.startswith(("p2", "p3"))}
    assert evaluate(ruleset, IPS["p2/a"], IPS["default/d"]).allowed
    assert not evaluate(ruleset, IPS["p2/a"], IPS["p3/a"]).allowed
    denied = evaluate(ruleset, IPS["p2/a"], IPS["p2/b"])
    assert not denied.allowed
    assert denied.src_vnid is None
    assert "no VNID" in denied.denied_because


def test_vnid_map_covers_every_node() -> None:
    ruleset = compile_tenants(ISOLATED)
    assert ruleset.isolation is not None
    assert {str(ip): vnid for ip, vnid in ruleset.isolation.vnids} == {
        IPS[k]: ISOLATED[k.split("/")[0]] for k in KEYS
    }
    assert {e.node for e in ruleset.endpoints} == {"node-1", "node-2"}
    assert ruleset.size().rules == 4


def test_policies_do_not_apply_in_multitenant_mode() -> None:
    deny = {"metadata": {"namespace": "p1", "name": "deny"}, "spec": {"podSelector": {}}}
    ruleset = compile_tenants(ISOLATED, policies=[deny])
    assert ruleset.policies == ()
    assert evaluate(ruleset, IPS["p1/a"], IPS["p1/b"]).allowed


def test_subnet_mode_allows_everything() -> None:
    ruleset = compile_tenants(ISOLATED, plugin=SUBNET)
    assert matrix(ruleset) == expected("""
        default/d 1 11 11 11
        p1/a      1 11 11 11
        p1/b      1 11 11 11
        p2/a      1 11 11 11
        p2/b      1 11 11 11
        p3/a      1 11 11 11
        p3/b      1 11 11 11
    """)
    assert evaluate(ruleset, IPS["p1/a"], IPS["p2/a"]).src_vnid == 0


def test_networkpolicy_mode_keeps_vnids_but_does_not_isolate() -> None:
    ruleset = compile_tenants(ISOLATED, plugin=NETWORKPOLICY)
    verdict = evaluate(ruleset, IPS["p1/a"], IPS["p2/a"])
    assert verdict.allowed
    assert (verdict.src_vnid, verdict.dst_vnid) == (10, 11)


def test_trace_text_names_mode_vnids_and_reason() -> None:
    ruleset = compile_tenants(ISOLATED)
    text = render_verdict(evaluate(ruleset, IPS["p1/a"], IPS["p2/b"], "tcp", 8080))
    assert text.splitlines()[0] == (
        "DENIED: pod p1/a (10.128.0.11 on node-1) -> pod p2/b (10.128.0.14 on node-2) tcp/8080"
    )
    assert "mode: multitenant (redhat/openshift-ovs-multitenant)" in text
    assert "VNIDs: source 10, destination 11" in text
    assert "VNID 10 may not reach VNID 11" in text
    allowed = render_verdict(evaluate(ruleset, IPS["default/d"], IPS["p2/b"], "udp", 53))
    assert allowed.startswith("ALLOWED")
    assert "source VNID is 0 (global)" in allowed


def test_matrix_renderer() -> None:
    ruleset = compile_tenants({"p1": 10, "p2": 11})
    assert render_reachability(ruleset, "TCP", 80) == expected("""
        from \\ to p1/a p1/b p2/a p2/b
        p1/a      ✓    ✓    ✗    ✗
        p1/b      ✓    ✓    ✗    ✗
        p2/a      ✗    ✗    ✓    ✓
        p2/b      ✗    ✗    ✓    ✓
    """)
