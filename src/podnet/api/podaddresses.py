"""Which pods hold which addresses: an index the watch cache keeps beside its pods.

Admission refuses a node's pod write that claims an address another pod already holds
(``podnet.api.admission``). Answering that by reading every pod from etcd costs seconds
once a cluster has 150,000 pods, and it would happen on every pod a node starts. The
cache already sees every pod change; it keeps, per address, the keys (``ns/name``) of
the pods whose status claims it, so the question is a dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pod_ips(pod: Mapping[str, Any] | None) -> set[str]:
    """Every address a pod's status claims (``podIP`` and ``podIPs``)."""
    status = (pod or {}).get("status")
    if not isinstance(status, Mapping):
        return set()
    ips = {status.get("podIP")}
    for entry in status.get("podIPs") or []:
        if isinstance(entry, Mapping):
            ips.add(entry.get("ip"))
    return {str(ip) for ip in ips if ip}


class PodAddresses:
    """Address -> the keys of the pods claiming it, kept in step with the pods."""

    __slots__ = ("_by_ip", "_by_key")

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[str, ...]] = {}
        self._by_ip: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def put(self, key: str, pod: Mapping[str, Any] | None) -> None:
        """The pod at ``key`` now claims what its status says (nothing: forgotten)."""
        ips = tuple(sorted(pod_ips(pod)))
        before = self._by_key.get(key, ())
        if ips == before:
            return
        self._release(key, before)
        if ips:
            self._by_key[key] = ips
            for ip in ips:
                self._by_ip.setdefault(ip, set()).add(key)
        else:
            self._by_key.pop(key, None)

    def remove(self, key: str) -> None:
        self._release(key, self._by_key.pop(key, ()))

    def holders(self, ip: str) -> set[str]:
        """The keys of the pods claiming ``ip`` (a copy)."""
        return set(self._by_ip.get(ip, ()))

    def _release(self, key: str, ips: tuple[str, ...]) -> None:
        for ip in ips:
            keys = self._by_ip.get(ip)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_ip[ip]
