"""NetworkPolicy (networking.k8s.io/v1): Kubernetes' full schema, closed to unknown fields.

Defaults applied: a port's protocol is TCP; policyTypes, when empty, is ``[Ingress]`` plus
``Egress`` when the policy has egress rules (Kubernetes' own defaulting: an empty
``egress: []`` alone does not make it an egress policy).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from podnet.model.kinds import NETWORK_POLICY
from podnet.model.schemas_common import (
    DUPLICATE,
    FORBIDDEN,
    REQUIRED,
    Problem,
    Schema,
    Strict,
    reject,
)
from podnet.model.schemas_names import quote
from podnet.model.schemas_types import (
    Cidr,
    LabelMap,
    LabelValue,
    PortOrName,
    Protocol,
    QualifiedName,
    one_of,
)

Operator = Annotated[str, AfterValidator(one_of("In", "NotIn", "Exists", "DoesNotExist"))]
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
PolicyType = Annotated[str, AfterValidator(one_of("Ingress", "Egress"))]


class LabelSelectorRequirement(Strict):
    key: QualifiedName
    operator: Operator
    values: list[LabelValue] | None = None

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        """In/NotIn need values; Exists/DoesNotExist take none."""
        if self.operator in ("In", "NotIn") and not self.values:
            why = f"Required value: must be non-empty when operator is {self.operator}"
            reject([Problem(("values",), why, REQUIRED)])
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            why = f"Forbidden: must be empty when operator is {self.operator}"
            reject([Problem(("values",), why, FORBIDDEN)])
        return self


class LabelSelector(Strict):
    matchLabels: LabelMap | None = None
    matchExpressions: list[LabelSelectorRequirement] | None = None


class IPBlock(Strict):
    cidr: Cidr
    except_: list[Cidr] | None = Field(None, alias="except")

    @model_validator(mode="after")
    def _excepts_inside(self) -> IPBlock:
        reject(self._except_problems())
        return self

    def _except_problems(self) -> Iterator[Problem]:
        """Each except must be a strict subset of cidr (and of the same family)."""
        outer = ipaddress.ip_network(self.cidr, strict=False)
        for i, text in enumerate(self.except_ or []):
            if not _strictly_inside(ipaddress.ip_network(text, strict=False), outer):
                yield Problem(
                    ("except", i), f"{quote(text)} must be a strict subset of cidr {outer}"
                )


def _strictly_inside(inner: IPNetwork, outer: IPNetwork) -> bool:
    return (
        inner.version == outer.version
        and inner.prefixlen > outer.prefixlen
        and inner.network_address in outer
    )


class NetworkPolicyPeer(Strict):
    podSelector: LabelSelector | None = None
    namespaceSelector: LabelSelector | None = None
    ipBlock: IPBlock | None = None

    @model_validator(mode="after")
    def _one_kind_of_peer(self) -> NetworkPolicyPeer:
        selectors = self.podSelector is not None or self.namespaceSelector is not None
        if self.ipBlock is None and not selectors:
            reject(
                [Problem((), "must specify podSelector, namespaceSelector or ipBlock", REQUIRED)]
            )
        if self.ipBlock is not None and selectors:
            why = "Forbidden: may not be combined with podSelector or namespaceSelector"
            reject([Problem(("ipBlock",), why, FORBIDDEN)])
        return self


class NetworkPolicyPort(Strict):
    protocol: Protocol = "TCP"
    port: PortOrName | None = None
    endPort: int | None = None

    @model_validator(mode="after")
    def _port_range(self) -> NetworkPolicyPort:
        reject(self._end_port_problems())
        return self

    def _end_port_problems(self) -> Iterator[Problem]:
        """endPort needs a numeric port, and the range must run upwards within 65535."""
        if self.endPort is None:
            return
        if not isinstance(self.port, int):
            yield Problem(("endPort",), "may not be set unless port is a number", FORBIDDEN)
        elif not self.port <= self.endPort <= 65535:
            yield Problem(
                ("endPort",), f"{self.endPort} must be between port {self.port} and 65535"
            )


class NetworkPolicyIngressRule(Strict):
    from_: list[NetworkPolicyPeer] | None = Field(None, alias="from")
    ports: list[NetworkPolicyPort] | None = None


class NetworkPolicyEgressRule(Strict):
    to: list[NetworkPolicyPeer] | None = None
    ports: list[NetworkPolicyPort] | None = None


class NetworkPolicySpec(Strict):
    podSelector: LabelSelector
    policyTypes: list[PolicyType] | None = None
    ingress: list[NetworkPolicyIngressRule] | None = None
    egress: list[NetworkPolicyEgressRule] | None = None

    @model_validator(mode="after")
    def _policy_types(self) -> NetworkPolicySpec:
        """No repeated policy type; when none is given, derive them from the rules."""
        types = self.policyTypes or []
        for i, value in enumerate(types):
            if value in types[:i]:
                reject([Problem(("policyTypes", i), f"Duplicate value: {quote(value)}", DUPLICATE)])
        if not types:
            self.policyTypes = ["Ingress", "Egress"] if self.egress else ["Ingress"]
        return self


class NetworkPolicyBody(Strict):
    spec: NetworkPolicySpec


SCHEMAS: dict[str, Schema] = {NETWORK_POLICY.kind: Schema(NetworkPolicyBody)}
