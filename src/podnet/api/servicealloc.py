"""Service allocation rules as pure functions: the ranges, what a Service asks for, and
how a free cluster IP or node port is chosen.

- Cluster IPs come from the service network (the ClusterNetwork's ``serviceNetwork``).
  The network and broadcast addresses are never used, and the first host address
  (172.30.0.1 in 172.30.0.0/16) is kept for the ``kubernetes`` service, as
  kube-apiserver does: only ``default/kubernetes`` may have it
  (``podnet.api.masterservice``).
- Node ports come from ``--service-node-port-range`` (30000-32767 by default), one
  claim per port and protocol.
- externalIPs must lie inside one of ``--external-ip-cidrs`` (OpenShift's
  ``externalIPNetworkCIDRs``); none are allowed by default.

The store side (claims, retries) is ``podnet.api.serviceallocator``.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podnet.model.errors import FieldError
from podnet.model.network import DEFAULT_SERVICE_NETWORK
from podnet.model.schemas_names import quote
from podnet.model.servicerules import needs_cluster_ip, needs_health_check_port, needs_node_ports

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_NODE_PORTS = "30000-32767"
NODE_PORT_FLAG = "--service-node-port-range"
EXTERNAL_IP_FLAG = "--external-ip-cidrs"


@dataclass(frozen=True)
class PortRange:
    """An inclusive range of node ports."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> PortRange:
        """``"30000-32767"`` (or one port); ValueError with the reason otherwise."""
        low, dash, high = text.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise ValueError(f"{text!r} is not a port range like 30000-32767") from None
        if not 1 <= first <= last <= 65535:
            raise ValueError(f"{text!r}: ports must be 1-65535, the first no larger than the last")
        return cls(first, last)

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.low <= port <= self.high

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"

    @property
    def size(self) -> int:
        return self.high - self.low + 1


def parse_cidrs(text: str) -> tuple[Network, ...]:
    """``"192.0.2.0/24,198.51.100.0/28"`` (empty: none); ValueError naming a bad entry."""
    out = []
    for entry in (e.strip() for e in text.split(",")):
        if entry:
            try:
                out.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ValueError(f"{entry!r} is not a CIDR") from None
    return tuple(out)


@dataclass(frozen=True)
class ServiceRanges:
    """The master's service settings. ``service_network`` is used until the
    ClusterNetwork exists (its ``serviceNetwork`` wins, and the two agree by design)."""

    service_network: Network = field(
        default_factory=lambda: ipaddress.ip_network(DEFAULT_SERVICE_NETWORK)
    )
    node_ports: PortRange = field(default_factory=lambda: PortRange.parse(DEFAULT_NODE_PORTS))
    external_ip_cidrs: tuple[Network, ...] = ()


# --- addresses of the service network -------------------------------------------------------


def _host_bounds(network: Network) -> tuple[int, int]:
    """First and last assignable address (as integers): no network/broadcast address."""
    first, last = int(network.network_address), int(network.broadcast_address)
    if network.version == 4 and network.prefixlen <= 30:
        return first + 1, last - 1
    if network.version == 6 and network.prefixlen <= 126:
        return first + 1, last  # IPv6 has no broadcast; the subnet-router anycast goes
    return first, last


def kubernetes_service_ip(network: Network) -> str:
    """The address kept for the ``kubernetes`` service: the first host address."""
    return str(ipaddress.ip_address(_host_bounds(network)[0]))


def ip_problem(ip: str, network: Network) -> str | None:
    """Why ``ip`` may not be a cluster IP of ``network`` (None when it may)."""
    first, last = _host_bounds(network)
    address = ipaddress.ip_address(ip)
    if address.version != network.version or not first <= int(address) <= last:
        return (
            f"the provided IP ({ip}) is not in the valid range. "
            f"The range of valid IPs is {network} (without its network and broadcast address)"
        )
    return None


def random_ip(network: Network, rng: random.Random) -> str:
    """Any assignable address but the ``kubernetes`` service's."""
    first, last = _host_bounds(network)
    low = first + 1 if last > first else first
    return str(ipaddress.ip_address(rng.randint(low, last)))


def free_ip(network: Network, taken: Iterable[str], rng: random.Random) -> str | None:
    """A random address not in ``taken`` (None when the range is full)."""
    first, last = _host_bounds(network)
    used = {int(ipaddress.ip_address(ip)) for ip in taken}
    used.add(first)  # kept for the kubernetes service
    free_count = last - first + 1 - len({u for u in used if first <= u <= last})
    if free_count <= 0:
        return None
    # The n-th free address, for a random n: one pass over the used ones, sorted.
    n = rng.randrange(free_count)
    candidate = first + n
    for u in sorted(u for u in used if first <= u <= last):
        if u <= candidate:
            candidate += 1
        else:
            break
    return str(ipaddress.ip_address(candidate))


def free_port(ports: PortRange, taken: Iterable[int], rng: random.Random) -> int | None:
    """A random port of ``ports`` not in ``taken`` (None when the range is full)."""
    used = {p for p in taken if p in ports}
    free_count = ports.size - len(used)
    if free_count <= 0:
        return None
    n = rng.randrange(free_count)
    candidate = ports.low + n
    for u in sorted(used):
        if u <= candidate:
            candidate += 1
        else:
            break
    return candidate


# --- what a Service asks for ------------------------------------------------------------------


def wants_cluster_ip(spec: Mapping[str, Any]) -> bool:
    """Whether the master must choose a cluster IP for this spec."""
    return needs_cluster_ip(spec.get("type")) and not spec.get("clusterIP")


def ports_wanting_node_port(spec: Mapping[str, Any]) -> list[int]:
    """Indexes of the ports that need a node port chosen."""
    if not needs_node_ports(spec.get("type"), spec.get("allocateLoadBalancerNodePorts")):
        return []
    return [i for i, p in enumerate(spec.get("ports") or []) if not p.get("nodePort")]


def wants_health_check_port(spec: Mapping[str, Any]) -> bool:
    """Whether the master must choose a healthCheckNodePort for this spec."""
    policy = spec.get("externalTrafficPolicy")
    return needs_health_check_port(spec.get("type"), policy) and not spec.get("healthCheckNodePort")


def node_ports_held(spec: Mapping[str, Any]) -> dict[int, int]:
    """Node port -> the service port number using it (the health check port: 0)."""
    held = {p["nodePort"]: p.get("port", 0) for p in _ports(spec) if p.get("nodePort")}
    if spec.get("healthCheckNodePort"):
        held[spec["healthCheckNodePort"]] = 0
    return held


def _ports(spec: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return [p for p in (spec or {}).get("ports") or [] if isinstance(p, Mapping)]


def requested_problems(
    spec: Mapping[str, Any], old: Mapping[str, Any] | None, ranges: ServiceRanges, network: Network
) -> list[FieldError]:
    """What the user asked for that the ranges refuse. On an update only new values are
    checked, so a Service stored under other settings stays editable."""
    out = []
    ip = spec.get("clusterIP")
    if ip and ip != "None" and ip != (old or {}).get("clusterIP"):
        why = ip_problem(str(ip), network)
        if why:
            out.append(FieldError("spec.clusterIP", f"Invalid value: {quote(ip)}: {why}"))
    old_ports = node_ports_held(old or {})
    numbers = [(f"spec.ports[{i}].nodePort", p.get("nodePort")) for i, p in enumerate(_ports(spec))]
    numbers.append(("spec.healthCheckNodePort", spec.get("healthCheckNodePort")))
    for field_path, number in numbers:
        if number and number not in old_ports and number not in ranges.node_ports:
            why = (
                f"Invalid value: {number}: provided port is not in the valid range. "
                f"The range of valid ports is {ranges.node_ports} (set by {NODE_PORT_FLAG})"
            )
            out.append(FieldError(field_path, why))
    old_ips = (old or {}).get("externalIPs")
    out += external_ip_problems(spec.get("externalIPs") or [], old_ips, ranges)
    return out


def external_ip_problems(
    ips: Sequence[str], old: Sequence[str] | None, ranges: ServiceRanges
) -> list[FieldError]:
    """Each new external IP must lie inside an allowed CIDR."""
    out = []
    allowed = ranges.external_ip_cidrs
    for i, ip in enumerate(ips):
        if ip in (old or ()):
            continue
        address = ipaddress.ip_address(ip)
        if any(address.version == net.version and address in net for net in allowed):
            continue
        if allowed:
            where = ", ".join(str(n) for n in allowed)
            why = f"it is outside the allowed CIDRs ({where}), set by {EXTERNAL_IP_FLAG}"
        else:
            why = f"no externalIPs are allowed unless the master runs with {EXTERNAL_IP_FLAG}"
        why = f"externalIP {ip} is not allowed: {why}"
        out.append(FieldError(f"spec.externalIPs[{i}]", f"Invalid value: {quote(ip)}: {why}"))
    return out
