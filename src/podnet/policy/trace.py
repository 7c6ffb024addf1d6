"""What ``podnet trace`` needs around ``evaluate``: fetch, compile, resolve, compare.

- ``fetch_objects`` reads, through any client with ``get``/``list`` (the CLI's
  ``ApiClient``), exactly what the data plane compiles: pods of every namespace,
  namespaces, NetNamespaces, NetworkPolicies, the HostSubnets' host IPs and the plugin
  from the ClusterNetwork ``default``. ``ClusterObjects.ruleset`` calls ``compile_rules``,
  so the verdict comes from the same rule set a backend renders.
- ``resolve`` turns ``namespace/name`` or an IPv4 address into an address, with a clear
  ``TraceError`` for anything else.
- ``compare`` states whether a probe's outcome agrees with a verdict; any disagreement is
  a data plane bug, and the text says so. ``render_probed_matrix`` marks them in a grid.

No I/O beyond the client passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Any, Protocol

from podnet.model.kinds import (
    CLUSTER_NETWORK,
    EGRESS_NETWORK_POLICY,
    HOST_SUBNET,
    NAMESPACE,
    NET_NAMESPACE,
    NETWORK_POLICY,
    POD,
    Kind,
)
from podnet.model.network import CLUSTER_NETWORK_NAME, SUBNET
from podnet.policy.compile import cluster_pod_networks, compile_rules, hostsubnet_addresses
from podnet.policy.evaluate import Packet
from podnet.policy.explain import ALLOWED_MARK, CORNER, DENIED_MARK
from podnet.policy.model import PROTOCOLS, Endpoint, RuleSet

Obj = Mapping[str, Any]
ICMP = "ICMP"
PROBED_PROTOCOLS = ("TCP", "UDP", ICMP)
DISAGREE_MARK = "!"


class TraceError(ValueError):
    """A trace cannot be computed as asked (unknown pod, bad address, bad options)."""


class ObjectReader(Protocol):
    """The part of ``podnet.client.sync.ApiClient`` a trace uses."""

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any]: ...

    def list(self, kind: Kind, namespace: str | None = None) -> dict[str, Any]: ...


class ProbeOutcome(Protocol):
    """A probe's result (``podnet.cluster.matrix.Probe``)."""

    @property
    def ok(self) -> bool: ...

    @property
    def error(self) -> str: ...


# --- the objects and the rule set ---------------------------------------------------------


@dataclass(frozen=True)
class ClusterObjects:
    """Everything ``compile_rules`` reads, as the API returned it."""

    plugin: str
    pods: list[Obj]
    namespaces: list[Obj]
    netnamespaces: list[Obj]
    policies: list[Obj]
    node_ips: list[str]
    node_addresses: list[tuple[str, str]] = field(default_factory=list)
    pod_networks: list[str] = field(default_factory=list)
    service_network: str = ""
    egress_policies: list[Obj] = field(default_factory=list)  # EgressNetworkPolicies

    def ruleset(self) -> RuleSet:
        """The compiled rule set, as the data plane builds it."""
        return compile_rules(
            self.plugin,
            self.pods,
            self.namespaces,
            self.netnamespaces,
            self.policies,
            node_ips=self.node_ips,
            node_addresses=self.node_addresses,
            pod_networks=self.pod_networks,
        )


def fetch_objects(api: ObjectReader) -> ClusterObjects:
    """Read the plugin and every object the rule set is compiled from."""
    hostsubnets = _items(api, HOST_SUBNET)
    network = _cluster_network(api)
    return ClusterObjects(
        plugin=str(network.get("pluginName") or SUBNET),
        pods=_items(api, POD),
        namespaces=_items(api, NAMESPACE),
        netnamespaces=_items(api, NET_NAMESPACE),
        policies=_items(api, NETWORK_POLICY),
        node_ips=host_ips(hostsubnets),
        node_addresses=[pair for hs in hostsubnets for pair in hostsubnet_addresses(hs)],
        pod_networks=cluster_pod_networks(network),
        service_network=str(network.get("serviceNetwork") or ""),
        egress_policies=_items(api, EGRESS_NETWORK_POLICY),
    )


def cluster_plugin(api: ObjectReader) -> str:
    """``pluginName`` of the ClusterNetwork ``default`` (OpenShift's default: subnet)."""
    return str(_cluster_network(api).get("pluginName") or SUBNET)


def _cluster_network(api: ObjectReader) -> Obj:
    """The ClusterNetwork ``default``; a clear error while there is none."""
    from podnet.client import StatusError

    try:
        network = api.get(CLUSTER_NETWORK, None, CLUSTER_NETWORK_NAME)
    except StatusError as exc:
        if exc.code != 404:
            raise
        raise TraceError(
            f'the ClusterNetwork "{CLUSTER_NETWORK_NAME}" does not exist yet: '
            "has the master started?"
        ) from exc
    return network


def _items(api: ObjectReader, kind: Kind) -> list[Obj]:
    return list(api.list(kind).get("items") or [])


def host_ips(host_subnets: Iterable[Obj]) -> list[str]:
    """The HostSubnets' valid IPv4 ``hostIP``s (the nodes' addresses)."""
    found = []
    for subnet in host_subnets:
        try:
            found.append(str(IPv4Address(str(subnet.get("hostIP") or ""))))
        except ValueError:
            continue
    return found


# --- SRC and DST --------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A resolved SRC or DST: its address and, for a pod, its ``namespace/name``."""

    ip: IPv4Address
    pod: str | None = None


def resolve(text: str, pods: Sequence[Obj]) -> Target:
    """``namespace/name`` (a running pod with an IP) or an IPv4 address; else TraceError."""
    address = _address(text)
    if address is not None:
        return Target(address)
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise TraceError(f"{text!r} is neither namespace/name nor an IPv4 address")
    return Target(_pod_address(_find_pod(pods, namespace, name)), f"{namespace}/{name}")


def _address(text: str) -> IPv4Address | None:
    """The address ``text`` is, None when it is not one; TraceError for the wrong kind."""
    head = text.split("/", 1)[0]
    try:
        parsed = ip_address(head)
    except ValueError:
        if head == text and text.replace(".", "").isdigit():
            raise TraceError(f"{text!r} is not a valid IPv4 address") from None
        return None
    if isinstance(parsed, IPv6Address):
        raise TraceError(f"{text!r}: only IPv4 addresses are supported")
    if head != text:
        raise TraceError(f"{text!r} is a network: give one address")
    return parsed


def _find_pod(pods: Sequence[Obj], namespace: str, name: str) -> Obj:
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") == namespace and meta.get("name") == name:
            return pod
    raise TraceError(f'pod "{name}" not found in namespace "{namespace}"')


def _pod_address(pod: Obj) -> IPv4Address:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    phase = status.get("phase") or "unknown"
    try:
        ip = IPv4Address(str(status.get("podIP") or ""))
    except ValueError:
        raise TraceError(f"pod {key} has no IPv4 address yet (phase {phase})") from None
    if phase != "Running":
        raise TraceError(f"pod {key} is not running (phase {phase}): no rule covers it")
    return ip


# --- protocol and port --------------------------------------------------------------------


def packet_kind(protocol: str | None, port: int | None) -> tuple[str, int | None]:
    """The traced (protocol, port): no protocol means TCP with a port, ICMP without."""
    chosen = (protocol or (ICMP if port is None else "TCP")).upper()
    if port is not None and chosen not in PROTOCOLS:
        raise TraceError(f"--port applies to tcp, udp and sctp, not {chosen.lower()}")
    if port is not None and not 1 <= port <= 65535:
        raise TraceError(f"port {port} is not in 1..65535")
    return chosen, port


def probe_problem(protocol: str, port: int | None) -> str | None:
    """Why this packet cannot be probed from a pod here, if it cannot."""
    if protocol == "SCTP":
        return "SCTP cannot be probed here: this kernel has no SCTP sockets (CONFIG_IP_SCTP is off)"
    if protocol not in PROBED_PROTOCOLS:
        return f"{protocol.lower()} cannot be probed: use tcp, udp or ping (no --port)"
    if protocol != ICMP and port is None:
        return f"a {protocol.lower()} probe needs --port (without --port and --protocol: ping)"
    return None


# --- verdict against probe ----------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """A verdict next to what a real packet did."""

    allowed: bool
    reached: bool
    error: str = ""

    @property
    def agrees(self) -> bool:
        """Whether the data plane did what the rule set says."""
        return self.allowed == self.reached

    def line(self) -> str:
        """``probe: connected (data plane agrees)``, or a loud DISAGREEMENT line."""
        seen = "connected" if self.reached else "no answer"
        if self.agrees:
            return f"probe: {seen} (data plane agrees)"
        said = "ALLOWED" if self.allowed else "DENIED"
        got = "connected" if self.reached else f"got no answer ({self.error or 'failed'})"
        return f"DISAGREEMENT: the rules say {said} but the probe {got}: a data plane bug"


def compare(allowed: bool, outcome: ProbeOutcome) -> Comparison:
    """Compare a verdict with a probe's outcome."""
    return Comparison(allowed, outcome.ok, "" if outcome.ok else outcome.error)


# --- the matrix ---------------------------------------------------------------------------


def select_endpoints(ruleset: RuleSet, namespaces: Sequence[str] = ()) -> list[Endpoint]:
    """The rule set's pods (of ``namespaces``, or all), by ``namespace/name``."""
    chosen = [e for e in ruleset.endpoints if not namespaces or e.namespace in namespaces]
    if not chosen:
        where = f" in namespaces {', '.join(namespaces)}" if namespaces else ""
        raise TraceError(f"no running pods with an IP{where}")
    return sorted(chosen, key=lambda e: e.key)


def matrix_legend(ruleset: RuleSet, protocol: str, port: int | None) -> str:
    """The line under a grid: the marks, the traced service and the mode."""
    from podnet.policy.explain import mode_name

    service = Packet.service_text(protocol, port)
    marks = f"{ALLOWED_MARK} allowed, {DENIED_MARK} denied"
    return f"{marks}: {service}, mode {mode_name(ruleset.plugin)}"


def render_probed_matrix(
    names: Sequence[str],
    allowed: Mapping[tuple[str, str], bool],
    probed: Mapping[tuple[str, str], Comparison],
) -> str:
    """The verdict grid with ``!`` on every probed pair whose probe disagrees, then a list
    of the disagreements and a count."""
    width = max([len(CORNER), *(len(n) for n in names)])
    column = max([2, *(len(n) for n in names)])
    rows = [" ".join([CORNER.ljust(width), *(n.ljust(column) for n in names)]).rstrip()]
    for src in names:
        cells = [_probed_cell(allowed.get((src, dst)), probed.get((src, dst))) for dst in names]
        rows.append(" ".join([src.ljust(width), *(c.ljust(column) for c in cells)]).rstrip())
    rows.append(f"{DISAGREE_MARK} = the probe disagrees with the rules (a data plane bug)")
    rows += [f"{s} -> {d}: {c.line()}" for (s, d), c in sorted(probed.items()) if not c.agrees]
    bad = sum(not c.agrees for c in probed.values())
    rows.append(f"probed {len(probed)} pairs: {len(probed) - bad} agree, {bad} disagree")
    return "\n".join(rows)


def _probed_cell(allowed: bool | None, comparison: Comparison | None) -> str:
    mark = "?" if allowed is None else ALLOWED_MARK if allowed else DENIED_MARK
    return mark + (DISAGREE_MARK if comparison is not None and not comparison.agrees else "")
