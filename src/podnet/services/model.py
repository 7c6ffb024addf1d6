"""The service proxy's desired state, backend-neutral and pure: ``ServiceTable``.

One ``ServicePort`` per (service, port): where traffic arrives (cluster IP, node port,
external IPs), which endpoints may answer it (ready ones, each marked local when it runs
on this node) and how it is treated (session affinity, external and internal traffic
policy). The linux backend renders it as nftables (``dataplane.linux.servicetable``);
``podnet trace`` may explain a verdict from the same value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network

PROTOCOLS = ("tcp", "udp", "sctp")
DEFAULT_AFFINITY_SECONDS = 10800  # Kubernetes' default sessionAffinityConfig timeout


@dataclass(frozen=True, order=True, slots=True)  # 50,000 of them at scale
class Endpoint:
    """One ready backend address and port; ``local`` when its pod runs on this node."""

    ip: IPv4Address
    port: int
    local: bool = False


@dataclass(frozen=True)
class ServicePort:
    """One port of one service, with everything needed to forward it."""

    namespace: str
    name: str
    port_name: str  # the service port's name ("" for a single unnamed port)
    protocol: str  # tcp, udp or sctp
    port: int
    cluster_ip: IPv4Address | None  # None: headless
    node_port: int | None = None
    external_ips: tuple[IPv4Address, ...] = ()
    endpoints: tuple[Endpoint, ...] = ()  # ready endpoints, sorted
    affinity_seconds: int | None = None  # sessionAffinity ClientIP and its timeout
    external_local: bool = False  # externalTrafficPolicy: Local
    internal_local: bool = False  # internalTrafficPolicy: Local

    @functools.cached_property  # kept in the instance: read per port at every render
    def service(self) -> str:
        """``namespace/name``: the key bisection leaves out."""
        return "/".join((self.namespace, self.name))

    @functools.cached_property
    def key(self) -> str:
        """``namespace/name/protocol/port name`` (the port number when unnamed)."""
        return "/".join((self.service, self.protocol, self.port_name or str(self.port)))

    def internal_endpoints(self) -> tuple[Endpoint, ...]:
        """Who answers the cluster IP: local endpoints only under internalTrafficPolicy
        Local."""
        return _local(self.endpoints) if self.internal_local else self.endpoints

    def external_endpoints(self) -> tuple[Endpoint, ...]:
        """Who answers a node port or external IP from outside this node: local
        endpoints only under externalTrafficPolicy Local."""
        return _local(self.endpoints) if self.external_local else self.endpoints


@dataclass(frozen=True)
class ServiceTable:
    """Every service port the node forwards, sorted by key, and every node's address
    (sorted): a pod's packet to any node's port is DNATed on its own node, where its
    source is still the pod's and isolation can judge it."""

    ports: tuple[ServicePort, ...] = field(default_factory=tuple)
    node_ips: tuple[IPv4Address, ...] = ()

    def services(self) -> list[str]:
        """The services (``namespace/name``) in key order, each once."""
        return sorted({p.service for p in self.ports})

    def without(self, services: frozenset[str]) -> ServiceTable:
        """The table without the ports of ``services``."""
        kept = tuple(p for p in self.ports if p.service not in services)
        return ServiceTable(kept, self.node_ips)

    def size(self) -> tuple[int, int]:
        """(service ports, endpoints)."""
        return len(self.ports), sum(len(p.endpoints) for p in self.ports)


def _local(endpoints: tuple[Endpoint, ...]) -> tuple[Endpoint, ...]:
    return tuple(e for e in endpoints if e.local)


def table_problems(table: ServiceTable, service_network: IPv4Network | None = None) -> list[str]:
    """Why a backend could not render ``table`` as it stands (empty when it can): ports
    unsorted or sharing a key, two ports on one address, protocol and port or on one node
    port, a cluster IP outside ``service_network`` (an ``IPv4Network``, when given)."""
    problems = []
    keys = [p.key for p in table.ports]
    if keys != sorted(set(keys)):
        problems.append("service ports are not sorted by key, or share a key")
    seen: dict[str, str] = {}
    for port in table.ports:
        entries = [f"{ip}/{port.protocol}/{port.port}" for ip in port.external_ips]
        if port.cluster_ip is not None:
            entries.append(f"{port.cluster_ip}/{port.protocol}/{port.port}")
            if service_network is not None and port.cluster_ip not in service_network:
                problems.append(
                    f"{port.key}: cluster IP {port.cluster_ip} is outside {service_network}"
                )
        if port.node_port is not None:
            entries.append(f"node port {port.protocol}/{port.node_port}")
        for entry in entries:
            if seen.setdefault(entry, port.service) != port.service:
                problems.append(f"{entry} is claimed by {seen[entry]} and {port.service}")
    return problems
