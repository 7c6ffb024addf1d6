"""OpenShift network kinds: HostSubnet, NetNamespace, EgressNetworkPolicy.

ClusterNetwork lives in ``schemas_clusternetwork``. The shapes are OpenShift's own, so
existing manifests apply unchanged: HostSubnet and NetNamespace keep their fields at the
top level; EgressNetworkPolicy has a spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from podnet.model.kinds import CLUSTER_NETWORK, EGRESS_NETWORK_POLICY, HOST_SUBNET, NET_NAMESPACE
from podnet.model.schemas_clusternetwork import SCHEMA as CLUSTER_NETWORK_SCHEMA
from podnet.model.schemas_common import (
    REQUIRED,
    Problem,
    Schema,
    Strict,
    context_meta,
    context_old,
    fail,
    reject,
    unchanged,
)
from podnet.model.schemas_names import quote
from podnet.model.schemas_types import (
    DnsSubdomain,
    IPv4Address,
    IPv4Cidr,
    IPv4Network,
    IPv4NetworkOrEmpty,
    in_range,
    max_items,
    one_of,
)

# A HostSubnet created with this annotation and no subnet asks the master for one (for a
# host that is not a node, such as an F5 appliance).
ASSIGN_SUBNET_ANNOTATION = "pod.network.openshift.io/assign-subnet"
GLOBAL_VNID = 0  # project default and global projects: reaches and is reached by all
MIN_VNID = 10  # 1 to 9 are reserved (the OVS data plane marks pods without a VNID with 1)
MAX_VNID = (1 << 24) - 1  # VXLAN's VNI is 24 bits
MAX_EGRESS_RULES = 1000


def _not_reserved(netid: int) -> int:
    """OpenShift's rule: a NetNamespace's netid is 0 (global) or from 10 up."""
    if GLOBAL_VNID < netid < MIN_VNID:
        fail(f"{netid} is reserved: must be {GLOBAL_VNID} or at least {MIN_VNID}")
    return netid


NetID = Annotated[int, AfterValidator(in_range(0, MAX_VNID)), AfterValidator(_not_reserved)]
RuleType = Annotated[str, AfterValidator(one_of("Allow", "Deny"))]


def _equal_to_name(value: str, info: ValidationInfo) -> str:
    name = context_meta(info).get("name")
    if isinstance(name, str) and name and value != name:
        fail(f"{quote(value)} must equal metadata.name {quote(name)}")
    return value


# --- HostSubnet ----------------------------------------------------------------------------


class HostSubnetBody(Strict):
    host: str
    hostIP: IPv4Address
    subnet: IPv4NetworkOrEmpty | None = Field(None, validate_default=True)
    egressIPs: list[IPv4Address] | None = None
    egressCIDRs: list[IPv4Network] | None = None

    @field_validator("host")
    @classmethod
    def _host_is_the_name(cls, host: str, info: ValidationInfo) -> str:
        unchanged(host, context_old(info), "host")
        return _equal_to_name(host, info)

    @field_validator("subnet")
    @classmethod
    def _subnet_rules(cls, subnet: str | None, info: ValidationInfo) -> str | None:
        """Required unless the master is asked to assign one; a lease never moves."""
        annotations = context_meta(info).get("annotations")
        asked = isinstance(annotations, Mapping) and ASSIGN_SUBNET_ANNOTATION in annotations
        if not subnet and not asked:
            fail(f"Required value (or set the annotation {ASSIGN_SUBNET_ANNOTATION})", REQUIRED)
        unchanged(subnet, context_old(info), "subnet")
        return subnet


# --- NetNamespace --------------------------------------------------------------------------


class NetNamespaceBody(Strict):
    netname: str
    netid: NetID
    egressIPs: list[IPv4Address] | None = None

    @field_validator("netname")
    @classmethod
    def _netname_is_the_name(cls, netname: str, info: ValidationInfo) -> str:
        return _equal_to_name(netname, info)


# --- EgressNetworkPolicy -------------------------------------------------------------------


class EgressNetworkPeer(Strict):
    cidrSelector: IPv4Cidr | None = None
    dnsName: DnsSubdomain | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> EgressNetworkPeer:
        if (self.cidrSelector is None) == (self.dnsName is None):
            reject([Problem((), "must specify exactly one of cidrSelector or dnsName")])
        return self


class EgressNetworkPolicyRule(Strict):
    type: RuleType
    to: EgressNetworkPeer


class EgressNetworkPolicySpec(Strict):
    egress: Annotated[
        list[EgressNetworkPolicyRule], AfterValidator(max_items(MAX_EGRESS_RULES))
    ] = Field(default_factory=list)


class EgressNetworkPolicyBody(Strict):
    spec: EgressNetworkPolicySpec
    status: dict[str, Any] | None = None  # set by the server (podnet.api.egressnotice)


SCHEMAS: dict[str, Schema] = {
    CLUSTER_NETWORK.kind: CLUSTER_NETWORK_SCHEMA,
    HOST_SUBNET.kind: Schema(HostSubnetBody),
    NET_NAMESPACE.kind: Schema(NetNamespaceBody),
    EGRESS_NETWORK_POLICY.kind: Schema(EgressNetworkPolicyBody),
}
