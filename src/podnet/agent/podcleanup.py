"""What to undo on the node, computed from the data plane's attachments and the IPAM
files alone: at agent start (half-done pods) and on a runtime's CNI GC (pods it no longer
knows). Pure functions; ``PodManager`` applies the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

from podnet.agent.podrefs import Pair
from podnet.dataplane.interface import PodAttachment

IpamEntry = tuple[IPv4Address, str, str]  # (address, container ID, ifname) as IPAM holds it


@dataclass(frozen=True)
class CleanupPlan:
    """What to undo: attachments to detach and IPAM pairs to release."""

    healthy: list[PodAttachment]
    detach: list[PodAttachment]
    release: list[Pair]


def _held(allocations: Iterable[IpamEntry]) -> dict[Pair, set[IPv4Address]]:
    held: dict[Pair, set[IPv4Address]] = {}
    for ip, cid, ifname in allocations:
        held.setdefault((cid, ifname), set()).add(ip)
    return held


def plan_restart_cleanup(
    attachments: Iterable[PodAttachment], allocations: Iterable[IpamEntry], subnet: IPv4Network
) -> CleanupPlan:
    """Healthy = attached, inside ``subnet``, and its address is held by its pair in IPAM.
    Everything else is undone: unhealthy attachments, and IPAM pairs with no healthy pod."""
    held = _held(allocations)

    def healthy(a: PodAttachment) -> bool:
        ips = held.get((a.container_id, a.ifname), set()) | held.get((a.container_id, ""), set())
        return a.address.network == subnet and a.address.ip in ips

    good = [a for a in attachments if healthy(a)]
    keys = {(a.container_id, a.ifname) for a in good} | {(a.container_id, "") for a in good}
    release = sorted(pair for pair in held if pair not in keys)
    return CleanupPlan(good, [a for a in attachments if not healthy(a)], release)


def plan_gc(
    attachments: Iterable[PodAttachment],
    allocations: Iterable[IpamEntry],
    valid: Callable[[str, str], bool],
) -> CleanupPlan:
    """GC: detach and release everything ``valid`` (the runtime's list) does not name."""
    attachments = list(attachments)
    stale = [a for a in attachments if not valid(a.container_id, a.ifname)]
    release = sorted(pair for pair in _held(allocations) if not valid(*pair))
    return CleanupPlan([a for a in attachments if a not in stale], stale, release)
