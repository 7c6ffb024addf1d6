"""discovery.k8s.io/v1 EndpointSlice: the endpoints of a Service, in slices.

The endpoints controller writes one or more slices per Service (label
``kubernetes.io/service-name``, ``endpointslice.kubernetes.io/managed-by``); node agents'
service proxy and DNS read them, as kube-proxy and CoreDNS do. Validation is Kubernetes'
(``ValidateEndpointSlice``): ``addressType`` IPv4, IPv6 or FQDN, immutable; at most 1000
endpoints of 1 to 100 addresses each, every address of the slice's type and (for IPs)
not special; at most 20000 ports with unique names that are empty or DNS-1123 labels.
"""

from __future__ import annotations

import contextlib
import ipaddress
from typing import Annotated

from pydantic import AfterValidator, ValidationInfo, field_validator, model_validator

from podnet.model.kinds import ENDPOINT_SLICE
from podnet.model.schemas_common import (
    REQUIRED,
    Open,
    Problem,
    Schema,
    Strict,
    context_old,
    fail,
    reject,
    unchanged,
)
from podnet.model.schemas_endpoints import (
    PodEndpoint,
    port_name_problems,
    special_ip_problem,
)
from podnet.model.schemas_names import dns_subdomain_problem, quote
from podnet.model.schemas_types import (
    OptionalDnsLabel,
    Protocol,
    QualifiedName,
    in_range,
    is_ipv4,
    max_items,
    one_of,
)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MAX_ENDPOINTS = 1000
MAX_ADDRESSES = 100
MAX_PORTS = 20000
MAX_ZONE_HINTS = 8
ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")

AddressType = Annotated[str, AfterValidator(one_of(*ADDRESS_TYPES))]
SlicePort = Annotated[int, AfterValidator(in_range(0, 65535))]
ZoneHints = Annotated[list[dict[str, str]], AfterValidator(max_items(MAX_ZONE_HINTS))]  # {name}


def _address_count(value: list[str]) -> list[str]:
    if not value:
        fail("Required value: must contain at least 1 address", REQUIRED)
    return max_items(MAX_ADDRESSES)(value)


class EndpointConditions(Open):
    ready: bool | None = None
    serving: bool | None = None
    terminating: bool | None = None


class EndpointHints(Open):
    forZones: ZoneHints | None = None


class Endpoint(PodEndpoint):
    addresses: Annotated[list[str], AfterValidator(_address_count)]
    conditions: EndpointConditions | None = None
    zone: str | None = None
    hints: EndpointHints | None = None


class SliceEndpointPort(Open):
    name: OptionalDnsLabel = ""
    port: SlicePort | None = None
    protocol: Protocol = "TCP"
    appProtocol: QualifiedName | None = None


def _is_ipv6(address: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.IPv6Address(address).version == 6
    return False


def address_problem(address_type: str, address: str) -> str | None:
    """What is wrong with ``address`` in a slice of ``address_type``, if anything."""
    if address_type == "FQDN":
        return _fqdn_problem(address)
    if not (is_ipv4(address) if address_type == "IPv4" else _is_ipv6(address)):
        return f"{quote(address)} is not a valid {address_type} address"
    why = special_ip_problem(address)
    return f"{quote(address)} {why}" if why else None


def _fqdn_problem(address: str) -> str | None:
    name = address.removesuffix(".")
    why = dns_subdomain_problem(name)
    if why:
        return f"{quote(address)} is not a valid domain name: {why}"
    if "." not in name:
        return f"{quote(address)} should be a domain with at least two segments separated by dots"
    return None


class EndpointSliceBody(Strict):
    addressType: AddressType
    endpoints: Annotated[list[Endpoint], AfterValidator(max_items(MAX_ENDPOINTS))] | None = None
    ports: Annotated[list[SliceEndpointPort], AfterValidator(max_items(MAX_PORTS))] | None = None

    @field_validator("addressType")
    @classmethod
    def _immutable_type(cls, value: str, info: ValidationInfo) -> str:
        unchanged(value, context_old(info), "addressType")
        return value

    @model_validator(mode="after")
    def _addresses_and_port_names(self) -> EndpointSliceBody:
        problems = [
            Problem(("endpoints", i, "addresses", j), why)
            for i, endpoint in enumerate(self.endpoints or [])
            for j, address in enumerate(endpoint.addresses)
            if (why := address_problem(self.addressType, address))
        ]
        names = [p.name for p in self.ports or []]
        problems += [
            Problem(("ports", *p.path), p.message, p.reason)
            for p in port_name_problems(names, required=False, unique=True)
        ]
        reject(problems)
        return self


SCHEMAS: dict[str, Schema] = {ENDPOINT_SLICE.kind: Schema(EndpointSliceBody)}
