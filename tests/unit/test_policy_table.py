"""The nftables policy table rendered from a RuleSet, and the transactions between two.

Pure: no kernel here (tests/integration/test_dataplane_policy.py applies these tables and
sends real traffic through them).
"""

from __future__ import annotations

from typing import Any

from podnet.dataplane.linux.policyscript import parse_listing, transaction
from podnet.dataplane.linux.policytable import PolicyRenderer
from podnet.dataplane.linux.policyvalues import BUCKETS, PolicyTable
from podnet.model.network import MULTITENANT, NETWORKPOLICY
from podnet.policy.compile import compile_rules
from podnet.testing.netpol import (
    ALLOW_B,
    IPS,
    KEYS,
    NAMESPACES,
    compile_cluster,
    make_namespace,
    make_pod,
    policy,
    sel,
)

Obj = dict[str, Any]
DENY_X = policy("x", "deny", {}, types=["Ingress", "Egress"])


def lines(script: str) -> list[str]:
    return script.splitlines()


def test_no_policy_means_no_table() -> None:
    table = PolicyRenderer("node-1").render(compile_cluster([]))
    assert table.empty
    assert transaction(None, table) == ""
    assert transaction(PolicyRenderer("node-1").render(compile_cluster([DENY_X])), table) == (
        "delete table inet podnet_policy\n"
    )


def test_each_node_holds_only_its_own_pods_rules() -> None:
    """make_pod puts every pod a on node-1 and the others on node-2."""
    rules = compile_cluster([ALLOW_B])  # x/a accepts any pod b: x/a is on node-1
    on_1 = PolicyRenderer("node-1").render(rules)
    on_2 = PolicyRenderer("node-2").render(rules)
    assert on_2.empty
    assert {"forward", "ingress", "ingress_gate"} <= set(on_1.chains)
    assert "egress" not in on_1.chains  # no egress isolation
    forward = on_1.chains["forward"].rules
    assert forward[0] == "ct state established,related accept" and len(forward) == 4
    assert forward[1] == "meta mark & 0x00008000 == 0x00008000 accept"  # hairpin
    isolated = [s for s in on_1.sets.values() if s.elements == (IPS["x/a"],)]
    assert isolated, "the ingress-isolated set holds x/a alone"


def test_rule_count_grows_with_policies_not_pods() -> None:
    def rules_for(policies: int, pods_per_namespace: int) -> int:
        pods = [
            {
                "metadata": {"namespace": "x", "name": f"p{i}", "labels": {"app": f"a{i % 10}"}},
                "spec": {"nodeName": "node-1"},
                "status": {"phase": "Running", "podIP": f"10.128.{i // 200}.{i % 200 + 1}"},
            }
            for i in range(pods_per_namespace)
        ]
        pols = [
            policy(
                "x",
                f"p{i}",
                sel(app=f"a{i % 10}"),
                ingress=[
                    {
                        "from": [{"podSelector": sel(app=f"a{(i + 1) % 10}")}],
                        "ports": [{"port": 80 + i}],
                    }
                ],
            )
            for i in range(policies)
        ]
        rules = compile_rules(NETWORKPOLICY, pods, [make_namespace("x")], [], pols)
        table = PolicyRenderer("node-1").render(rules)
        total = table.size()[0]
        accepts = sum(len(c.rules) for name, c in table.chains.items() if name[-1].isdigit())
        assert total <= accepts + 2 * BUCKETS + 6  # the frame: hooks and bucket jumps
        return accepts

    assert rules_for(20, 100) == rules_for(20, 400) == 20  # one accept rule per policy rule
    assert rules_for(40, 100) == 40


def test_a_new_policy_touches_only_its_buckets_and_sets() -> None:
    renderer = PolicyRenderer("node-1")
    before = renderer.render(compile_cluster([DENY_X]))
    after = renderer.render(compile_cluster([DENY_X, ALLOW_B]))
    script = lines(transaction(before, after))
    assert not any(line.startswith("delete ") for line in script)
    flushed = [line for line in script if line.startswith("flush chain")]
    assert flushed == ["flush chain inet podnet_policy ingress"]  # a jump to a new bucket
    added_rules = [line for line in script if line.startswith("add rule")]
    assert any("ingress_" in line and "accept" in line for line in added_rules)
    assert all(" jump ingress_" in line or "ingress_" in line.split()[4] for line in added_rules)


def test_egress_allows_go_on_to_the_ingress_check() -> None:
    """An egress rule ends in ``goto ingress_gate``: passing egress never skips ingress."""
    table = PolicyRenderer("node-1").render(compile_cluster([DENY_X]))
    assert table.chains["forward"].rules == (
        "ct state established,related accept",
        "meta mark & 0x00008000 == 0x00008000 accept",
        *(f"ip saddr @{s} {v}" for s in [_isolated(table)] for v in ("jump egress", "drop")),
        *(f"ip daddr @{s} {v}" for s in [_isolated(table)] for v in ("jump ingress", "drop")),
    )
    assert table.chains["ingress_gate"].rules[-1] == "accept"
    assert not {"input", "output"} & set(table.chains)  # a pod and its node: never checked
    egress = compile_cluster(
        [policy("x", "out", {}, types=["Egress"], egress=[{"ports": [{"port": 80}]}])]
    )
    rendered = PolicyRenderer("node-1").render(egress)
    bucket_rules = [
        r for n, c in rendered.chains.items() if n.startswith("egress_") for r in c.rules
    ]
    assert bucket_rules and all(r.endswith("goto ingress_gate") for r in bucket_rules)


def _isolated(table: PolicyTable) -> str:
    """The set holding x/a alone (x's pod on node-1), isolated both ways by DENY_X."""
    return next(name for name, s in table.sets.items() if s.elements == (IPS["x/a"],))


def test_transaction_orders_creation_before_use_and_deletion_after() -> None:
    renderer = PolicyRenderer("node-1")
    pods = [make_pod(k) for k in KEYS]
    namespaces = [make_namespace(n) for n in NAMESPACES]

    def tenants(y_vnid: int) -> PolicyTable:
        netnamespaces = [
            {"netname": "x", "netid": 10},
            {"netname": "y", "netid": y_vnid},
            {"netname": "z", "netid": 12},
        ]
        return renderer.render(compile_rules(MULTITENANT, pods, namespaces, netnamespaces, []))

    first, joined = tenants(11), tenants(10)
    script = lines(transaction(first, joined))
    index = {line: i for i, line in enumerate(script)}
    flush_iso = index["flush chain inet podnet_policy isolation"]
    delete_map = next(i for line, i in index.items() if line.startswith("delete map"))
    delete_chain = index["delete chain inet podnet_policy vnid_11"]
    add_map = next(i for line, i in index.items() if line.startswith("add map"))
    assert add_map < flush_iso < delete_map < delete_chain
    assert index["flush chain inet podnet_policy vnid_11"] < delete_chain
    assert "vnid_11" not in joined.chains and "vnid_10" in joined.chains


def test_unchanged_input_renders_the_same_table_and_no_transaction() -> None:
    renderer = PolicyRenderer("node-1")
    rules = compile_cluster([DENY_X, ALLOW_B])
    first = renderer.render(rules)
    assert transaction(first, renderer.render(rules)) == ""
    assert (
        transaction(first, PolicyRenderer("node-1").render(compile_cluster([ALLOW_B, DENY_X])))
        == ""
    )


def test_a_listing_reads_back_as_the_rendered_table() -> None:
    """``nft list table`` prints what we render; reading it back needs no change."""
    table = PolicyRenderer("node-1").render(compile_cluster([DENY_X, ALLOW_B]))
    listing = ["table inet podnet_policy {"]
    for s in table.sets.values():
        listing += [f"\t{s.kind} {s.name} {{", f"\t\ttype {s.type}"]
        listing += ["\t\tflags interval"] if s.interval else []
        listing += [f"\t\telements = {{ {', '.join(s.elements)} }}"] if s.elements else []
        listing += ["\t}", ""]
    for c in table.chains.values():
        listing += [
            f"\tchain {c.name} {{",
            *([f"\t\t{c.hook}"] if c.hook else []),
            *(f"\t\t{r}" for r in c.rules),
            "\t}",
        ]
    listing.append("}")
    back = parse_listing("\n".join(listing))
    assert back is not None
    assert transaction(back, table) == ""
    assert parse_listing("") is None


def test_a_changed_hook_rebuilds_the_table() -> None:
    table = PolicyRenderer("node-1").render(compile_cluster([DENY_X]))
    chains = dict(table.chains)
    old = chains["forward"]
    chains["forward"] = type(old)(
        old.name, "type filter hook forward priority 5; policy accept;", old.rules
    )
    script = transaction(PolicyTable(table.sets, chains), table)
    assert script.startswith("delete table inet podnet_policy\nadd table inet podnet_policy\n")


def test_a_pod_and_its_own_node_always_reach_each_other() -> None:
    """Kubernetes never blocks a pod's own node; other nodes meet the policy."""
    from podnet.policy.compile import hostsubnet_addresses
    from podnet.policy.evaluate import evaluate

    node_1 = {"metadata": {"name": "node-1"}, "hostIP": "192.0.2.1", "subnet": "10.128.0.0/23"}
    node_2 = {"metadata": {"name": "node-2"}, "hostIP": "192.0.2.2", "subnet": "10.128.2.0/23"}
    pods = [make_pod(k) for k in KEYS]
    addresses = [pair for hs in (node_1, node_2) for pair in hostsubnet_addresses(hs)]
    rules = compile_rules(
        NETWORKPOLICY, pods, [make_namespace(n) for n in NAMESPACES], [], [DENY_X],
        node_addresses=addresses,
    )  # fmt: skip
    x_a = IPS["x/a"]  # on node-1
    for own in ("192.0.2.1", "10.128.0.1"):
        assert evaluate(rules, own, x_a, "TCP", 80).allowed
        assert evaluate(rules, x_a, own, "TCP", 80).allowed
    for other in ("192.0.2.2", "10.128.2.1"):
        assert not evaluate(rules, other, x_a, "TCP", 80).allowed
        assert not evaluate(rules, x_a, other, "TCP", 80).allowed
    assert "own node" in " ".join(evaluate(rules, "192.0.2.1", x_a, "TCP", 80).reasons)
