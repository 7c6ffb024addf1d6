"""Core kinds (Pod, Service, Node, Namespace, Endpoints, Event).

Their full schema is Kubernetes', which podnet does not own: these models type-check the
fields podnet reads and let every other field inside spec/status (and inside the typed
sub-objects) pass unchanged. Only the top level is closed, except for Event, which is open.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, ValidationInfo, model_validator

from podnet.model.kinds import ENDPOINTS, EVENT, NAMESPACE, NODE, POD, SERVICE
from podnet.model.schemas_common import Open, Problem, Schema, Strict, context_old, reject
from podnet.model.schemas_endpoints import EndpointsBody
from podnet.model.schemas_names import dns1035_label_problem, dns_label_problem
from podnet.model.schemas_service import ServiceSpec
from podnet.model.schemas_types import (
    Cidr,
    DnsLabel,
    IPAddress,
    OptionalCidr,
    OptionalIP,
    PortName,
    PortOrZero,
    Protocol,
    one_of,
)
from podnet.model.schemas_types import Port as PortNumber
from podnet.model.servicerules import (
    apply_defaults,
    prepare_for_update,
    spec_problems,
    update_problems,
)

ConditionStatus = Annotated[str, AfterValidator(one_of("True", "False", "Unknown"))]
NamespacePhase = Annotated[str, AfterValidator(one_of("Active", "Terminating"))]


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
# Fields: podnet.model.schemas_service; kube's strategy: podnet.model.servicerules.


class ServiceBody(Strict):
    spec: ServiceSpec | None = None
    status: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _service_rules(self, info: ValidationInfo) -> ServiceBody:
        """Update patching, the cross-field rules, then the defaults (kube's order)."""
        spec = self.spec if self.spec is not None else ServiceSpec()
        old = context_old(info)
        old_spec = (old or {}).get("spec")
        old_spec = old_spec if isinstance(old_spec, dict) else {}
        problems = []
        if old is not None:
            prepare_for_update(spec, old_spec)
            problems = update_problems(spec, old_spec)
        problems += spec_problems(spec)
        reject(Problem(("spec", *p.path), p.message, p.reason) for p in problems)
        apply_defaults(spec)
        self.spec = spec
        if self.status is None:
            self.status = {"loadBalancer": {}}
        return self


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
