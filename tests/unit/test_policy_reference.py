"""The compiled rule set against a naive reference read straight from the Kubernetes spec.

``reference`` below knows nothing of ``podnet.policy``: for one packet it walks the pods,
namespaces and policy dicts as the NetworkPolicy documentation words it (and the VNID rule
as OpenShift words it). Hypothesis then draws random clusters and policies, and every
(source, destination, protocol, port) must get the same verdict, the same allowing rule
ids and the same VNIDs from ``evaluate(compile_rules(...))``. Any compile bug (a wrong set,
a lost except, a named port resolved on the wrong pod) shows up as a disagreement.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podnet.model.network import MULTITENANT, NETWORKPOLICY, SUBNET
from podnet.policy.compile import compile_rules
from podnet.policy.evaluate import evaluate

Obj = dict[str, Any]
NODE_IP = "10.0.1.1"
EXTERNAL_IP = "192.168.1.1"
PROBES = [("TCP", 80), ("TCP", 81), ("TCP", None), ("UDP", 53), ("UDP", 80), ("SCTP", 80),
          ("ICMP", None)]  # fmt: skip


# --- the reference: one packet, straight from the objects ----------------------------------


@dataclass
class Cluster:
    plugin: str
    pods: list[Obj]
    namespaces: list[Obj]
    netnamespaces: list[Obj]
    policies: list[Obj]

    def __post_init__(self) -> None:
        self.live: dict[str, Obj] = {}
        for pod in self.pods:
            status, spec = pod["status"], pod["spec"]
            if status.get("phase") == "Running" and not spec.get("hostNetwork"):
                self.live[status["podIP"]] = pod

    def live_pod(self, ip: str) -> Obj | None:
        return self.live.get(ip)

    def namespace_labels(self, name: str) -> dict[str, str]:
        for ns in self.namespaces:
            if ns["metadata"]["name"] == name:
                return {**ns["metadata"].get("labels", {}), "kubernetes.io/metadata.name": name}
        return {"kubernetes.io/metadata.name": name}

    def vnid(self, ip: str) -> int | None:
        pod = self.live_pod(ip)
        if pod is None or self.plugin == SUBNET:
            return 0
        for netns in self.netnamespaces:
            if netns["netname"] == pod["metadata"]["namespace"]:
                return int(netns["netid"])
        return None


def selector_matches(selector: Obj, labels: dict[str, str]) -> bool:
    """matchLabels and matchExpressions, all of them, as the API reference defines them."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions") or []:
        has, value = e["key"] in labels, labels.get(e["key"])
        ok = {
            "In": has and value in e.get("values", []),
            "NotIn": not has or value not in e.get("values", []),
            "Exists": has,
            "DoesNotExist": not has,
        }[e["operator"]]
        if not ok:
            return False
    return True


def peer_matches(cluster: Cluster, peer: Obj, policy_ns: str, ip: str) -> bool:
    if "ipBlock" in peer:
        address = ipaddress.ip_address(ip)
        block = peer["ipBlock"]
        inside = address in ipaddress.ip_network(block["cidr"])
        return inside and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    pod = cluster.live_pod(ip)
    if pod is None:
        return False
    pod_ns = pod["metadata"]["namespace"]
    if "namespaceSelector" in peer:
        if not selector_matches(peer["namespaceSelector"], cluster.namespace_labels(pod_ns)):
            return False
    elif pod_ns != policy_ns:
        return False
    if "podSelector" in peer:
        return selector_matches(peer["podSelector"], pod["metadata"].get("labels", {}))
    return True


def port_matches(
    cluster: Cluster, ports: list[Obj] | None, dst: str, proto: str, port: int | None
) -> bool:
    if not ports:
        return True
    for entry in ports:
        if entry.get("protocol", "TCP") != proto:
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        if port is None:
            continue
        if isinstance(wanted, int) and wanted <= port <= entry.get("endPort", wanted):
            return True
        if isinstance(wanted, str) and named_port(cluster.live_pod(dst), wanted, proto) == port:
            return True
    return False


def named_port(pod: Obj | None, name: str, proto: str) -> int | None:
    for container in (pod or {}).get("spec", {}).get("containers", []):
        for p in container.get("ports", []):
            if p.get("name") == name and p.get("protocol", "TCP") == proto:
                return int(p["containerPort"])
    return None


def policy_types(spec: Obj) -> list[str]:
    if spec.get("policyTypes"):
        return list(spec["policyTypes"])
    return ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]


def side(
    cluster: Cluster, direction: str, me: str, other: str, dst: str, proto: str, port: int | None
) -> tuple[bool, list[str]]:
    """(allowed, allowing rule ids) for the pod at ``me``; not a pod: nothing to check."""
    pod = cluster.live_pod(me)
    if pod is None:
        return True, []
    kind, key, peers_key = (
        ("Ingress", "ingress", "from") if direction == "in" else ("Egress", "egress", "to")
    )
    isolated, allowing = False, []
    for policy in cluster.policies:
        ns, spec = policy["metadata"]["namespace"], policy["spec"]
        if ns != pod["metadata"]["namespace"] or kind not in policy_types(spec):
            continue
        if not selector_matches(spec["podSelector"], pod["metadata"].get("labels", {})):
            continue
        isolated = True
        for i, rule in enumerate(spec.get(key) or []):
            peers = rule.get(peers_key)
            peer_ok = not peers or any(peer_matches(cluster, p, ns, other) for p in peers)
            if peer_ok and port_matches(cluster, rule.get("ports"), dst, proto, port):
                allowing.append(f"{ns}/{policy['metadata']['name']}/{key}/{i}")
    return (not isolated or bool(allowing)), allowing


def reference(
    cluster: Cluster, src: str, dst: str, proto: str, port: int | None
) -> tuple[bool, list[str]]:
    """(allowed, allowing rule ids) for one packet."""
    if src == dst or cluster.plugin == SUBNET:
        return True, []
    if cluster.plugin == MULTITENANT:
        a, b = cluster.vnid(src), cluster.vnid(dst)
        return (a == 0 or b == 0 or (a is not None and a == b)), []
    out_ok, out_ids = side(cluster, "out", src, dst, dst, proto, port)
    in_ok, in_ids = side(cluster, "in", dst, src, dst, proto, port)
    return out_ok and in_ok, out_ids + in_ids


# --- random clusters -------------------------------------------------------------------------

NS_NAMES = ("x", "y", "z")
KEYS = ("app", "role", "tier")
VALUES = ("a", "b", "c")
PORT_NAMES = ("http", "web", "dns")

# The strategies are built once, here, not in each draw: hypothesis validates a strategy
# and works out its properties when it is first drawn from, which cost more than the
# drawing itself when every draw built its strategies anew (43 s on CI for 200 clusters).
labels_st = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), min_size=1, max_size=3)
values_st = st.lists(st.sampled_from(VALUES), min_size=1, max_size=2, unique=True)
keys_st = st.sampled_from(KEYS)
operators_st = st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"])


@st.composite
def expression(draw: st.DrawFn) -> Obj:
    operator = draw(operators_st)
    found: Obj = {"key": draw(keys_st), "operator": operator}
    if operator in ("In", "NotIn"):
        found["values"] = draw(values_st)
    return found


selector_kinds_st = st.sampled_from(["empty", "empty", "labels", "labels", "expressions", "both"])
expressions_st = st.lists(expression(), min_size=1, max_size=2)


def _pairs(keys: tuple[str, ...]) -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from(keys), st.sampled_from(VALUES), min_size=1, max_size=2)


@st.composite
def selector(draw: st.DrawFn, pairs: st.SearchStrategy[dict[str, str]]) -> Obj:
    """Mostly small selectors, so that they often pick something."""
    kind = draw(selector_kinds_st)
    found: Obj = {}
    if kind in ("labels", "both"):
        found["matchLabels"] = draw(pairs)
    if kind in ("expressions", "both"):
        found["matchExpressions"] = draw(expressions_st)
    return found


pod_selector_st = selector(_pairs(KEYS))
ns_selector_st = selector(_pairs(("app", "env")))


ip_prefixes_st = st.sampled_from([0, 24, 28, 29, 30])


@st.composite
def ip_block(draw: st.DrawFn) -> Obj:
    prefix = draw(ip_prefixes_st)
    base = "0.0.0.0" if prefix == 0 else f"10.0.0.{draw(st.integers(0, 15))}"
    cidr = ipaddress.ip_network(f"{base}/{prefix}", strict=False)
    block: Obj = {"cidr": str(cidr)}
    excepts = []
    for _ in range(draw(st.integers(0, 2))):
        inner = draw(st.integers(max(prefix + 1, 26), 32))
        start = int(cidr.network_address) if prefix else int(ipaddress.ip_address("10.0.0.0"))
        offset = draw(st.integers(0, min(15, cidr.num_addresses - 1)))
        address = ipaddress.ip_address(start + offset)
        excepts.append(str(ipaddress.ip_network(f"{address}/{inner}", strict=False)))
    if excepts:
        block["except"] = excepts
    return block


peer_kinds_st = st.sampled_from(["pod", "namespace", "both", "ipBlock"])
ip_block_st = ip_block()


@st.composite
def peer(draw: st.DrawFn) -> Obj:
    kind = draw(peer_kinds_st)
    if kind == "ipBlock":
        return {"ipBlock": draw(ip_block_st)}
    found: Obj = {}
    if kind in ("pod", "both"):
        found["podSelector"] = draw(pod_selector_st)
    if kind in ("namespace", "both"):
        found["namespaceSelector"] = draw(ns_selector_st)
    return found


protocols_st = st.sampled_from([None, "TCP", "TCP", "UDP", "SCTP"])
port_kinds_st = st.sampled_from(["none", "number", "range", "name", "name"])
port_numbers_st = st.sampled_from([53, 80, 81])
port_names_st = st.sampled_from([*PORT_NAMES, "nope"])


@st.composite
def policy_port(draw: st.DrawFn) -> Obj:
    found: Obj = {}
    protocol = draw(protocols_st)
    if protocol is not None:
        found["protocol"] = protocol
    kind = draw(port_kinds_st)
    if kind in ("number", "range"):
        found["port"] = draw(port_numbers_st)
    if kind == "range":
        found["endPort"] = found["port"] + draw(st.integers(0, 2))
    if kind == "name":
        found["port"] = draw(port_names_st)
    return found


peers_st = st.lists(peer(), max_size=2)
ports_st = st.lists(policy_port(), max_size=2)


@st.composite
def rule(draw: st.DrawFn, peers_key: str) -> Obj:
    found: Obj = {}
    if draw(st.integers(0, 2)):
        found[peers_key] = draw(peers_st)
    if draw(st.integers(0, 2)):
        found["ports"] = draw(ports_st)
    return found


policy_types_st = st.lists(
    st.sampled_from(["Ingress", "Egress"]), min_size=1, max_size=2, unique=True
)
rules_st = {key: st.lists(rule(key), min_size=1, max_size=2) for key in ("from", "to")}
ns_names_st = st.sampled_from(NS_NAMES)


@st.composite
def policy(draw: st.DrawFn, index: int) -> Obj:
    spec: Obj = {"podSelector": draw(pod_selector_st)}
    if draw(st.booleans()):
        spec["policyTypes"] = draw(policy_types_st)
    for key, peers_key in (("ingress", "from"), ("egress", "to")):
        if draw(st.integers(0, 3)):
            spec[key] = draw(rules_st[peers_key])
    meta = {"namespace": draw(ns_names_st), "name": f"p{index}"}
    return {"metadata": meta, "spec": spec}


CONTAINER_PORTS = [("http", 80, "TCP"), ("http", 81, "TCP"), ("http", 80, "UDP"),
                   ("web", 81, "TCP"), ("dns", 53, "UDP"), ("dns", 80, "SCTP")]  # fmt: skip
chosen_ports_st = st.lists(st.sampled_from(CONTAINER_PORTS), max_size=3, unique_by=lambda p: p[0])


@st.composite
def container_ports(draw: st.DrawFn) -> list[Obj]:
    chosen = draw(chosen_ports_st)
    return [
        {"name": name, "containerPort": port, "protocol": proto} for name, port, proto in chosen
    ]


node_names_st = st.sampled_from(["n1", "n2"])
container_ports_st = container_ports()


@st.composite
def pod(draw: st.DrawFn, index: int, ip: str) -> Obj:
    return {
        "metadata": {"namespace": draw(ns_names_st), "name": f"pod{index}",
                     "labels": draw(labels_st)},
        "spec": {"nodeName": draw(node_names_st),
                 "hostNetwork": draw(st.integers(0, 9)) == 0,
                 "containers": [{"name": "c", "ports": draw(container_ports_st)}]},
        "status": {"phase": "Pending" if draw(st.integers(0, 9)) == 0 else "Running",
                   "podIP": ip},
    }  # fmt: skip


ips_st = st.lists(st.integers(0, 15), min_size=3, max_size=8, unique=True)
ns_subset_st = st.lists(ns_names_st, unique=True)
ns_labels_st = st.dictionaries(st.sampled_from(["app", "env"]), st.sampled_from(VALUES), max_size=2)
netids_st = st.sampled_from([0, 10, 11])
plugins_st = st.sampled_from([NETWORKPOLICY, NETWORKPOLICY, NETWORKPOLICY, MULTITENANT, SUBNET])


@st.composite
def cluster(draw: st.DrawFn) -> Cluster:
    ips = draw(ips_st)
    pods = [draw(pod(i, f"10.0.0.{n}")) for i, n in enumerate(ips)]
    names = draw(ns_subset_st)
    namespaces = [{"metadata": {"name": n, "labels": draw(ns_labels_st)}} for n in names]
    with_vnid = draw(ns_subset_st)
    netnamespaces = [{"netname": n, "netid": draw(netids_st)} for n in with_vnid]
    policies = [draw(policy(i)) for i in range(draw(st.integers(1, 4)))]
    plugin = draw(plugins_st)
    return Cluster(plugin, pods, namespaces, netnamespaces, policies)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster())
def test_compiled_rules_agree_with_the_reference(world: Cluster) -> None:
    ruleset = compile_rules(
        world.plugin, world.pods, world.namespaces, world.netnamespaces, world.policies,
        node_ips=[NODE_IP],
    )  # fmt: skip
    addresses = [p["status"]["podIP"] for p in world.pods] + [NODE_IP, EXTERNAL_IP]
    parsed = {a: ipaddress.IPv4Address(a) for a in addresses}
    for src in addresses:
        for dst in addresses:
            for proto, port in PROBES:
                verdict = evaluate(ruleset, parsed[src], parsed[dst], proto, port)
                allowed, allowing = reference(world, src, dst, proto, port)
                where = f"{src} -> {dst} {proto}/{port}"
                assert verdict.allowed == allowed, where
                assert sorted(verdict.allowed_by) == sorted(allowing), where
                assert (verdict.src_vnid, verdict.dst_vnid) == (world.vnid(src), world.vnid(dst)), (
                    where
                )
