"""Interval arithmetic for ipBlocks and port ranges: subtract, merge, normalize.

A rule's ipBlocks become one sorted list of non-overlapping IPv4 networks (each CIDR minus
its excepts, then the union over the rule's peers), and its numeric ports one sorted list
of non-overlapping ranges per protocol: the form interval sets take in nftables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from ipaddress import IPv4Address, IPv4Network, ip_network, summarize_address_range
from typing import Any

from podnet.policy.model import PortRange

Interval = tuple[int, int]  # inclusive bounds


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, non-overlapping intervals; touching ones are joined."""
    merged: list[Interval] = []
    for first, last in sorted(intervals):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(last, merged[-1][1]))
        else:
            merged.append((first, last))
    return merged


def subtract(whole: Interval, holes: Iterable[Interval]) -> list[Interval]:
    """The parts of ``whole`` outside every hole."""
    left: list[Interval] = []
    start, end = whole
    for first, last in merge(holes):
        if last < start or first > end:
            continue
        if first > start:
            left.append((start, first - 1))
        start = max(start, last + 1)
    if start <= end:
        left.append((start, end))
    return left


def _interval(cidr: str) -> Interval | None:
    """The addresses of an IPv4 CIDR; None for IPv6 (which never meets an IPv4 pod)."""
    network = ip_network(cidr, strict=False)
    if not isinstance(network, IPv4Network):
        return None
    return int(network.network_address), int(network.broadcast_address)


def ip_block_intervals(block: Mapping[str, Any]) -> list[Interval]:
    """An ipBlock ``{cidr, except}`` as address intervals, the excepts taken out."""
    excepts = tuple(str(e) for e in block.get("except") or [])
    return list(_block_intervals(str(block["cidr"]), excepts))


@lru_cache(maxsize=4096)  # policies repeat the same blocks; parsing them is the cost
def _block_intervals(cidr: str, excepts: tuple[str, ...]) -> tuple[Interval, ...]:
    whole = _interval(cidr)
    if whole is None:
        return ()
    holes = [h for h in (_interval(e) for e in excepts) if h]
    return tuple(subtract(whole, holes))


def to_networks(intervals: Iterable[Interval]) -> tuple[IPv4Network, ...]:
    """The fewest CIDR blocks covering exactly the (merged) intervals."""
    return _networks(tuple(merge(intervals)))


@lru_cache(maxsize=4096)
def _networks(merged: tuple[Interval, ...]) -> tuple[IPv4Network, ...]:
    blocks: list[IPv4Network] = []
    for first, last in merged:
        found = summarize_address_range(IPv4Address(first), IPv4Address(last))
        blocks.extend(n for n in found if isinstance(n, IPv4Network))
    return tuple(blocks)


def normalize_ports(ranges: Sequence[PortRange]) -> tuple[PortRange, ...]:
    """Port ranges merged per protocol, sorted by protocol then port."""
    out: list[PortRange] = []
    for protocol in sorted({r.protocol for r in ranges}):
        spans = merge((r.first, r.last) for r in ranges if r.protocol == protocol)
        out.extend(PortRange(protocol, first, last) for first, last in spans)
    return tuple(out)
