"""``PolicyCompiler`` against ``compile_rules``: after every change, the same fingerprint.

Hypothesis draws sequences of changes (add, update, delete, relist) of pods, Namespaces,
NetNamespaces, NetworkPolicies and node IPs, from small pools of names and addresses so
that updates, duplicate IPs and label moves happen often. After each step the compiler's
rule set must equal a fresh ``compile_rules`` over the same objects. Further tests pin
what makes the compiler cheap: unchanged parts keep their very objects, and changes that
compile does not read change nothing.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podnet.model.network import MULTITENANT, NETWORKPOLICY, SUBNET
from podnet.policy.compile import compile_rules
from podnet.policy.incremental import PolicyCompiler
from podnet.policy.slim import NAMESPACES, NETNAMESPACES, PODS, POLICIES, object_name, slim_pod

Obj = dict[str, Any]
NS_NAMES = ("x", "y", "z")
KEYS = ("app", "role")
VALUES = ("a", "b")
PORTS = [("http", 80, "TCP"), ("http", 81, None), ("dns", 53, "UDP"), ("web", 8080, "TCP")]


# --- objects ----------------------------------------------------------------------------------


def labels(max_size: int = 2) -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=max_size)


@st.composite
def selector(draw: st.DrawFn) -> Obj:
    kind = draw(st.sampled_from(["empty", "labels", "expression"]))
    if kind == "labels":
        return {"matchLabels": draw(labels(1))}
    if kind == "expression":
        operator = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
        found: Obj = {"key": draw(st.sampled_from(KEYS)), "operator": operator}
        if operator in ("In", "NotIn"):
            found["values"] = [draw(st.sampled_from(VALUES))]
        return {"matchExpressions": [found]}
    return {}


@st.composite
def peer(draw: st.DrawFn) -> Obj:
    kind = draw(st.sampled_from(["pod", "namespace", "both", "ipBlock"]))
    if kind == "ipBlock":
        return {"ipBlock": {"cidr": "10.0.0.0/29", "except": ["10.0.0.2/31"]}}
    found: Obj = {}
    if kind in ("pod", "both"):
        found["podSelector"] = draw(selector())
    if kind in ("namespace", "both"):
        found["namespaceSelector"] = draw(selector())
    return found


@st.composite
def rule(draw: st.DrawFn, peers_key: str) -> Obj:
    found: Obj = {}
    if draw(st.booleans()):
        found[peers_key] = draw(st.lists(peer(), max_size=2))
    if draw(st.booleans()):
        port = draw(st.sampled_from([80, "http", "dns", 53, "nope"]))
        found["ports"] = [{"port": port, "protocol": "UDP" if port in (53, "dns") else "TCP"}]
    return found


@st.composite
def policy(draw: st.DrawFn) -> Obj:
    spec: Obj = {"podSelector": draw(selector())}
    if draw(st.booleans()):
        spec["policyTypes"] = draw(
            st.sampled_from([["Ingress"], ["Egress"], ["Ingress", "Egress"]])
        )
    for key, peers_key in (("ingress", "from"), ("egress", "to")):
        if draw(st.booleans()):
            spec[key] = draw(st.lists(rule(peers_key), min_size=1, max_size=2))
    meta = {"namespace": draw(st.sampled_from(NS_NAMES)), "name": draw(st.sampled_from("pq"))}
    return {"metadata": meta, "spec": spec}


@st.composite
def pod(draw: st.DrawFn) -> Obj:
    ports = draw(st.lists(st.sampled_from(PORTS), max_size=2))
    container = {"name": "c", "image": "busybox",
                 "ports": [{"name": n, "containerPort": p, **({"protocol": pr} if pr else {})}
                           for n, p, pr in ports]}  # fmt: skip
    status: Obj = {"phase": draw(st.sampled_from(["Running", "Running", "Pending"]))}
    if draw(st.integers(0, 5)):
        status["podIP"] = f"10.0.0.{draw(st.integers(1, 6))}"
    return {
        "metadata": {"namespace": draw(st.sampled_from(NS_NAMES)),
                     "name": draw(st.sampled_from("abcd")), "labels": draw(labels()),
                     "uid": "u", "resourceVersion": str(draw(st.integers(1, 9)))},
        "spec": {"nodeName": draw(st.sampled_from(["n1", "n2"])),
                 "hostNetwork": draw(st.integers(0, 7)) == 0, "containers": [container]},
        "status": status,
    }  # fmt: skip


@st.composite
def namespace(draw: st.DrawFn) -> Obj:
    return {"metadata": {"name": draw(st.sampled_from(NS_NAMES)), "labels": draw(labels())}}


@st.composite
def netnamespace(draw: st.DrawFn) -> Obj:
    name = draw(st.sampled_from(NS_NAMES))
    return {"metadata": {"name": name}, "netname": name, "netid": draw(st.sampled_from([0, 7, 8]))}


OBJECTS = {PODS: pod(), NAMESPACES: namespace(), NETNAMESPACES: netnamespace(), POLICIES: policy()}
node_ips = st.lists(st.sampled_from(["192.0.2.1", "192.0.2.2", "10.0.0.5"]), max_size=2)


@st.composite
def change(draw: st.DrawFn) -> tuple[str, str, Any]:
    verb = draw(st.sampled_from(["put", "put", "put", "remove", "replace", "node_ips"]))
    collection = draw(st.sampled_from(list(OBJECTS)))
    if verb == "replace":
        return verb, collection, draw(st.lists(OBJECTS[collection], max_size=4))
    if verb == "node_ips":
        return verb, collection, draw(node_ips)
    return verb, collection, draw(OBJECTS[collection])


# --- the model: the objects as the API holds them ---------------------------------------------


@dataclass
class World:
    plugin: str
    objects: dict[str, dict[str, Obj]] = field(default_factory=lambda: {c: {} for c in OBJECTS})
    node_ips: list[str] = field(default_factory=list)

    def apply(self, compiler: PolicyCompiler, verb: str, collection: str, payload: Any) -> None:
        held = self.objects[collection]
        if verb == "node_ips":
            self.node_ips = payload
            compiler.set_node_ips(payload)
        elif verb == "replace":
            self.objects[collection] = {object_name(collection, o): o for o in payload}
            compiler.replace(collection, copy.deepcopy(payload))
        elif verb == "put":
            held[object_name(collection, payload)] = payload
            compiler.put(collection, copy.deepcopy(payload))
        else:
            held.pop(object_name(collection, payload), None)
            compiler.remove(collection, payload)

    def compile(self) -> Any:
        pods, namespaces, netnamespaces, policies = (
            self.objects[c].values() for c in (PODS, NAMESPACES, NETNAMESPACES, POLICIES)
        )
        return compile_rules(
            self.plugin, pods, namespaces, netnamespaces, policies, node_ips=self.node_ips
        )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([NETWORKPOLICY, NETWORKPOLICY, NETWORKPOLICY, MULTITENANT, SUBNET]),
    st.lists(change(), min_size=1, max_size=25),
)
def test_every_step_equals_a_fresh_compile(plugin: str, changes: list[Any]) -> None:
    world = World(plugin)
    compiler = PolicyCompiler(plugin)
    for step, (verb, collection, payload) in enumerate(changes):
        world.apply(compiler, verb, collection, payload)
        got, want = compiler.rules(), world.compile()
        assert got.fingerprint() == want.fingerprint(), f"step {step}: {verb} {collection}"
        assert got == want


# --- what keeps it cheap ----------------------------------------------------------------------


def make_pod(ns: str, name: str, ip: str, **labels: str) -> Obj:
    ports = [{"name": "http", "containerPort": 80}, {"containerPort": 9}]
    return {
        "metadata": {"namespace": ns, "name": name, "labels": labels, "uid": f"uid-{name}",
                     "annotations": {"big": "x" * 1000}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i", "ports": ports}],
                 "volumes": [{"name": "v"}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready"}]},
    }  # fmt: skip


def allow(ns: str, name: str, target: str, peer_app: str) -> Obj:
    spec = {
        "podSelector": {"matchLabels": {"app": target}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": peer_app}}}],
                     "ports": [{"port": "http"}]}],
        "egress": [{"to": [{"namespaceSelector": {}}]}],
        "policyTypes": ["Ingress", "Egress"],
    }  # fmt: skip
    return {"metadata": {"namespace": ns, "name": name, "resourceVersion": "1"}, "spec": spec}


@pytest.fixture
def compiler() -> PolicyCompiler:
    found = PolicyCompiler(NETWORKPOLICY)
    pods = [make_pod("x", f"p{i}", f"10.128.0.{i + 2}", app=f"a{i % 4}") for i in range(20)]
    found.replace(PODS, pods)
    found.replace(NAMESPACES, [{"metadata": {"name": "x"}}])
    found.replace(POLICIES, [allow("x", f"allow-{i}", f"a{i}", f"a{i + 1}") for i in range(3)])
    return found


def test_a_policy_change_keeps_every_other_policy_and_set(compiler: PolicyCompiler) -> None:
    before = compiler.rules()
    assert compiler.rules() is before  # nothing changed: the very same rule set
    compiler.put(POLICIES, allow("x", "allow-9", "a3", "a0"))
    after = compiler.rules()
    kept = {p.key: p for p in before.policies}
    assert [p for p in after.policies if kept.get(p.key) is p] == list(before.policies)
    assert after.endpoints is before.endpoints and after.host_ips is before.host_ips
    assert after.ingress_isolated != before.ingress_isolated  # a3's pods are isolated now
    assert after.egress_isolated != before.egress_isolated
    compiler.remove(POLICIES, allow("x", "allow-9", "a3", "a0"))
    again = compiler.rules()
    assert again.ingress_isolated == before.ingress_isolated
    assert again.policies == before.policies


def test_the_owned_set_is_kept_across_policy_changes_and_follows_pods(
    compiler: PolicyCompiler,
) -> None:
    compiler.set_pod_networks(["10.128.0.0/14"])
    before = compiler.rules().owned
    assert IPv4Address("10.128.0.2") in before and len(before) == 20
    compiler.put(POLICIES, allow("x", "allow-9", "a3", "a0"))
    assert compiler.rules().owned is before  # no pass over every pod, no set re-rendered
    compiler.remove(PODS, make_pod("x", "p0", "10.128.0.2", app="a0"))
    compiler.put(PODS, make_pod("x", "new", "10.128.0.99", app="a0"))
    after = compiler.rules()
    assert after.owned == before - {IPv4Address("10.128.0.2")} | {IPv4Address("10.128.0.99")}
    compiler.set_pod_networks(["10.128.0.0/26"])  # 10.128.0.99 outside: owned by nobody here
    assert IPv4Address("10.128.0.99") not in compiler.rules().owned


def test_the_owned_set_is_kept_when_nodes_have_addresses(compiler: PolicyCompiler) -> None:
    """As the agent compiles: node IPs, node addresses and pod networks given before every
    compile. The node addresses make a new host set each time; an equal one is kept, so
    a policy change neither recomputes nor re-renders the owned set (it did: ~5 ms a
    change at 2,000 pods, the policy change latency regression)."""

    def compile_as_the_agent(addresses: list[tuple[str, str]]) -> Any:
        compiler.set_node_ips(["192.168.1.1"])
        compiler.set_node_addresses(addresses)
        compiler.set_pod_networks(["10.128.0.0/14"])
        return compiler.rules()

    nodes = [("node1", "192.168.1.1"), ("node1", "10.128.0.1")]
    before = compile_as_the_agent(nodes)
    assert IPv4Address("10.128.0.1") in before.owned  # the node's gateway
    compiler.put(POLICIES, allow("x", "allow-9", "a3", "a0"))
    again = compile_as_the_agent(nodes)
    assert again.host_ips is before.host_ips
    assert again.owned is before.owned
    moved = compile_as_the_agent([("node1", "192.168.1.1"), ("node1", "10.128.2.1")])
    assert moved.owned == before.owned - {IPv4Address("10.128.0.1")} | {IPv4Address("10.128.2.1")}


def test_a_pod_change_keeps_the_policies_it_does_not_touch(compiler: PolicyCompiler) -> None:
    before = compiler.rules()
    compiler.put(PODS, make_pod("x", "p3", "10.128.0.5", app="a2"))  # was a3
    after = compiler.rules()
    old = {p.key: p for p in before.policies}
    new = {p.key: p for p in after.policies}
    assert new["x/allow-0"] is old["x/allow-0"]  # selects a0, allows a1: untouched
    assert new["x/allow-1"] is not old["x/allow-1"]  # allows a2: one peer more
    assert new["x/allow-2"] is not old["x/allow-2"]  # selects a2
    assert after.egress_isolated is not before.egress_isolated
    assert after.host_ips is before.host_ips


def test_changes_compile_does_not_read_change_nothing(compiler: PolicyCompiler) -> None:
    before = compiler.rules()
    churned = make_pod("x", "p1", "10.128.0.3", app="a1")
    churned["metadata"]["resourceVersion"] = "99"
    churned["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    compiler.put(PODS, churned)
    pending = make_pod("x", "new", "", app="a0")
    del pending["status"]["podIP"]
    compiler.put(PODS, pending)
    compiler.remove(PODS, pending)
    relabelled = allow("x", "allow-1", "a1", "a2")
    relabelled["metadata"] |= {"resourceVersion": "7", "labels": {"team": "t"}}
    compiler.put(POLICIES, relabelled)
    assert compiler.rules() is before


def test_pods_are_kept_slim_and_pending_ones_not_at_all(compiler: PolicyCompiler) -> None:
    pending = make_pod("x", "new", "", app="a0")
    compiler.put(PODS, pending)
    assert "x/new" not in compiler.objects(PODS)
    kept = compiler.objects(PODS)["x/p1"]
    assert kept == slim_pod(kept)
    assert set(kept["metadata"]) == {"namespace", "name", "uid", "labels"}
    assert kept["spec"]["containers"] == [
        {"ports": [{"name": "http", "protocol": None, "containerPort": 80}]}
    ]
    assert set(kept["status"]) == {"podIP", "phase"}


def test_plugins_keep_only_what_they_read() -> None:
    tenants = PolicyCompiler(MULTITENANT)
    tenants.put(POLICIES, allow("x", "p", "a", "b"))
    tenants.put(NAMESPACES, {"metadata": {"name": "x"}})
    tenants.put(NETNAMESPACES, {"netname": "x", "netid": 5})
    assert not tenants.objects(POLICIES) and not tenants.objects(NAMESPACES)
    assert tenants.rules() == compile_rules(MULTITENANT, [], [], [{"netname": "x", "netid": 5}], [])
    with pytest.raises(ValueError, match="unknown network plugin"):
        PolicyCompiler("redhat/openshift-ovs-nothing")


def test_a_policy_that_does_not_compile_is_left_out(
    compiler: PolicyCompiler, caplog: pytest.LogCaptureFixture
) -> None:
    broken = allow("x", "broken", "a1", "a2")
    broken["spec"]["podSelector"] = {"matchExpressions": [{"key": "k", "operator": "Near"}]}
    compiler.put(POLICIES, broken)
    with caplog.at_level(logging.ERROR):
        rules = compiler.rules()
    assert [p.name for p in rules.policies] == ["allow-0", "allow-1", "allow-2"]
    assert "NetworkPolicy x/broken does not compile" in caplog.text


def test_a_pod_change_recompiles_only_the_policies_it_can_alter() -> None:
    """A label no selection reads keeps every compiled policy; entering a selection
    recompiles the policies that select it, and the result equals compile_rules."""

    def pod(name: str, labels: dict[str, str], ip: str) -> dict[str, Any]:
        return {
            "metadata": {"namespace": "x", "name": name, "labels": labels},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running", "podIP": ip},
        }

    def to(app: str, source: str) -> dict[str, Any]:
        spec = {
            "podSelector": {"matchLabels": {"app": app}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": source}}}]}],
        }
        return {"metadata": {"namespace": "x", "name": f"to-{app}"}, "spec": spec}

    pods = [pod("a", {"app": "a"}, "10.0.0.1"), pod("b", {"app": "b"}, "10.0.0.2"),
            pod("c", {"app": "c"}, "10.0.0.3")]  # fmt: skip
    policies = [to("a", "b"), to("b", "c")]
    compiler = PolicyCompiler(NETWORKPOLICY)
    compiler.replace(PODS, pods)
    compiler.replace(NAMESPACES, [{"metadata": {"name": "x"}}])
    compiler.replace(POLICIES, policies)
    before = {p.key: p for p in compiler.rules().policies}

    pods[2] = pod("c", {"app": "c", "tier": "web"}, "10.0.0.3")  # read by no selector
    compiler.put(PODS, pods[2])
    after = compiler.rules()
    assert all(before[p.key] is p for p in after.policies)

    pods[2] = pod("c", {"app": "b", "tier": "web"}, "10.0.0.3")  # now a peer of to-a
    compiler.put(PODS, pods[2])
    moved = compiler.rules()
    namespaces = [{"metadata": {"name": "x"}}]
    fresh = compile_rules(NETWORKPOLICY, pods, namespaces, [], policies)
    assert moved.fingerprint() == fresh.fingerprint()
    by_key = {p.key: p for p in moved.policies}
    assert by_key["x/to-a"] is not before["x/to-a"]  # c entered its peers
