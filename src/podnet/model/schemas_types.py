"""Field types for the schemas: ports, addresses, networks, enums, label maps.

Each is an ``Annotated`` type whose validator rejects with a message that quotes the value
and says why, e.g. ``"10.1.2.0/33" is not a valid CIDR``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

from pydantic import AfterValidator, PlainValidator

from podnet.model.schemas_common import (
    NOT_SUPPORTED,
    TOO_MANY,
    TYPE_INVALID,
    fail,
    json_type,
)
from podnet.model.schemas_names import (
    dns_label_problem,
    dns_subdomain_problem,
    iana_service_name_problem,
    label_value_problem,
    qualified_name_problem,
    quote,
)

ANNOTATIONS_MAX_BYTES = 256 * 1024
_PREFIX_RE = re.compile(r"[0-9]{1,3}")


def in_range(low: int, high: int) -> Callable[[int], int]:
    """A validator accepting integers from ``low`` to ``high`` inclusive."""

    def check(value: int) -> int:
        if not low <= value <= high:
            fail(f"{value} must be between {low} and {high}, inclusive")
        return value

    return check


def one_of(*allowed: str) -> Callable[[str], str]:
    """A validator accepting only the given strings (a Kubernetes enum)."""
    listed = ", ".join(f'"{a}"' for a in allowed)

    def check(value: str) -> str:
        if value not in allowed:
            fail(f"Unsupported value: {quote(value)}: supported values: {listed}", NOT_SUPPORTED)
        return value

    return check


def max_items(limit: int) -> Callable[[list[Any]], list[Any]]:
    """A validator for lists of at most ``limit`` entries."""

    def check(value: list[Any]) -> list[Any]:
        if len(value) > limit:
            fail(f"must have at most {limit} items, got {len(value)}", TOO_MANY)
        return value

    return check


def _non_empty(value: list[Any]) -> list[Any]:
    if not value:
        fail("must have at least one entry")
    return value


def _name_check(problem: Callable[[str], str | None], what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        why = problem(value)
        if why:
            fail(f"{quote(value)} is not a valid {what}: {why}")
        return value

    return check


# ipaddress is exact but slow (about 10 us a parse on a small machine); IPv4, by far the
# common case, is checked with one regex instead, and only the rest goes to ipaddress.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4_RE = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")


def is_ipv4(value: str) -> bool:
    """Whether ``value`` is a dotted-quad IPv4 address (the regex, not ipaddress)."""
    return _IPV4_RE.fullmatch(value) is not None


def _ipv4_cidr_parts(value: str) -> tuple[int, int] | None:
    """``a.b.c.d/n`` as (address as an integer, prefix length), or None."""
    address, slash, prefix = value.partition("/")
    if not slash or not _IPV4_RE.fullmatch(address) or not _PREFIX_RE.fullmatch(prefix):
        return None
    length = int(prefix)
    return (int.from_bytes(socket.inet_aton(address), "big"), length) if length <= 32 else None


def _parse_cidr(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """``address/prefix`` with a decimal prefix (no netmask form), or None."""
    _address, slash, prefix = value.partition("/")
    if not slash or not _PREFIX_RE.fullmatch(prefix):
        return None
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        return None


def _ipv4_address(value: str) -> str:
    if not _IPV4_RE.fullmatch(value):
        fail(f"{quote(value)} is not a valid IPv4 address")
    return value


def check_ip(value: str) -> str:
    """Accept an IPv4 or IPv6 address."""
    if _IPV4_RE.fullmatch(value):
        return value
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        fail(f"{quote(value)} is not a valid IP address")
    return value


def _not_ipv4_cidr(value: str) -> NoReturn:
    why = "is not an IPv4 CIDR" if _parse_cidr(value) else "is not a valid CIDR"
    fail(f"{quote(value)} {why}")


def _ipv4_cidr(value: str) -> str:
    """An IPv4 CIDR; host bits may be set."""
    if _ipv4_cidr_parts(value) is None:
        _not_ipv4_cidr(value)
    return value


def _ipv4_network(value: str) -> str:
    """An IPv4 CIDR whose host bits are zero (OpenShift's canonical form)."""
    parts = _ipv4_cidr_parts(value)
    if parts is None:
        _not_ipv4_cidr(value)
    address, length = parts
    if address & ((1 << (32 - length)) - 1):
        net = ipaddress.IPv4Network(value, strict=False)
        fail(f"{quote(value)} is not a network address: host bits are set (did you mean {net}?)")
    return value


def _any_cidr(value: str) -> str:
    """A CIDR of either family; host bits may be set, as Kubernetes' own parser allows."""
    if _ipv4_cidr_parts(value) is None and _parse_cidr(value) is None:
        fail(f"{quote(value)} is not a valid CIDR")
    return value


def _or_empty(check: Callable[[str], str]) -> Callable[[str], str]:
    """``check``, but letting the empty string (Kubernetes' "unset") through."""

    def check_or_empty(value: str) -> str:
        return check(value) if value else value

    return check_or_empty


def _annotations_size(value: dict[str, str]) -> dict[str, str]:
    size = sum(len(k.encode("utf-8", "surrogatepass")) for k in value)
    size += sum(len(v.encode("utf-8", "surrogatepass")) for v in value.values())
    if size > ANNOTATIONS_MAX_BYTES:
        fail(f"may not be more than {ANNOTATIONS_MAX_BYTES} bytes in total, got {size}", TOO_MANY)
    return value


def _port_or_name(value: object) -> int | str:
    """A port given as a number 1..65535 or as an IANA service name (``http``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return in_range(1, 65535)(value)
    if isinstance(value, str):
        why = iana_service_name_problem(value)
        if why:
            fail(f"{quote(value)} is not a valid port name: {why}")
        return value
    fail(f"must be an integer or a string, got {json_type(value)}", TYPE_INVALID)


Port = Annotated[int, AfterValidator(in_range(1, 65535))]
PortOrZero = Annotated[int, AfterValidator(in_range(0, 65535))]
PortOrName = Annotated[int | str, PlainValidator(_port_or_name)]
PortName = Annotated[str, AfterValidator(_name_check(iana_service_name_problem, "port name"))]
Protocol = Annotated[str, AfterValidator(one_of("TCP", "UDP", "SCTP"))]
DnsLabel = Annotated[str, AfterValidator(_name_check(dns_label_problem, "DNS-1123 label"))]
OptionalDnsLabel = Annotated[  # empty, or a DNS-1123 label (an endpoint port's name)
    str, AfterValidator(_or_empty(_name_check(dns_label_problem, "DNS-1123 label")))
]
DnsSubdomain = Annotated[
    str, AfterValidator(_name_check(dns_subdomain_problem, "DNS-1123 subdomain"))
]
QualifiedName = Annotated[str, AfterValidator(_name_check(qualified_name_problem, "name"))]
LabelValue = Annotated[str, AfterValidator(_name_check(label_value_problem, "label value"))]
IPv4Address = Annotated[str, AfterValidator(_ipv4_address)]
IPAddress = Annotated[str, AfterValidator(check_ip)]
OptionalIP = Annotated[str, AfterValidator(_or_empty(check_ip))]
IPv4Network = Annotated[str, AfterValidator(_ipv4_network)]
IPv4NetworkOrEmpty = Annotated[str, AfterValidator(_or_empty(_ipv4_network))]
IPv4Cidr = Annotated[str, AfterValidator(_ipv4_cidr)]
Cidr = Annotated[str, AfterValidator(_any_cidr)]
OptionalCidr = Annotated[str, AfterValidator(_or_empty(_any_cidr))]
LabelKey = Annotated[str, AfterValidator(_name_check(qualified_name_problem, "label key"))]
AnnotationKey = Annotated[
    str, AfterValidator(_name_check(lambda k: qualified_name_problem(k.lower()), "annotation key"))
]
LabelMap = dict[LabelKey, LabelValue]
AnnotationMap = Annotated[dict[AnnotationKey, str], AfterValidator(_annotations_size)]
NonEmpty = AfterValidator(_non_empty)
