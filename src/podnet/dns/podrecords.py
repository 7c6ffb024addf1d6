"""Pod records (``a-b-c-d.<ns>.pod.<zone>`` A), answered from the pods' addresses.

Three modes, as CoreDNS's ``pods`` option: ``verified`` (the default) answers a name only
while a pod of that namespace has the address, which takes a cluster-wide watch of Pods;
``insecure`` answers any well-formed name with the address it spells, no watch needed
(kubeadm's CoreDNS default); ``disabled`` answers none.

The records are not stored: a pod costs one entry per address here, and its record is
made when asked for (50,000 pods stored as records took ~60 MB; as addresses, a third
of that). Each change reports the names whose answers it changes: the pod's names, and
``<ns>.pod.<zone>`` / ``pod.<zone>`` when they start or stop existing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from podnet.dns.counting import count
from podnet.dns.names import dashed, is_label, undashed_ipv4
from podnet.dns.records import AAAA, A, Key, Record

NO_RECORDS: Mapping[Record, int] = {}
VERIFIED, INSECURE, DISABLED = "verified", "insecure", "disabled"
POD_RECORD_MODES = (VERIFIED, INSECURE, DISABLED)


def _address(label: str) -> str | None:
    """The address a pod name's first label stands for (canonical form), or None."""
    v4 = undashed_ipv4(label)
    if v4 is not None:
        return str(v4)
    try:
        return str(ipaddress.IPv6Address(label.replace("-", ":")))
    except ValueError:
        return None


class PodAddresses:
    """Which namespace's pods hold which addresses."""

    def __init__(self, zone: str, mode: str = VERIFIED) -> None:
        if mode not in POD_RECORD_MODES:
            raise ValueError(f"pod records {mode!r}: one of {', '.join(POD_RECORD_MODES)}")
        self.mode = mode
        self.apex = f"pod.{zone}"
        self.suffix = f".pod.{zone}"
        self.pods: dict[Key, tuple[str, ...]] = {}  # (namespace, name) -> addresses
        self._held: dict[tuple[str, str], int] = {}  # (namespace, address) -> pods
        self._namespaces: dict[str, int] = {}  # namespace -> addresses held there

    def name(self, namespace: str, address: str) -> str:
        """The pod name of ``address`` in ``namespace``."""
        return f"{dashed(address)}.{namespace}{self.suffix}"

    def put(self, key: Key, addresses: tuple[str, ...], changed: set[str]) -> None:
        """Make pod ``key`` hold ``addresses`` (none: forget it); note changed names."""
        old = self.pods.get(key, ())
        if addresses:
            self.pods[key] = addresses
        else:
            self.pods.pop(key, None)
        namespace = key[0]
        for address in addresses:  # adds first: an address kept throughout never flips
            if address not in old:
                self._count(namespace, address, 1, changed)
        for address in old:
            if address not in addresses:
                self._count(namespace, address, -1, changed)

    def _count(self, namespace: str, address: str, delta: int, changed: set[str]) -> None:
        if not count(self._held, (namespace, address), delta):
            return  # the name existed before and still does
        changed.add(self.name(namespace, address))
        if count(self._namespaces, namespace, delta):
            changed.update((f"{namespace}{self.suffix}", self.apex))

    def records(self, name: str) -> Mapping[Record, int]:
        """The A/AAAA record of a pod name (normalized), when a pod holds it."""
        if self.mode == DISABLED or not name.endswith(self.suffix):
            return NO_RECORDS
        parts = name[: -len(self.suffix)].split(".")
        if len(parts) != 2:
            return NO_RECORDS
        address = _address(parts[0])
        if address is None or not self._holds(parts[1], address):
            return NO_RECORDS
        return {Record(name, AAAA if ":" in address else A, (address,)): 1}

    def exists(self, name: str) -> bool:
        """Whether ``name`` is ``pod.<zone>``, ``<ns>.pod.<zone>`` or a pod name in use."""
        if self.mode == DISABLED:
            return False
        if name == self.apex:
            return self.mode == INSECURE or bool(self._namespaces)
        if name.endswith(self.suffix) and name.count(".") == self.suffix.count("."):
            namespace = name[: -len(self.suffix)]
            return is_label(namespace) if self.mode == INSECURE else namespace in self._namespaces
        return bool(self.records(name))

    def _holds(self, namespace: str, address: str) -> bool:
        if self.mode == INSECURE:
            return is_label(namespace)
        return (namespace, address) in self._held
