"""Kubernetes' Service rules as pure functions: which fields go with which type, what an
update keeps and drops, and the defaults the API server fills in.

The predicates (``needs_cluster_ip``...) read plain values, so the allocator
(``podnet.api.servicealloc``) and the schema (``podnet.model.schemas_service``) agree on
when a Service holds a cluster IP or node ports. The rest works on the typed spec.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from podnet.model.schemas_common import DUPLICATE, FORBIDDEN, REQUIRED, Problem
from podnet.model.schemas_names import dns_subdomain_problem, quote
from podnet.model.schemas_service import ClientIPConfig, ServiceSpec, SessionAffinityConfig

EXTERNAL_NAME = "ExternalName"
DEFAULT_AFFINITY_TIMEOUT = 10800  # seconds: kube's default for sessionAffinity ClientIP


def needs_cluster_ip(service_type: str | None) -> bool:
    """Every type but ExternalName has a cluster IP (or is headless)."""
    return (service_type or "ClusterIP") != EXTERNAL_NAME


def needs_node_ports(service_type: str | None, allocate_lb_node_ports: bool | None) -> bool:
    """NodePort services, and LoadBalancers unless allocateLoadBalancerNodePorts is false."""
    if service_type == "NodePort":
        return True
    return service_type == "LoadBalancer" and allocate_lb_node_ports is not False


def _has_node_ports(service_type: str | None) -> bool:
    return service_type in ("NodePort", "LoadBalancer")


def needs_health_check_port(service_type: str | None, external_policy: str | None) -> bool:
    """A LoadBalancer with externalTrafficPolicy Local has a healthCheckNodePort."""
    return service_type == "LoadBalancer" and external_policy == "Local"


def externally_accessible(service_type: str | None, external_ips: Sequence[str] | None) -> bool:
    """kube's rule for where externalTrafficPolicy applies."""
    if service_type in ("NodePort", "LoadBalancer"):
        return True
    return (service_type or "ClusterIP") == "ClusterIP" and bool(external_ips)


# --- update: keep what was allocated, drop what the new type does not use --------------------


def prepare_for_update(spec: ServiceSpec, old: Mapping[str, Any]) -> None:
    """kube's patchAllocatedValues then dropTypeDependentFields, on ``spec`` in place."""
    old_type = old.get("type") or "ClusterIP"
    if needs_cluster_ip(old_type) and needs_cluster_ip(spec.type):
        _keep_cluster_ip(spec, old)
    if _has_node_ports(old_type) and _has_node_ports(spec.type):
        _keep_node_ports(spec, old)
    had_check = needs_health_check_port(old_type, old.get("externalTrafficPolicy"))
    has_check = needs_health_check_port(spec.type, spec.externalTrafficPolicy)
    if had_check and has_check and not spec.healthCheckNodePort:
        spec.healthCheckNodePort = old.get("healthCheckNodePort")
    same_check = spec.healthCheckNodePort == old.get("healthCheckNodePort")
    if had_check and not has_check and same_check:
        spec.healthCheckNodePort = None
    if needs_cluster_ip(old_type) and not needs_cluster_ip(spec.type):
        _drop_cluster_ip(spec, old)
    same_node_ports = _node_ports(spec) == [p.get("nodePort") for p in old.get("ports") or []]
    if _has_node_ports(old_type) and not _has_node_ports(spec.type) and same_node_ports:
        for port in spec.ports or []:
            port.nodePort = None
    same_allocate = spec.allocateLoadBalancerNodePorts == old.get("allocateLoadBalancerNodePorts")
    if old_type == "LoadBalancer" != spec.type and same_allocate:
        spec.allocateLoadBalancerNodePorts = None
    was_external = externally_accessible(old_type, old.get("externalIPs"))
    same_policy = spec.externalTrafficPolicy == old.get("externalTrafficPolicy")
    if was_external and same_policy and not externally_accessible(spec.type, spec.externalIPs):
        spec.externalTrafficPolicy = None


def _drop_cluster_ip(spec: ServiceSpec, old: Mapping[str, Any]) -> None:
    """Turned ExternalName: clear the address fields the update left as they were."""
    if _same_ips(spec, old):
        spec.clusterIP, spec.clusterIPs = None, None
    if spec.ipFamilies == old.get("ipFamilies"):
        spec.ipFamilies = None
    if spec.ipFamilyPolicy == old.get("ipFamilyPolicy"):
        spec.ipFamilyPolicy = None
    if spec.internalTrafficPolicy == old.get("internalTrafficPolicy"):
        spec.internalTrafficPolicy = None


def _keep_cluster_ip(spec: ServiceSpec, old: Mapping[str, Any]) -> None:
    if not spec.clusterIP and old.get("clusterIP"):
        spec.clusterIP = old["clusterIP"]
    if not spec.clusterIPs and spec.clusterIP == old.get("clusterIP"):
        spec.clusterIPs = old.get("clusterIPs")
    if spec.ipFamilies is None:
        spec.ipFamilies = old.get("ipFamilies")
    if spec.ipFamilyPolicy is None:
        spec.ipFamilyPolicy = old.get("ipFamilyPolicy")


def _keep_node_ports(spec: ServiceSpec, old: Mapping[str, Any]) -> None:
    """A port without a nodePort gets the old one of the same name, unless another new
    port uses it (kube matches ports by name: the user may have changed the rest)."""
    old_ports = [p for p in old.get("ports") or [] if isinstance(p, Mapping)]
    used = {p.get("nodePort") for p in old_ports} & set(_node_ports(spec))
    by_name = {p.get("name") or "": p.get("nodePort") for p in old_ports}
    for port in spec.ports or []:
        was = by_name.get(port.name or "")
        if not port.nodePort and was and was not in used:
            port.nodePort = was


def _node_ports(spec: ServiceSpec) -> list[int | None]:
    return [p.nodePort for p in spec.ports or []]


def _same_ips(spec: ServiceSpec, old: Mapping[str, Any]) -> bool:
    return spec.clusterIP == old.get("clusterIP") and spec.clusterIPs == old.get("clusterIPs")


# --- the cross-field rules -------------------------------------------------------------------


def spec_problems(spec: ServiceSpec) -> list[Problem]:
    """Every cross-field rule ``spec`` breaks; paths are relative to the spec."""
    return [
        *_type_problems(spec),
        *_cluster_ip_problems(spec),
        *_port_problems(spec),
        *_policy_problems(spec),
    ]


def _type_problems(spec: ServiceSpec) -> Iterator[Problem]:
    if spec.type == EXTERNAL_NAME:
        yield from _external_name_problems(spec)
    elif not spec.ports and spec.clusterIP != "None":
        yield Problem(("ports",), "Required value", REQUIRED)
    if spec.allocateLoadBalancerNodePorts is not None and spec.type != "LoadBalancer":
        why = "Forbidden: may only be used when `type` is 'LoadBalancer'"
        yield Problem(("allocateLoadBalancerNodePorts",), why, FORBIDDEN)


def _external_name_problems(spec: ServiceSpec) -> Iterator[Problem]:
    name = spec.externalName
    if not name:
        yield Problem(("externalName",), "Required value", REQUIRED)
    else:
        why = dns_subdomain_problem(name.removesuffix("."))
        if why:
            yield Problem(("externalName",), f"{quote(name)} is not a valid DNS name: {why}")
    for field in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
        if getattr(spec, field):
            why = "Forbidden: may not be set for `type` ExternalName"
            yield Problem((field,), why, FORBIDDEN)


def _cluster_ip_problems(spec: ServiceSpec) -> Iterator[Problem]:
    ips = spec.clusterIPs or []
    if len(ips) > 1:
        why = f"{quote(ips)}: may hold one address: the service network is single-stack"
        yield Problem(("clusterIPs",), why)
    if ips and spec.clusterIP and ips[0] != spec.clusterIP:
        why = f"{quote(ips[0])}: must match spec.clusterIP {quote(spec.clusterIP)}"
        yield Problem(("clusterIPs", 0), why)
    if ips and ips[0] == "":
        yield Problem(("clusterIPs", 0), '"": must be a valid IP address or "None"')
    if len(spec.ipFamilies or []) > 1:
        yield Problem(("ipFamilies",), "may hold one family: the service network is single-stack")
    if spec.ipFamilyPolicy == "RequireDualStack":
        why = '"RequireDualStack": this cluster is not configured for dual-stack services'
        yield Problem(("ipFamilyPolicy",), why)


def _port_problems(spec: ServiceSpec) -> Iterator[Problem]:
    """Ports are unique per protocol. A node port is one port's, or shared only by the
    same port number over other protocols (TCP 53 and UDP 53: kube allocates it once)."""
    seen: set[tuple[int, str]] = set()
    node_ports: dict[int, tuple[int, set[str]]] = {}  # nodePort -> (port, protocols)
    for i, port in enumerate(spec.ports or []):
        if (port.port, port.protocol) in seen:
            yield Problem(("ports", i), f"Duplicate value: {port.port}/{port.protocol}", DUPLICATE)
        seen.add((port.port, port.protocol))
        if not port.nodePort:
            continue
        owner, protocols = node_ports.setdefault(port.nodePort, (port.port, set()))
        if not _has_node_ports(spec.type):
            why = f"Forbidden: may not be used when `type` is {quote(spec.type)}"
            yield Problem(("ports", i, "nodePort"), why, FORBIDDEN)
        elif owner != port.port or port.protocol in protocols:
            why = f"Duplicate value: {port.nodePort} (port {owner} uses it)"
            yield Problem(("ports", i, "nodePort"), why, DUPLICATE)
        else:
            protocols.add(port.protocol)
    yield from _health_check_problems(spec, set(node_ports))


def _health_check_problems(spec: ServiceSpec, node_ports: set[int]) -> Iterator[Problem]:
    number = spec.healthCheckNodePort
    if not number:
        return
    if not needs_health_check_port(spec.type, spec.externalTrafficPolicy):
        why = (
            f"{number}: may only be set when `type` is 'LoadBalancer' and "
            "`externalTrafficPolicy` is 'Local'"
        )
        yield Problem(("healthCheckNodePort",), why)
    elif number in node_ports:
        yield Problem(
            ("healthCheckNodePort",), f"Duplicate value: {number} is a nodePort", DUPLICATE
        )


def _policy_problems(spec: ServiceSpec) -> Iterator[Problem]:
    client_ip = spec.sessionAffinityConfig.clientIP if spec.sessionAffinityConfig else None
    if spec.sessionAffinity == "None" and client_ip is not None:
        why = "Forbidden: must not be set when spec.sessionAffinity is None"
        yield Problem(("sessionAffinityConfig", "clientIP"), why, FORBIDDEN)
    policy = spec.externalTrafficPolicy
    if policy and not externally_accessible(spec.type, spec.externalIPs):
        why = (
            f"{quote(policy)}: may only be set for externally-accessible services "
            "(type NodePort or LoadBalancer, or with externalIPs)"
        )
        yield Problem(("externalTrafficPolicy",), why)
    if spec.internalTrafficPolicy and spec.type == EXTERNAL_NAME:
        why = "Forbidden: may not be set for `type` ExternalName"
        yield Problem(("internalTrafficPolicy",), why, FORBIDDEN)


def update_problems(spec: ServiceSpec, old: Mapping[str, Any]) -> list[Problem]:
    """clusterIP may not change once set, except when the type goes to or from
    ExternalName (kube's rule; a headless service stays headless)."""
    old_type = old.get("type") or "ClusterIP"
    if not (needs_cluster_ip(old_type) and needs_cluster_ip(spec.type)):
        return []
    was = old.get("clusterIP")
    if was and spec.clusterIP != was:
        why = f"{quote(spec.clusterIP or '')}: field is immutable (was {quote(was)})"
        return [Problem(("clusterIP",), why)]
    return []


# --- defaults ----------------------------------------------------------------------------------


def apply_defaults(spec: ServiceSpec) -> None:
    """The defaults kube-apiserver fills in (the allocator adds clusterIP and ipFamilies)."""
    if spec.clusterIP and not spec.clusterIPs:
        spec.clusterIPs = [spec.clusterIP]
    elif spec.clusterIPs and not spec.clusterIP:
        spec.clusterIP = spec.clusterIPs[0]
    if spec.sessionAffinity == "ClientIP":
        config = spec.sessionAffinityConfig or SessionAffinityConfig()
        config.clientIP = config.clientIP or ClientIPConfig()
        if config.clientIP.timeoutSeconds is None:
            config.clientIP.timeoutSeconds = DEFAULT_AFFINITY_TIMEOUT
        spec.sessionAffinityConfig = config
    if spec.type == EXTERNAL_NAME:
        return
    if spec.internalTrafficPolicy is None:
        spec.internalTrafficPolicy = "Cluster"
    if spec.ipFamilyPolicy is None:
        spec.ipFamilyPolicy = "SingleStack"
    if spec.externalTrafficPolicy is None and externally_accessible(spec.type, spec.externalIPs):
        spec.externalTrafficPolicy = "Cluster"
    if spec.type == "LoadBalancer" and spec.allocateLoadBalancerNodePorts is None:
        spec.allocateLoadBalancerNodePorts = True
