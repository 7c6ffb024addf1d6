"""Core kinds (Pod, Service, Node, Namespace, Endpoints, Event).

Their full schema is Kubernetes', which podnet does not own: these models type-check the
fields podnet reads and let every other field inside spec/status (and inside the typed
sub-objects) pass unchanged. Only the top level is closed, except for Event, which is open.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, model_validator

from podnet.model.kinds import ENDPOINTS, EVENT, NAMESPACE, NODE, POD, SERVICE
from podnet.model.schemas_common import (
    DUPLICATE,
    REQUIRED,
    Open,
    Problem,
    Schema,
    Strict,
    fail,
    reject,
)
from podnet.model.schemas_endpoints import EndpointsBody
from podnet.model.schemas_names import dns1035_label_problem, dns_label_problem, quote
from podnet.model.schemas_types import (
    Cidr,
    DnsLabel,
    IPAddress,
    LabelMap,
    OptionalCidr,
    OptionalIP,
    PortName,
    PortOrName,
    PortOrZero,
    Protocol,
    check_ip,
    one_of,
)
from podnet.model.schemas_types import Port as PortNumber

ServiceType = Annotated[
    str, AfterValidator(one_of("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"))
]
ConditionStatus = Annotated[str, AfterValidator(one_of("True", "False", "Unknown"))]
NamespacePhase = Annotated[str, AfterValidator(one_of("Active", "Terminating"))]


def _cluster_ip(value: str) -> str:
    """A Service cluster IP: an address, "None" (headless) or "" (allocate one)."""
    return value if value in ("", "None") else check_ip(value)


ClusterIP = Annotated[str, AfterValidator(_cluster_ip)]


def _service_port_name(value: str) -> str:
    """A Service port name is a DNS-1123 label (kube's rule, unlike a container port's
    IANA service name: ``kubectl create service --tcp=80:8080`` names it "80-8080"), or
    empty when the Service has one port."""
    why = dns_label_problem(value) if value else None
    if why:
        fail(f"{quote(value)} is not a valid DNS-1123 label: {why}")
    return value


ServicePortName = Annotated[str, AfterValidator(_service_port_name)]


# --- Pod ---------------------------------------------------------------------------------


class ContainerPort(Open):
    name: PortName | None = None
    containerPort: PortNumber
    protocol: Protocol = "TCP"
    hostPort: PortOrZero | None = None
    hostIP: OptionalIP | None = None


class Container(Open):
    name: DnsLabel
    image: str | None = None
    ports: list[ContainerPort] | None = None


class PodSpec(Open):
    nodeName: str | None = None
    containers: list[Container] | None = None


class PodIP(Open):
    ip: IPAddress


class PodStatus(Open):
    phase: str | None = None
    podIP: OptionalIP | None = None
    podIPs: list[PodIP] | None = None
    hostIP: OptionalIP | None = None


class PodBody(Strict):
    spec: PodSpec | None = None
    status: PodStatus | None = None


# --- Service -----------------------------------------------------------------------------


class ServicePort(Open):
    name: ServicePortName | None = None
    protocol: Protocol = "TCP"
    port: PortNumber
    targetPort: PortOrName | None = None
    nodePort: PortOrZero | None = None

    @model_validator(mode="after")
    def _default_target_port(self) -> ServicePort:
        if self.targetPort is None:
            self.targetPort = self.port
        return self


class ServiceSpec(Open):
    type: ServiceType = "ClusterIP"
    ports: list[ServicePort] | None = None
    selector: LabelMap | None = None
    clusterIP: ClusterIP | None = None
    clusterIPs: list[ClusterIP] | None = None

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


class ServiceBody(Strict):
    spec: ServiceSpec | None = None
    status: dict[str, Any] | None = None


# --- Node --------------------------------------------------------------------------------


class NodeAddress(Open):
    type: str
    address: str


class NodeCondition(Open):
    type: str
    status: ConditionStatus | None = None


class NodeSpec(Open):
    podCIDR: OptionalCidr | None = None
    podCIDRs: list[Cidr] | None = None
    unschedulable: bool | None = None


class NodeStatus(Open):
    addresses: list[NodeAddress] | None = None
    conditions: list[NodeCondition] | None = None


class NodeBody(Strict):
    spec: NodeSpec | None = None
    status: NodeStatus | None = None


# --- Namespace ---------------------------------------------------------------------------


class NamespaceSpec(Open):
    finalizers: list[str] | None = None


class NamespaceStatus(Open):
    phase: NamespacePhase | None = None


class NamespaceBody(Strict):
    spec: NamespaceSpec | None = None
    status: NamespaceStatus | None = None


# --- Endpoints: podnet.model.schemas_endpoints ------------------------------------------


# --- Event -------------------------------------------------------------------------------


class EventBody(Open):
    """Events are free-form apart from their metadata."""


SCHEMAS: dict[str, Schema] = {
    POD.kind: Schema(PodBody),
    SERVICE.kind: Schema(ServiceBody, name_rule=dns1035_label_problem),
    NODE.kind: Schema(NodeBody),
    NAMESPACE.kind: Schema(NamespaceBody, name_rule=dns_label_problem),
    ENDPOINTS.kind: Schema(EndpointsBody),
    EVENT.kind: Schema(EventBody),
}
