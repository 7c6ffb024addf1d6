"""The kinds the API serves: names, groups, scopes and table columns.

This table is the one place that says which resources exist. The API server builds its
routes and discovery documents from it, the CLI resolves names ("hostsubnets", "hs",
"HostSubnet") through it, and the store derives its key layout from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from podnet.model.endpointcells import endpoints_cell, slice_endpoints_cell, slice_ports_cell
from podnet.model.kindtypes import Column as Column
from podnet.model.kindtypes import Kind as Kind
from podnet.model.kindtypes import Obj as Obj
from podnet.model.kindtypes import meta as _meta
from podnet.model.routecells import route_admitted, route_port, route_services, route_termination


def _pod_ready(obj: Obj) -> str:
    """READY: ready containers of all, from ``containerStatuses`` when it is written (the
    readiness the runtime reports), else 1/1 while Running."""
    found = _meta("status", "containerStatuses")(obj) or []
    statuses = [s for s in found if isinstance(s, Mapping)]
    if statuses:
        return f"{sum(1 for s in statuses if s.get('ready') is True)}/{len(statuses)}"
    phase = _meta("status", "phase")(obj)
    return "1/1" if phase == "Running" else "0/1"


def _node_status(obj: Obj) -> str:
    for cond in _meta("status", "conditions")(obj) or []:
        if cond.get("type") == "Ready":
            return "Ready" if cond.get("status") == "True" else "NotReady"
    return "Unknown"


def _node_internal_ip(obj: Obj) -> str | None:
    for addr in _meta("status", "addresses")(obj) or []:
        if addr.get("type") == "InternalIP":
            return str(addr.get("address"))
    return None


def _join(read: Callable[[Obj], Any]) -> Callable[[Obj], Any]:
    def joined(obj: Obj) -> Any:
        value = read(obj)
        if isinstance(value, list) and value:
            return ",".join(str(v) for v in value)
        return None

    return joined


def _cluster_networks(obj: Obj) -> str:
    return ",".join(str(n.get("CIDR")) for n in obj.get("clusterNetworks") or [])


def _ports(obj: Obj) -> str:
    """kubectl's PORT(S): ``80/TCP``, or ``80:30080/TCP`` with a node port."""
    out = []
    for p in _meta("spec", "ports")(obj) or []:
        node_port = f":{p['nodePort']}" if p.get("nodePort") else ""
        out.append(f"{p.get('port')}{node_port}/{p.get('protocol', 'TCP')}")
    return ",".join(out)


def _external_ip(obj: Obj) -> str:
    """kubectl's EXTERNAL-IP: externalIPs, a LoadBalancer's ingress (``<pending>`` until it
    has one), an ExternalName's name."""
    spec = obj.get("spec") or {}
    external = [str(ip) for ip in spec.get("externalIPs") or []]
    kind = spec.get("type") or "ClusterIP"
    if kind == "ExternalName":
        return str(spec.get("externalName") or "<none>")
    if kind == "LoadBalancer":
        ingress = _meta("status", "loadBalancer", "ingress")(obj) or []
        found = [str(i.get("ip") or i.get("hostname")) for i in ingress if isinstance(i, Mapping)]
        return ",".join(found + external) or "<pending>"
    return ",".join(external) or "<none>"


def _selector(obj: Obj) -> str:
    selector = _meta("spec", "selector")(obj) or {}
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "<none>"


def _pod_selector(obj: Obj) -> str:
    sel = _meta("spec", "podSelector", "matchLabels")(obj) or {}
    return ",".join(f"{k}={v}" for k, v in sorted(sel.items())) or "<none>"


NAME = Column("NAME", _meta("metadata", "name"))

NAMESPACE = Kind(
    "",
    "v1",
    "Namespace",
    "namespaces",
    False,
    ("ns",),
    (NAME, Column("STATUS", lambda o: _meta("status", "phase")(o) or "Active")),
    subresources=("status", "finalize"),
)
NODE = Kind(
    "",
    "v1",
    "Node",
    "nodes",
    False,
    ("no",),
    (NAME, Column("STATUS", _node_status), Column("INTERNAL-IP", _node_internal_ip)),
    subresources=("status",),
)
POD = Kind(
    "",
    "v1",
    "Pod",
    "pods",
    True,
    ("po",),
    (
        NAME,
        Column("READY", _pod_ready),
        Column("STATUS", _meta("status", "phase")),
        Column("IP", _meta("status", "podIP"), wide_only=True),
        Column("NODE", _meta("spec", "nodeName"), wide_only=True),
    ),
    subresources=("status",),
)
SERVICE = Kind(
    "",
    "v1",
    "Service",
    "services",
    True,
    ("svc",),
    (
        NAME,
        Column("TYPE", lambda o: _meta("spec", "type")(o) or "ClusterIP"),
        Column("CLUSTER-IP", _meta("spec", "clusterIP")),
        Column("EXTERNAL-IP", _external_ip),
        Column("PORT(S)", _ports),
        Column("SELECTOR", _selector, wide_only=True),
    ),
    subresources=("status",),
)
ENDPOINTS = Kind(
    "", "v1", "Endpoints", "endpoints", True, ("ep",), (NAME, Column("ENDPOINTS", endpoints_cell))
)
EVENT = Kind(
    "",
    "v1",
    "Event",
    "events",
    True,
    ("ev",),
    (
        Column("LAST SEEN", _meta("lastTimestamp")),
        Column("TYPE", _meta("type")),
        Column("REASON", _meta("reason")),
        Column(
            "OBJECT",
            lambda o: (
                f"{_meta('involvedObject', 'kind')(o)}/{_meta('involvedObject', 'name')(o)}".lower()
            ),
        ),
        Column("MESSAGE", _meta("message")),
    ),
)

NETWORK_GROUP = "network.openshift.io"
CLUSTER_NETWORK = Kind(
    NETWORK_GROUP,
    "v1",
    "ClusterNetwork",
    "clusternetworks",
    False,
    (),
    (
        NAME,
        Column("CLUSTER NETWORKS", _cluster_networks),
        Column("SERVICE NETWORK", _meta("serviceNetwork")),
        Column("PLUGIN NAME", _meta("pluginName")),
    ),
)
HOST_SUBNET = Kind(
    NETWORK_GROUP,
    "v1",
    "HostSubnet",
    "hostsubnets",
    False,
    ("hs",),
    (
        NAME,
        Column("HOST", _meta("host")),
        Column("HOST IP", _meta("hostIP")),
        Column("SUBNET", _meta("subnet")),
        Column("EGRESS CIDRS", _join(_meta("egressCIDRs")), wide_only=True),
        Column("EGRESS IPS", _join(_meta("egressIPs")), wide_only=True),
    ),
    unique_field="subnet",
)
NET_NAMESPACE = Kind(
    NETWORK_GROUP,
    "v1",
    "NetNamespace",
    "netnamespaces",
    False,
    ("netns",),
    (
        NAME,
        Column("NETID", _meta("netid")),
        Column("EGRESS IPS", _join(_meta("egressIPs")), wide_only=True),
    ),
)
EGRESS_NETWORK_POLICY = Kind(
    NETWORK_GROUP,
    "v1",
    "EgressNetworkPolicy",
    "egressnetworkpolicies",
    True,
    (),
    (NAME,),
)
NETWORK_POLICY = Kind(
    "networking.k8s.io",
    "v1",
    "NetworkPolicy",
    "networkpolicies",
    True,
    ("netpol",),
    (NAME, Column("POD-SELECTOR", _pod_selector)),
)
LEASE = Kind(
    "coordination.k8s.io",
    "v1",
    "Lease",
    "leases",
    True,
    (),
    (
        NAME,
        Column("HOLDER", _meta("spec", "holderIdentity")),
        Column("RENEWED", _meta("spec", "renewTime"), wide_only=True),
    ),
)
ENDPOINT_SLICE = Kind(
    "discovery.k8s.io",
    "v1",
    "EndpointSlice",
    "endpointslices",
    True,
    (),
    (
        NAME,
        Column("ADDRESSTYPE", _meta("addressType")),
        Column("PORTS", slice_ports_cell),
        Column("ENDPOINTS", slice_endpoints_cell),
    ),
)
ROUTE = Kind(
    "route.openshift.io",
    "v1",
    "Route",
    "routes",
    True,
    (),
    (
        NAME,
        Column("HOST/PORT", _meta("spec", "host")),
        Column("PATH", _meta("spec", "path")),
        Column("SERVICES", route_services),
        Column("PORT", route_port),
        Column("TERMINATION", route_termination),
        Column("ADMITTED", route_admitted),
        Column("WILDCARD", _meta("spec", "wildcardPolicy"), wide_only=True),
    ),
    subresources=("status",),
)


def _csr_condition(obj: Obj) -> str:
    """kubectl's CONDITION: Approved, Denied or Failed (and Issued), else Pending."""
    found = [
        str(c.get("type"))
        for c in _meta("status", "conditions")(obj) or []
        if isinstance(c, Mapping) and c.get("status", "True") == "True"
    ]
    if _meta("status", "certificate")(obj):
        found.append("Issued")
    return ",".join(found) or "Pending"


CERTIFICATE_SIGNING_REQUEST = Kind(
    "certificates.k8s.io",
    "v1",
    "CertificateSigningRequest",
    "certificatesigningrequests",
    False,
    ("csr",),
    (
        NAME,
        Column("SIGNERNAME", _meta("spec", "signerName")),
        Column("REQUESTOR", _meta("spec", "username")),
        Column("CONDITION", _csr_condition),
    ),
    subresources=("status", "approval"),
)

ALL_KINDS: tuple[Kind, ...] = (
    NAMESPACE,
    NODE,
    POD,
    SERVICE,
    ENDPOINTS,
    EVENT,
    CLUSTER_NETWORK,
    HOST_SUBNET,
    NET_NAMESPACE,
    EGRESS_NETWORK_POLICY,
    NETWORK_POLICY,
    LEASE,
    ENDPOINT_SLICE,
    ROUTE,
    CERTIFICATE_SIGNING_REQUEST,
)


@dataclass
class KindIndex:
    """Looks kinds up by any of their names, or by apiVersion + kind."""

    kinds: tuple[Kind, ...] = ALL_KINDS
    _by_name: dict[str, Kind] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for k in self.kinds:
            for name in k.names():
                self._by_name[name.lower()] = k

    def by_name(self, name: str) -> Kind | None:
        """Resolve what a user typed: ``hostsubnets``, ``hs``, ``HostSubnet``, ``pods.``."""
        return self._by_name.get(name.lower().rstrip("."))

    def by_kind(self, api_version: str, kind: str) -> Kind | None:
        for k in self.kinds:
            if k.api_version == api_version and k.kind == kind:
                return k
        return None

    def by_plural(self, group: str, version: str, plural: str) -> Kind | None:
        for k in self.kinds:
            if (k.group, k.version, k.plural) == (group, version, plural):
                return k
        return None

    def group_versions(self) -> dict[str, list[Kind]]:
        """Kinds grouped by their apiVersion, in table order."""
        out: dict[str, list[Kind]] = {}
        for k in self.kinds:
            out.setdefault(k.api_version, []).append(k)
        return out


KINDS = KindIndex()
