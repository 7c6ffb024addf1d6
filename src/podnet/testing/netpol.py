"""The NetworkPolicy test cases, in the style of Kubernetes' e2e netpol suite.

Namespaces x, y, z each hold pods a, b, c (labels ``ns=<ns>`` and ``pod=<pod>``), which
serve ports 80 and 81 over TCP, UDP and SCTP under the names ``serve-<port>-<proto>``.
Every case writes out the full 9 x 9 matrix it expects: one row per source, one column
per destination (x/a x/b x/c, y/a y/b y/c, z/a z/b z/c), 1 allowed, 0 denied. A pod's
traffic to itself stays on its loopback and always passes.

The unit tests compile them over the fixed addresses in ``IPS``; the end-to-end tests
run them on a real cluster, where cases with an ipBlock (``Case.uses_addresses``: their
CIDRs assume ``IPS``) are rewritten for the addresses the pods really got.
"""

from __future__ import annotations

import fnmatch
import textwrap
from dataclasses import dataclass, field
from typing import Any

from podnet.model.network import NETWORKPOLICY
from podnet.policy.compile import compile_rules
from podnet.policy.evaluate import evaluate
from podnet.policy.model import RuleSet

NAMESPACES = ("x", "y", "z")
POD_NAMES = ("a", "b", "c")
KEYS = [f"{ns}/{pod}" for ns in NAMESPACES for pod in POD_NAMES]
IPS = {f"{ns}/{pod}": f"10.128.{i}.{10 + j}" for i, ns in enumerate(NAMESPACES)
       for j, pod in enumerate(POD_NAMES)}  # fmt: skip
Obj = dict[str, Any]


# --- the cluster ----------------------------------------------------------------------------


def container_ports() -> list[Obj]:
    return [
        {"name": f"cont-{port}-{proto.lower()}",
         "ports": [{"name": f"serve-{port}-{proto.lower()}", "containerPort": port,
                    "protocol": proto}]}
        for port in (80, 81) for proto in ("TCP", "UDP", "SCTP")
    ]  # fmt: skip


def make_pod(key: str, labels: dict[str, str] | None = None) -> Obj:
    ns, name = key.split("/")
    return {
        "metadata": {"namespace": ns, "name": name, "labels": labels or {"pod": name}},
        "spec": {"nodeName": "node-1" if name == "a" else "node-2",
                 "containers": container_ports()},
        "status": {"phase": "Running", "podIP": IPS[key]},
    }  # fmt: skip


def make_namespace(name: str, labels: dict[str, str] | None = None) -> Obj:
    return {"metadata": {"name": name, "labels": labels or {"ns": name}}}


def policy(ns: str, name: str, pod_selector: Obj, **spec: Any) -> Obj:
    types = spec.pop("types", None)
    body: Obj = {"podSelector": pod_selector, **spec}
    if types is not None:
        body["policyTypes"] = types
    return {"metadata": {"namespace": ns, "name": name}, "spec": body}


def sel(**labels: str) -> Obj:
    return {"matchLabels": labels}


def expr(key: str, operator: str, *values: str) -> Obj:
    found: Obj = {"key": key, "operator": operator}
    if values:
        found["values"] = list(values)
    return {"matchExpressions": [found]}


def compile_cluster(
    policies: list[Obj],
    pod_labels: dict[str, dict[str, str]] | None = None,
    ns_labels: dict[str, dict[str, str]] | None = None,
) -> RuleSet:
    pod_labels, ns_labels = pod_labels or {}, ns_labels or {}
    pods = [make_pod(k, pod_labels.get(k)) for k in KEYS]
    namespaces = [make_namespace(n, ns_labels.get(n)) for n in NAMESPACES]
    netnamespaces = [{"netname": n, "netid": 10 + i} for i, n in enumerate(NAMESPACES)]
    return compile_rules(NETWORKPOLICY, pods, namespaces, netnamespaces, policies)


def matrix(ruleset: RuleSet, protocol: str = "TCP", port: int | None = 80) -> str:
    """The 9 x 9 verdicts as rows ``x/a 111 011 111``."""
    rows = []
    for src in KEYS:
        bits = "".join(
            "1" if evaluate(ruleset, IPS[src], IPS[dst], protocol, port).allowed else "0"
            for dst in KEYS
        )
        rows.append(f"{src} {bits[0:3]} {bits[3:6]} {bits[6:9]}")
    return "\n".join(rows)


def expected(text: str) -> str:
    return textwrap.dedent(text).strip()


Rule = tuple[str, str, bool]  # (sources, destinations, allowed), as fnmatch patterns of keys


def allow(sources: str, destinations: str) -> Rule:
    """Traffic from the pods matching ``sources`` to those matching ``destinations`` passes
    (``x/a``, ``x/*`` a namespace, ``*/b`` pod b in every namespace, ``*`` every pod)."""
    return sources, destinations, True


def deny(sources: str, destinations: str) -> Rule:
    """Traffic from ``sources`` to ``destinations`` is dropped (patterns as in ``allow``)."""
    return sources, destinations, False


def grid(*rules: Rule) -> str:
    """The 9 x 9 matrix ``matrix`` prints: every pair allowed, then each rule in order
    (a later one wins); a pod's traffic to itself always passes."""
    allowed = {(src, dst): True for src in KEYS for dst in KEYS}
    for sources, destinations, verdict in rules:
        for src, dst in allowed:
            if fnmatch.fnmatchcase(src, sources) and fnmatch.fnmatchcase(dst, destinations):
                allowed[src, dst] = verdict
    rows = []
    for src in KEYS:
        bits = "".join("1" if allowed[src, dst] or src == dst else "0" for dst in KEYS)
        rows.append(f"{src} {bits[0:3]} {bits[3:6]} {bits[6:9]}")
    return "\n".join(rows)


ALL = grid()
ONLY_SELF_TO_XA = grid(deny("*", "x/a"))
XA_ONLY_TO_SELF = grid(deny("x/a", "*"))
X_ONLY_TO_SELF = grid(deny("x/*", "*"))
TO_XA_FROM_Z = grid(deny("*", "x/a"), allow("z/*", "x/a"))
TO_XA_FROM_X_AND_Z = grid(deny("y/*", "x/a"))
TO_XA_FROM_SELF_AND_YB = grid(deny("*", "x/a"), allow("y/b", "x/a"))
TO_XA_FROM_EVERY_B = grid(deny("*", "x/a"), allow("*/b", "x/a"))
TO_XA_FROM_XB = grid(deny("*", "x/a"), allow("x/b", "x/a"))
TO_XA_FROM_Y = grid(deny("*", "x/a"), allow("y/*", "x/a"))
XA_TO_SELF_AND_Y = grid(deny("x/a", "*"), allow("x/a", "y/*"))


@dataclass
class Case:
    name: str
    policies: list[Obj]
    want: str
    protocol: str = "TCP"
    port: int | None = 80
    pod_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    ns_labels: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def uses_addresses(self) -> bool:
        """Whether a policy has an ipBlock (written for the addresses in ``IPS``)."""
        return "ipBlock" in repr(self.policies)


def ingress_to_xa(*rules: Obj) -> list[Obj]:
    return [policy("x", "to-xa", sel(pod="a"), ingress=list(rules))]


def egress_from_xa(*rules: Obj) -> list[Obj]:
    return [policy("x", "from-xa", sel(pod="a"), types=["Egress"], egress=list(rules))]


def both(*peers: Obj) -> Obj:
    return {"from": list(peers)}


ALLOW_B = policy(
    "x",
    "allow-b",
    sel(pod="a"),
    ingress=[both({"namespaceSelector": {}, "podSelector": sel(pod="b")})],
)


CASES = [
    Case("no-policy", [], ALL),
    Case("deny-all-ingress", [policy("x", "deny", {}, types=["Ingress"])],
         grid(deny("*", "x/*"))),
    Case("deny-all-egress", [policy("x", "deny", {}, types=["Egress"])], X_ONLY_TO_SELF),
    Case("deny-all-both", [policy("x", "deny", {}, types=["Ingress", "Egress"])],
         grid(deny("*", "x/*"), deny("x/*", "*"))),
    Case("from-namespace", ingress_to_xa(both({"namespaceSelector": sel(ns="y")})),
         TO_XA_FROM_Y),
    Case("from-pod-same-namespace", ingress_to_xa(both({"podSelector": sel(pod="b")})),
         TO_XA_FROM_XB),
    Case("namespace-and-pod-one-peer",
         ingress_to_xa(both({"namespaceSelector": sel(ns="y"), "podSelector": sel(pod="b")})),
         TO_XA_FROM_SELF_AND_YB),
    Case("namespace-or-pod-two-peers",
         ingress_to_xa(both({"namespaceSelector": sel(ns="y")}, {"podSelector": sel(pod="b")})),
         grid(deny("*", "x/a"), allow("x/b", "x/a"), allow("y/*", "x/a"))),
    Case("pod-in-any-namespace",
         ingress_to_xa(both({"namespaceSelector": {}, "podSelector": sel(pod="b")})),
         TO_XA_FROM_EVERY_B),
    Case("ipblock-except-namespace",
         ingress_to_xa(both({"ipBlock": {"cidr": "10.128.0.0/16", "except": ["10.128.1.0/24"]}})),
         TO_XA_FROM_X_AND_Z),
    Case("ipblock-except-one-pod",
         ingress_to_xa(both({"ipBlock": {"cidr": "10.128.2.0/24", "except": ["10.128.2.11/32"]}})),
         grid(deny("*", "x/a"), allow("z/a", "x/a"), allow("z/c", "x/a"))),
    Case("egress-ipblock", egress_from_xa({"to": [{"ipBlock": {"cidr": "10.128.1.0/24"}}]}),
         XA_TO_SELF_AND_Y),
    Case("egress-ipblock-except",
         egress_from_xa({"to": [{"ipBlock": {"cidr": "10.128.0.0/16",
                                             "except": ["10.128.0.0/24"]}}]}),
         grid(deny("x/a", "x/*"))),
    Case("named-port-matches", ingress_to_xa({"ports": [{"port": "serve-80-tcp"}]}), ALL),
    Case("named-port-other-port", ingress_to_xa({"ports": [{"port": "serve-80-tcp"}]}),
         ONLY_SELF_TO_XA, port=81),
    Case("named-port-wrong-protocol",
         ingress_to_xa({"ports": [{"port": "serve-80-udp", "protocol": "TCP"}]}),
         ONLY_SELF_TO_XA),
    Case("named-port-udp", ingress_to_xa({"ports": [{"port": "serve-80-udp", "protocol": "UDP"}]}),
         ALL, protocol="UDP"),
    Case("named-port-egress",
         egress_from_xa({"ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}),
         ALL, protocol="UDP", port=81),
    Case("named-port-egress-other-port",
         egress_from_xa({"ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}),
         XA_ONLY_TO_SELF, protocol="UDP", port=80),
    Case("named-port-egress-to-ipblock",
         egress_from_xa({"to": [{"ipBlock": {"cidr": "10.128.1.0/24"}}],
                         "ports": [{"port": "serve-80-tcp"}]}),
         XA_TO_SELF_AND_Y),
    Case("endport-range-in", ingress_to_xa({"ports": [{"port": 81, "endPort": 85}]}),
         ALL, port=81),
    Case("endport-range-out", ingress_to_xa({"ports": [{"port": 81, "endPort": 85}]}),
         ONLY_SELF_TO_XA),
    Case("endport-range-udp-egress",
         egress_from_xa({"ports": [{"port": 80, "endPort": 81, "protocol": "UDP"}]}),
         ALL, protocol="UDP", port=81),
    Case("egress-port-only-allowed",
         [policy("x", "p80", {}, types=["Egress"], egress=[{"ports": [{"port": 80}]}])], ALL),
    Case("egress-port-only-denied",
         [policy("x", "p80", {}, types=["Egress"], egress=[{"ports": [{"port": 80}]}])],
         X_ONLY_TO_SELF, port=81),
    Case("union-of-policies",
         [*ingress_to_xa(both({"podSelector": sel(pod="b")})),
          policy("x", "from-z", sel(pod="a"), ingress=[both({"namespaceSelector": sel(ns="z")})])],
         grid(deny("*", "x/a"), allow("x/b", "x/a"), allow("z/*", "x/a"))),
    Case("deny-all-union-allow-all",
         [policy("x", "deny", {}, types=["Ingress"]), policy("x", "allow", {}, ingress=[{}])],
         ALL),
    Case("empty-pod-selector-same-namespace",
         [policy("x", "local", {}, ingress=[both({"podSelector": {}})])],
         grid(deny("*", "x/*"), allow("x/*", "x/*"))),
    Case("from-all-namespaces",
         [policy("x", "all", {}, ingress=[both({"namespaceSelector": {}})])], ALL),
    Case("expression-in",
         ingress_to_xa(both({"namespaceSelector": {}, "podSelector": expr("pod", "In", "b", "c")})),
         grid(deny("*", "x/a"), allow("*/b", "x/a"), allow("*/c", "x/a"))),
    Case("expression-notin", ingress_to_xa(both({"namespaceSelector": expr("ns", "NotIn", "y")})),
         TO_XA_FROM_X_AND_Z),
    Case("expression-exists",
         ingress_to_xa(both({"namespaceSelector": {}, "podSelector": expr("role", "Exists")})),
         TO_XA_FROM_SELF_AND_YB, pod_labels={"y/b": {"pod": "b", "role": "db"}}),
    Case("expression-does-not-exist",
         ingress_to_xa(both({"namespaceSelector": {},
                             "podSelector": expr("role", "DoesNotExist")})),
         grid(deny("y/b", "x/a")), pod_labels={"y/b": {"pod": "b", "role": "db"}}),
    Case("target-by-expression", [policy("x", "deny", expr("pod", "NotIn", "a"))],
         grid(deny("*", "x/b"), deny("*", "x/c"))),
    Case("sctp-allowed", ingress_to_xa({"ports": [{"protocol": "SCTP", "port": 80}]}),
         ALL, protocol="SCTP"),
    Case("sctp-rule-not-tcp", ingress_to_xa({"ports": [{"protocol": "SCTP", "port": 80}]}),
         ONLY_SELF_TO_XA),
    Case("udp-other-port", ingress_to_xa({"ports": [{"protocol": "UDP", "port": 81}]}),
         ONLY_SELF_TO_XA, protocol="UDP"),
    Case("protocol-without-port", ingress_to_xa({"ports": [{"protocol": "UDP"}]}),
         ALL, protocol="UDP", port=81),
    Case("metadata-name-label",
         ingress_to_xa(both({"namespaceSelector": sel(**{"kubernetes.io/metadata.name": "z"})})),
         TO_XA_FROM_Z),
    Case("policy-types-defaulted-from-egress",
         [policy("x", "p", sel(pod="a"), egress=[{"to": [{"namespaceSelector": sel(ns="z")}]}])],
         grid(deny("*", "x/a"), deny("x/a", "*"), allow("x/a", "z/*"))),
    Case("egress-type-ignores-ingress-rules",
         [policy("x", "p", sel(pod="a"), types=["Egress"],
                 ingress=[both({"podSelector": sel(pod="b")})], egress=[{}])], ALL),
    Case("egress-and-ingress-isolation",
         [*egress_from_xa({"to": [{"namespaceSelector": sel(ns="y")}]}),
          policy("y", "deny", {})],
         grid(deny("*", "y/*"), deny("x/a", "*"))),
    Case("egress-to-namespace",
         [policy("x", "to-y", {}, types=["Egress"],
                 egress=[{"to": [{"namespaceSelector": sel(ns="y")}]}])],
         grid(deny("x/*", "*"), allow("x/*", "y/*"))),
    Case("pod-label-changed", [ALLOW_B],
         grid(deny("*", "x/a"), allow("*/b", "x/a"), allow("y/c", "x/a")),
         pod_labels={"y/c": {"pod": "b"}}),
    Case("namespace-label-changed", ingress_to_xa(both({"namespaceSelector": sel(ns="y")})),
         grid(deny("x/*", "x/a")), ns_labels={"z": {"ns": "y"}}),
    Case("several-peers-and-ports",
         ingress_to_xa({"from": [{"podSelector": sel(pod="b")},
                                 {"namespaceSelector": sel(ns="z"), "podSelector": sel(pod="c")}],
                        "ports": [{"port": 80}, {"port": 81, "protocol": "UDP"}]}),
         grid(deny("*", "x/a"), allow("x/b", "x/a"), allow("z/c", "x/a"))),
    Case("icmp-denied-by-port-rule", ingress_to_xa({"ports": [{"port": 80}]}),
         ONLY_SELF_TO_XA, protocol="ICMP", port=None),
    Case("icmp-passes-peer-only-rule", ingress_to_xa(both({"namespaceSelector": {}})),
         ALL, protocol="ICMP", port=None),
]  # fmt: skip
