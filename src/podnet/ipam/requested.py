"""Checks of what an allocation asks for: IPv4 range sets, requested IPs per set."""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import IPv4Address

from podnet.ipam.config import IPAddress, IpamConfigError, RangeSet


def v4(ip: IPAddress) -> IPv4Address:
    """``ip`` as an IPv4 address (IpamConfigError for IPv6)."""
    if not isinstance(ip, IPv4Address):
        raise IpamConfigError(f"{ip} is not an IPv4 address")
    return ip


def ipv4_sets(range_sets: Sequence[RangeSet]) -> list[RangeSet]:
    """The range sets, checked: at least one, all IPv4."""
    if not range_sets:
        raise IpamConfigError("no range sets to allocate from")
    for i, rset in enumerate(range_sets):
        if rset.version != 4:
            raise IpamConfigError(f"range set {i} ({rset}) is IPv6; this store allocates IPv4 only")
    return list(range_sets)


def assign_requested(
    sets: Sequence[RangeSet], requested: Sequence[IPAddress]
) -> dict[int, IPv4Address]:
    """Map each requested IP to the index of the range set holding it (one per set)."""
    wanted: dict[int, IPv4Address] = {}
    for ip in map(v4, dict.fromkeys(requested)):
        index = next((i for i, s in enumerate(sets) if s.contains(ip)), None)
        if index is None:
            listing = ", ".join(str(s) for s in sets)
            raise IpamConfigError(f"requested IP {ip} is not in any range set ({listing})")
        if index in wanted:
            raise IpamConfigError(
                f"requested IPs {wanted[index]} and {ip} are both in range set {index};"
                " only one address per range set"
            )
        wanted[index] = ip
    return wanted
