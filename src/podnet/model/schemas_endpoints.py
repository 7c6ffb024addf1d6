"""v1 Endpoints, and the address and port rules it shares with EndpointSlice.

The rules are Kubernetes' (``validateEndpointSubsets``): every subset lists at least one
address (ready or not), an address is an IP that is not special (unspecified, loopback,
link-local, link-local multicast), a hostname is a DNS-1123 label, a node name a DNS-1123
subdomain, and when a subset has more than one port each one is named.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import AfterValidator, model_validator

from podnet.model.schemas_common import DUPLICATE, REQUIRED, Open, Problem, Strict, fail, reject
from podnet.model.schemas_names import quote
from podnet.model.schemas_types import (
    DnsLabel,
    DnsSubdomain,
    OptionalDnsLabel,
    Protocol,
    QualifiedName,
    check_ip,
    is_ipv4,
)
from podnet.model.schemas_types import Port as PortNumber

_SPECIAL = (
    ("is_unspecified", "may not be unspecified (0.0.0.0, ::)"),
    ("is_loopback", "may not be in the loopback range (127.0.0.0/8, ::1/128)"),
    ("is_link_local", "may not be in the link-local range (169.254.0.0/16, fe80::/10)"),
)
_MULTICAST_WHY = "may not be in the link-local multicast range (224.0.0.0/24, ff02::/16)"
_LINK_LOCAL_MULTICAST = (
    ipaddress.ip_network("224.0.0.0/24"),
    ipaddress.ip_network("ff02::/16"),
)


def _special_ipv4_problem(value: str) -> str | None:
    """``special_ip_problem`` for a valid IPv4 address, from its octets (no ipaddress)."""
    a, b, c, d = (int(part) for part in value.split("."))
    if a == 127:
        return _SPECIAL[1][1]
    if (a, b) == (169, 254):
        return _SPECIAL[2][1]
    if (a, b, c) == (224, 0, 0):
        return _MULTICAST_WHY
    return _SPECIAL[0][1] if (a, b, c, d) == (0, 0, 0, 0) else None


def special_ip_problem(value: str) -> str | None:
    """Why an endpoint may not use the address ``value`` (kube's ValidateNonSpecialIP)."""
    if is_ipv4(value):
        return _special_ipv4_problem(value)
    ip = ipaddress.ip_address(value)
    for attribute, why in _SPECIAL:
        if getattr(ip, attribute):
            return why
    if any(ip in net for net in _LINK_LOCAL_MULTICAST):
        return _MULTICAST_WHY
    return None


def endpoint_ip(value: str) -> str:
    """An endpoint's IP: a valid address of either family that is not special."""
    check_ip(value)
    why = special_ip_problem(value)
    if why:
        fail(f"{quote(value)} {why}")
    return value


EndpointIP = Annotated[str, AfterValidator(endpoint_ip)]
# An ObjectReference: every field of it (kind, namespace, name, uid, ...) is a string.
ObjectReference = dict[str, str]


def port_name_problems(names: list[str], *, required: bool, unique: bool) -> list[Problem]:
    """Names missing (when ``required``) or repeated (when ``unique``), at ``[i].name``."""
    seen: set[str] = set()
    problems = []
    for i, name in enumerate(names):
        if not name and required:
            why = "Required value: each port needs a name when there is more than one"
            problems.append(Problem((i, "name"), why, REQUIRED))
        elif unique and name in seen:
            problems.append(Problem((i, "name"), f"Duplicate value: {quote(name)}", DUPLICATE))
        seen.add(name)
    return problems


class PodEndpoint(Open):
    """What v1 Endpoints' addresses and slices' endpoints both say of their pod."""

    hostname: DnsLabel | None = None
    nodeName: DnsSubdomain | None = None
    targetRef: ObjectReference | None = None


class EndpointAddress(PodEndpoint):
    ip: EndpointIP


class EndpointPort(Open):
    name: OptionalDnsLabel | None = None
    port: PortNumber
    protocol: Protocol = "TCP"
    appProtocol: QualifiedName | None = None


class EndpointSubset(Open):
    addresses: list[EndpointAddress] | None = None
    notReadyAddresses: list[EndpointAddress] | None = None
    ports: list[EndpointPort] | None = None

    @model_validator(mode="after")
    def _addresses_and_port_names(self) -> EndpointSubset:
        problems = []
        if not self.addresses and not self.notReadyAddresses:
            why = "Required value: must specify `addresses` or `notReadyAddresses`"
            problems.append(Problem((), why, REQUIRED))
        ports = self.ports or []
        names = [p.name or "" for p in ports]
        for problem in port_name_problems(names, required=len(ports) > 1, unique=False):
            problems.append(Problem(("ports", *problem.path), problem.message, problem.reason))
        reject(problems)
        return self


class EndpointsBody(Strict):
    subsets: list[EndpointSubset] | None = None
