"""Domain names as the cluster DNS handles them: lower case, no trailing dot.

Kubernetes' DNS specification compares names case-insensitively, so every name in the
zone index, and every name looked up in it, goes through ``normalize`` first. Reverse
names (``4.3.2.1.in-addr.arpa``) and dashed addresses (``10-128-0-5``, the unique id of
an endpoint without a hostname and the first label of a pod record) are made and read
here too.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator

ZONE = "cluster.local"
MAX_NAME = 253  # characters of a name without its trailing dot
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_SRV_LABEL = re.compile(r"^_[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def normalize(name: str) -> str:
    """``name`` in lower case without its trailing dot (the root is "")."""
    return name.rstrip(".").lower()


def is_label(label: str) -> bool:
    """Whether ``label`` is a DNS-1123 label (what Kubernetes names and hostnames are)."""
    return _LABEL.match(label) is not None


def is_srv_label(label: str) -> bool:
    """Whether ``label`` is ``_`` followed by a DNS-1123 label (``_http``, ``_tcp``)."""
    return _SRV_LABEL.match(label) is not None


def is_domain_name(name: str) -> bool:
    """Whether ``name`` (normalized) is a host name of labels: what ExternalName may hold."""
    if not name or len(name) > MAX_NAME:
        return False
    return all(is_label(label) for label in name.split("."))


def within(name: str, apex: str) -> bool:
    """Whether ``name`` is ``apex`` or below it (both normalized)."""
    return name == apex or name.endswith("." + apex)


def ancestors(name: str, apex: str) -> Iterator[str]:
    """``name``, its parent, ... up to and including ``apex`` (``name`` is within it)."""
    while True:
        yield name
        if name == apex or "." not in name:
            return
        name = name.split(".", 1)[1]


def dashed(ip: str) -> str:
    """An address as one label: ``10.128.0.5`` -> ``10-128-0-5``, ``fd00::1`` -> ``fd00--1``."""
    return ip.replace(".", "-").replace(":", "-")


def undashed_ipv4(label: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a dashed label stands for (``10-128-0-5``), or None."""
    parts = label.split("-")
    if len(parts) != 4 or not all(p.isdigit() and len(p) <= 3 for p in parts):
        return None
    try:
        return ipaddress.IPv4Address(".".join(str(int(p)) for p in parts))
    except ValueError:
        return None


def reverse_name(ip: str) -> str:
    """The PTR owner of an address (``in-addr.arpa`` or nibbles under ``ip6.arpa``)."""
    return ipaddress.ip_address(ip).reverse_pointer


def address_of_reverse(name: str) -> IPAddress | None:
    """The address a complete reverse name stands for, or None (partial or not reverse)."""
    if name.endswith(".in-addr.arpa"):
        parts = name[: -len(".in-addr.arpa")].split(".")
        if len(parts) == 4 and all(p.isdigit() and len(p) <= 3 for p in parts):
            try:
                return ipaddress.IPv4Address(".".join(reversed(parts)))
            except ValueError:
                return None
    elif name.endswith(".ip6.arpa"):
        nibbles = name[: -len(".ip6.arpa")].split(".")
        if len(nibbles) == 32 and all(len(n) == 1 and n in "0123456789abcdef" for n in nibbles):
            return ipaddress.IPv6Address(int("".join(reversed(nibbles)), 16))
    return None


def reverse_zone(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    """The reverse zone holding ``network``, cut at an octet (nibble) boundary above it:
    ``10.128.0.0/14`` -> ``10.in-addr.arpa``, ``172.30.0.0/16`` -> ``30.172.in-addr.arpa``."""
    if isinstance(network, ipaddress.IPv4Network):
        octets = str(network.network_address).split(".")[: network.prefixlen // 8]
        return ".".join([*reversed(octets), "in-addr.arpa"])
    nibbles = f"{int(network.network_address):032x}"[: network.prefixlen // 4]
    return ".".join([*reversed(nibbles), "ip6.arpa"])
