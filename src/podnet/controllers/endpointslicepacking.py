"""Which slice each endpoint goes into (pure): few slices changed per pod change.

As Kubernetes' EndpointSlice reconciler: an endpoint that already sits in a slice of its
(address type, port set) stays there, updated in place; endpoints gone are dropped; new
ones fill the existing slices with room first (in name order), then new slices, at most
``size`` each. Adding one pod to a Service therefore rewrites one slice, not every slice
after it in address order, and each proxy and DNS server sees one event instead of many.
Existing slices left empty are not kept (the controller deletes them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from podnet.controllers.endpointsdesired import Obj, PortsKey, ports_key

Endpoint = dict[str, Any]
GroupKey = tuple[str, PortsKey]  # address type, port set
Chunk = tuple[str, PortsKey, str, list[Endpoint]]  # address type, ports, slice name, endpoints
NameFor = Callable[[str, PortsKey, int], str]  # address type, ports, index -> slice name


def _identity(endpoint: Mapping[str, Any]) -> tuple[str, ...]:
    """What makes an endpoint itself: its addresses and the pod it stands for (two
    host-network pods on one node share an address)."""
    ref = endpoint.get("targetRef") or {}
    return (*(endpoint.get("addresses") or ()), str(ref.get("namespace")), str(ref.get("name")))


def _existing(current: Iterable[Obj], group: GroupKey) -> list[Obj]:
    """The current slices of one group, in name order."""
    address_type, key = group
    return sorted(
        (
            s
            for s in current
            if s.get("addressType") == address_type
            and ports_key(_canonical(s.get("ports") or [])) == key
        ),
        key=lambda s: str(s["metadata"]["name"]),
    )


def _canonical(ports: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "name": p.get("name") or "",
            "protocol": p.get("protocol") or "TCP",
            "port": p.get("port"),
            "appProtocol": p.get("appProtocol") or "",
        }
        for p in ports
    ]


def pack_group(
    group: GroupKey,
    endpoints: list[Endpoint],
    current: Iterable[Obj],
    name_for: NameFor,
    size: int,
) -> list[Chunk]:
    """The slices of one group: existing ones kept and filled, then new ones."""
    address_type, key = group
    wanted = {_identity(e): e for e in endpoints}
    taken: set[tuple[str, ...]] = set()
    kept: list[tuple[str, list[Endpoint]]] = []
    for existing in _existing(current, group):
        members: list[Endpoint] = []
        for old in existing.get("endpoints") or []:
            identity = _identity(old)
            if identity in wanted and identity not in taken and len(members) < size:
                members.append(wanted[identity])
                taken.add(identity)
        kept.append((str(existing["metadata"]["name"]), members))
    fresh = [e for identity, e in sorted(wanted.items()) if identity not in taken]
    for _, members in kept:
        room = size - len(members)
        members.extend(fresh[:room])
        fresh = fresh[room:]
    used = {name for name, _ in kept}
    index = 0
    for start in range(0, len(fresh), size):
        while (name := name_for(address_type, key, index)) in used:
            index += 1
        used.add(name)
        kept.append((name, fresh[start : start + size]))
    return [
        (address_type, key, name, sorted(members, key=_identity))
        for name, members in kept
        if members
    ]


def pack(
    groups: Mapping[GroupKey, list[Endpoint]],
    current: Iterable[Obj],
    name_for: NameFor,
    size: int,
) -> list[Chunk]:
    """Every group's slices (see ``pack_group``), in group order."""
    existing = list(current)
    return [
        chunk
        for group, endpoints in sorted(groups.items())
        for chunk in pack_group(group, endpoints, existing, name_for, size)
    ]
