"""Who holds a pod address, as of etcd's current revision (for admission's checks).

From the watch cache's pod-address index (``podnet.api.podaddresses``) once the cache
has caught up with etcd's current revision; else (no cache, or it lags) from a read of
every pod. NodeRestriction's admission asks it before a node gives a pod an address,
ControllerRestriction before the controllers publish an address as a Service's endpoint.
"""

from __future__ import annotations

from collections.abc import Set

from podnet.api.listing import CONSISTENT_WAIT
from podnet.api.podaddresses import pod_ips
from podnet.api.registry import Registry
from podnet.api.watchcache import WatchCache
from podnet.model.kinds import POD


async def address_holders(
    registry: Registry, cache: WatchCache | None, ips: Set[str]
) -> dict[str, set[str]]:
    """``ns/name`` of the pods claiming each of ``ips``."""
    if cache is not None:
        current = await registry.store.revision()
        if await cache.wait_for(current, CONSISTENT_WAIT):
            return {ip: cache.pod_addresses.holders(ip) for ip in ips}
    pods, _ = await registry.list(POD)
    holders: dict[str, set[str]] = {}
    for other in pods:
        other_meta = other["metadata"]
        key = f"{other_meta.get('namespace')}/{other_meta.get('name')}"
        for ip in set(ips) & pod_ips(other):
            holders.setdefault(ip, set()).add(key)
    return holders
