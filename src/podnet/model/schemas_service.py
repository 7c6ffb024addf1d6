"""The Service schema's fields: Kubernetes' field types and enums, checked field by field.

``ServiceBody`` (``podnet.model.schemas_core``) then runs what kube-apiserver's service
strategy does, in its order (``podnet.model.servicerules``):

1. on update, keep the values the master allocated when the new object leaves them out
   (clusterIP, clusterIPs, ipFamilies, nodePorts by port name), and drop the ones the
   new type no longer uses (a NodePort service turned ClusterIP loses its nodePorts);
2. the cross-field rules (which fields go with which type, clusterIP is immutable);
3. the defaults ``kubectl get svc -o yaml`` shows (sessionAffinity, traffic policies,
   ipFamilyPolicy, clusterIPs, ``status.loadBalancer``).

Choosing a free clusterIP or nodePort, and the configured ranges, need the store and the
master's flags: ``podnet.api.servicealloc`` does that, after this validation.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import AfterValidator, model_validator

from podnet.model.schemas_common import (
    DUPLICATE,
    REQUIRED,
    Open,
    Problem,
    fail,
    reject,
)
from podnet.model.schemas_names import dns_label_problem, quote
from podnet.model.schemas_types import (
    LabelMap,
    PortOrName,
    PortOrZero,
    Protocol,
    QualifiedName,
    check_ip,
    in_range,
    one_of,
)
from podnet.model.schemas_types import Port as PortNumber

ServiceType = Annotated[
    str, AfterValidator(one_of("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"))
]
Affinity = Annotated[str, AfterValidator(one_of("None", "ClientIP"))]
TrafficPolicy = Annotated[str, AfterValidator(one_of("Cluster", "Local"))]
FamilyPolicy = Annotated[
    str, AfterValidator(one_of("SingleStack", "PreferDualStack", "RequireDualStack"))
]
IPFamily = Annotated[str, AfterValidator(one_of("IPv4", "IPv6"))]
AffinityTimeout = Annotated[int, AfterValidator(in_range(1, 86400))]


def _cluster_ip(value: str) -> str:
    """A Service cluster IP: an address, "None" (headless) or "" (allocate one)."""
    return value if value in ("", "None") else check_ip(value)


def _external_ip(value: str) -> str:
    """An external IP: an address that is not unspecified, loopback or link-local."""
    address = ipaddress.ip_address(check_ip(value))
    for special, what in (
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "in the loopback range"),
        (address.is_link_local, "in the link-local range"),
        (address.is_multicast, "a multicast address"),
    ):
        if special:
            fail(f"{quote(value)} may not be {what}")
    return value


def _service_port_name(value: str) -> str:
    """A Service port name is a DNS-1123 label (kube's rule, unlike a container port's
    IANA service name: ``kubectl create service --tcp=80:8080`` names it "80-8080"), or
    empty when the Service has one port."""
    why = dns_label_problem(value) if value else None
    if why:
        fail(f"{quote(value)} is not a valid DNS-1123 label: {why}")
    return value


ClusterIP = Annotated[str, AfterValidator(_cluster_ip)]
ExternalIP = Annotated[str, AfterValidator(_external_ip)]
ServicePortName = Annotated[str, AfterValidator(_service_port_name)]


class ServicePort(Open):
    name: ServicePortName | None = None
    protocol: Protocol = "TCP"
    appProtocol: QualifiedName | None = None
    port: PortNumber
    targetPort: PortOrName | None = None
    nodePort: PortOrZero | None = None

    @model_validator(mode="after")
    def _default_target_port(self) -> ServicePort:
        if self.targetPort is None:
            self.targetPort = self.port
        return self


class ClientIPConfig(Open):
    timeoutSeconds: AffinityTimeout | None = None


class SessionAffinityConfig(Open):
    clientIP: ClientIPConfig | None = None


class ServiceSpec(Open):
    # Single-stack: one family, the service network's (see podnet.api.serviceallocator).
    ipFamilyPolicy: FamilyPolicy | None = None
    ipFamilies: list[IPFamily] | None = None
    allocateLoadBalancerNodePorts: bool | None = None
    type: ServiceType = "ClusterIP"
    healthCheckNodePort: PortOrZero | None = None
    ports: list[ServicePort] | None = None
    selector: LabelMap | None = None
    clusterIP: ClusterIP | None = None
    clusterIPs: list[ClusterIP] | None = None
    externalIPs: list[ExternalIP] | None = None
    # What the service proxy, the endpoints controller and DNS read besides:
    sessionAffinity: Affinity = "None"
    sessionAffinityConfig: SessionAffinityConfig | None = None
    externalName: str | None = None
    externalTrafficPolicy: TrafficPolicy | None = None
    internalTrafficPolicy: TrafficPolicy | None = None
    publishNotReadyAddresses: bool | None = None

    @model_validator(mode="after")
    def _port_names(self) -> ServiceSpec:
        """With more than one port every port needs a name, and names must be unique."""
        ports = self.ports or []
        seen: set[str] = set()
        problems = []
        for i, port in enumerate(ports):
            if not port.name and len(ports) > 1:
                msg = "Required value: each port needs a name when there is more than one"
                problems.append(Problem(("ports", i, "name"), msg, REQUIRED))
            elif port.name and port.name in seen:
                msg = f"Duplicate value: {quote(port.name)}"
                problems.append(Problem(("ports", i, "name"), msg, DUPLICATE))
            seen.add(port.name or "")
        reject(problems)
        return self
