"""The connectivity matrix: every pod to every other pod, by ping and by TCP echo.

For each ordered pair (source, destination) two probes run from inside the source pod's
namespace: one ICMP echo (``ping -c 1 -W 1``) and one TCP connection to the echo server
on port 8080 that sends a line and waits for it to come back. Probes run concurrently in
a bounded thread pool, each with a timeout. ``render_matrix`` is pure: results in, text
out.

``probe_services`` reaches Services by name from one pod per node: glibc's ``getent``
inside the pod's namespace (``ip netns exec`` puts the pod's resolv.conf in place, so the
node's cluster DNS answers), then a TCP echo to the address it found.

``udp_probe`` sends a datagram from inside the source pod and waits for the echo (a few
bounded attempts, since UDP may lose a packet); ``probe`` picks ping, TCP or UDP by
protocol. SCTP cannot be probed: this kernel has no SCTP sockets (CONFIG_IP_SCTP off).
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

from podnet import netns

ECHO_PORT = 8080
TCP_TIMEOUT = 2.0
UDP_TIMEOUT = 1.0
UDP_ATTEMPTS = 3
MAX_WORKERS = 8
CORNER = "from \\ to"
_PING_TIME = re.compile(r"time[=<]([\d.]+) ?ms")


@dataclass(frozen=True)
class Endpoint:
    """A pod as the matrix sees it."""

    name: str  # "namespace/name" or just "name"
    node: str
    ip: str
    netns: str


@dataclass(frozen=True)
class Probe:
    """One probe's outcome: ok, and the round-trip time in milliseconds if ok."""

    ok: bool
    ms: float | None = None
    error: str = ""


@dataclass(frozen=True)
class PairResult:
    """Both probes from ``source`` to ``destination``."""

    source: str
    destination: str
    ping: Probe
    tcp: Probe

    @property
    def ok(self) -> bool:
        return self.ping.ok and self.tcp.ok


def ping_probe(source: Endpoint, ip: str) -> Probe:
    """One ICMP echo from inside ``source`` to ``ip``, waiting at most one second."""
    argv = ["ping", "-n", "-c", "1", "-W", "1", ip]
    try:
        result = netns.run(source.netns, argv, timeout=5)
    except subprocess.TimeoutExpired:
        return Probe(False, error="timeout")
    match = _PING_TIME.search(result.stdout)
    if result.returncode != 0 or match is None:
        return Probe(False, error="no reply")
    return Probe(True, float(match.group(1)))


def tcp_probe(source: Endpoint, ip: str, port: int = ECHO_PORT) -> Probe:
    """Connect from inside ``source`` to ``ip:port``, send a line, await the same line."""
    with netns.entered(source.netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    payload = f"podnet {source.name} -> {ip}\n".encode()
    start = time.perf_counter()
    try:
        with sock:
            sock.settimeout(TCP_TIMEOUT)
            sock.connect((ip, port))
            sock.sendall(payload)
            received = b""
            while len(received) < len(payload):
                chunk = sock.recv(len(payload) - len(received))
                if not chunk:
                    break
                received += chunk
    except OSError as exc:
        return _failed(exc)
    if received != payload:
        return Probe(False, error="echo mismatch")
    return Probe(True, (time.perf_counter() - start) * 1000)


def udp_probe(
    source: Endpoint, ip: str, port: int = ECHO_PORT, attempts: int = UDP_ATTEMPTS
) -> Probe:
    """Send a datagram from inside ``source`` to ``ip:port`` and await the same bytes back.

    Up to ``attempts`` datagrams, each waiting ``UDP_TIMEOUT`` seconds; an ICMP port
    unreachable (ECONNREFUSED on a connected socket) is a final answer.
    """
    with netns.entered(source.netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = f"podnet {source.name} -> {ip} udp\n".encode()
    with sock:
        sock.settimeout(UDP_TIMEOUT)
        try:
            sock.connect((ip, port))
        except OSError as exc:
            return _failed(exc)
        for _ in range(max(1, attempts)):
            answer = _udp_exchange(sock, payload)
            if answer is not None:
                return answer
    return Probe(False, error="no answer")


def _udp_exchange(sock: socket.socket, payload: bytes) -> Probe | None:
    """One datagram and its echo; None when nothing came back in time."""
    start = time.perf_counter()
    try:
        sock.send(payload)
        received = sock.recv(len(payload) + 1)
    except TimeoutError:
        return None
    except OSError as exc:
        return _failed(exc)
    if received != payload:
        return Probe(False, error="echo mismatch")
    return Probe(True, (time.perf_counter() - start) * 1000)


def _failed(exc: OSError) -> Probe:
    return Probe(False, error=type(exc).__name__ if not exc.strerror else exc.strerror)


class ProbeUnsupported(ValueError):
    """A probe this machine cannot send (SCTP), or one that lacks its port."""


def probe(source: Endpoint, dst_ip: str, protocol: str = "ICMP", port: int | None = None) -> Probe:
    """Probe ``dst_ip`` from inside ``source``: ping for ICMP, else the echo on ``port``."""
    protocol = protocol.upper()
    if protocol == "ICMP":
        return ping_probe(source, dst_ip)
    if protocol == "SCTP":
        raise ProbeUnsupported(
            "SCTP cannot be probed here: this kernel has no SCTP sockets (CONFIG_IP_SCTP is off)"
        )
    if protocol not in ("TCP", "UDP"):
        raise ProbeUnsupported(f"cannot probe protocol {protocol!r}: expected TCP, UDP or ICMP")
    if port is None:
        raise ProbeUnsupported(f"a {protocol} probe needs a port")
    if protocol == "TCP":
        return tcp_probe(source, dst_ip, port)
    return udp_probe(source, dst_ip, port)


def probe_pair(source: Endpoint, destination: Endpoint) -> PairResult:
    """Ping and TCP from ``source`` to ``destination``."""
    ping = ping_probe(source, destination.ip)
    tcp = tcp_probe(source, destination.ip)
    return PairResult(source.name, destination.name, ping, tcp)


def run_matrix(pods: Sequence[Endpoint], workers: int = MAX_WORKERS) -> list[PairResult]:
    """Probe every ordered pair of distinct pods, ``workers`` probes at a time.

    All pings run first, then all TCP probes, each phase concurrently (a failing probe
    waits for its timeout). A TCP probe times itself in Python, where threads running
    next to it skew it by milliseconds, so the pairs that answered are timed once more,
    one at a time (about a millisecond each).
    """
    pairs = [(s, d) for s in pods for d in pods if s.name != d.name]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        pings = list(pool.map(lambda pair: ping_probe(pair[0], pair[1].ip), pairs))
        tcps = list(pool.map(lambda pair: tcp_probe(pair[0], pair[1].ip), pairs))
    tcps = [_retimed(s, d, tcp) for (s, d), tcp in zip(pairs, tcps, strict=True)]
    return [
        PairResult(s.name, d.name, ping, tcp)
        for (s, d), ping, tcp in zip(pairs, pings, tcps, strict=True)
    ]


def _retimed(source: Endpoint, destination: Endpoint, first: Probe) -> Probe:
    if not first.ok:
        return first
    again = tcp_probe(source, destination.ip)
    return again if again.ok else first


def _cell(result: PairResult | None) -> str:
    if result is None:
        return "—"
    return f"{_mark(result.ping)} {_mark(result.tcp)}"


def _mark(probe: Probe) -> str:
    if not probe.ok or probe.ms is None:
        return "✗"
    return f"✓{probe.ms:.2f}"


def render_matrix(pods: Sequence[Endpoint], results: Iterable[PairResult]) -> str:
    """The matrix as text: a row per source, a column per destination, each cell
    ``<ping> <tcp>`` with ✓ and the milliseconds, or ✗; then a summary line."""
    by_pair = {(r.source, r.destination): r for r in results}
    labels = [f"{p.name} ({p.node} {p.ip})" for p in pods]
    cells = [[_cell(by_pair.get((s.name, d.name))) for d in pods] for s in pods]
    headers = [p.name for p in pods]
    widths = [max(len(headers[j]), *(len(row[j]) for row in cells)) for j in range(len(pods))]
    label_width = max([len(CORNER), *(len(label) for label in labels)])
    lines = ["  ".join([f"{CORNER:<{label_width}}", *_padded(headers, widths)])]
    for label, row in zip(labels, cells, strict=True):
        lines.append("  ".join([f"{label:<{label_width}}", *_padded(row, widths)]))
    lines.append("")
    lines.append("each cell: ping then TCP echo to :8080, round trip in ms (✗ = failed)")
    lines.append(summary(list(by_pair.values())))
    return "\n".join(line.rstrip() for line in lines)


def _padded(values: Sequence[str], widths: Sequence[int]) -> list[str]:
    return [f"{v:<{w}}" for v, w in zip(values, widths, strict=True)]


def summary(results: Sequence[PairResult]) -> str:
    """``N/M pairs ok (ping a/M, tcp b/M)`` and the failed pairs, if any."""
    total = len(results)
    pings = sum(r.ping.ok for r in results)
    tcps = sum(r.tcp.ok for r in results)
    text = (
        f"{sum(r.ok for r in results)}/{total} pairs ok (ping {pings}/{total}, tcp {tcps}/{total})"
    )
    failed = [r for r in results if not r.ok]
    for r in failed:
        why = ", ".join(
            f"{kind} {probe.error or 'failed'}"
            for kind, probe in (("ping", r.ping), ("tcp", r.tcp))
            if not probe.ok
        )
        text += f"\n  ✗ {r.source} -> {r.destination}: {why}"
    return text


# --- Services by name ----------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceTarget:
    """A Service the matrix reaches by its name ``name.namespace`` on TCP ``port``."""

    name: str
    namespace: str
    cluster_ip: str
    port: int

    @property
    def dns_name(self) -> str:
        return f"{self.name}.{self.namespace}"


class ServiceResult(NamedTuple):
    """From ``source`` (a pod on ``node``): what the name resolved to, and the TCP echo."""

    source: str
    node: str
    target: ServiceTarget
    resolved: tuple[str, ...]
    tcp: Probe

    @property
    def ok(self) -> bool:
        return self.resolved == (self.target.cluster_ip,) and self.tcp.ok


def service_targets(services: Iterable[dict[str, Any]]) -> list[ServiceTarget]:
    """The Services with a selector, a cluster IP and a TCP port (their first one)."""
    found = []
    for svc in services:
        meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
        ip = spec.get("clusterIP")
        tcp = [p for p in spec.get("ports") or [] if p.get("protocol", "TCP") == "TCP"]
        if spec.get("selector") and ip and ip != "None" and tcp:
            found.append(ServiceTarget(meta["name"], meta["namespace"], ip, int(tcp[0]["port"])))
    return sorted(found, key=lambda t: (t.namespace, t.name))


def resolve_in_pod(source: Endpoint, name: str) -> tuple[str, ...]:
    """The addresses glibc finds for ``name`` inside ``source``, through its resolv.conf."""
    argv = ["ip", "netns", "exec", source.netns, "getent", "hosts", name]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return ()
    return tuple(sorted({line.split()[0] for line in done.stdout.splitlines() if line.strip()}))


def probe_service(source: Endpoint, target: ServiceTarget) -> ServiceResult:
    """Resolve ``target`` by name inside ``source``, then TCP-echo to what it found."""
    resolved = resolve_in_pod(source, target.dns_name)
    if not resolved:
        tcp = Probe(False, error="name not resolved")
    else:
        tcp = tcp_probe(source, resolved[0], target.port)
    return ServiceResult(source.name, source.node, target, resolved, tcp)


def probe_services(
    pods: Sequence[Endpoint], targets: Sequence[ServiceTarget], workers: int = MAX_WORKERS
) -> list[ServiceResult]:
    """Every target from the first pod of each node (pods in matrix order)."""
    sources = list({pod.node: pod for pod in reversed(pods)}.values())[::-1]
    pairs = [(s, t) for t in targets for s in sources]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda pair: probe_service(*pair), pairs))


def render_services(results: Sequence[ServiceResult]) -> str:
    """One line per (node, Service): the name, what it resolved to, the TCP echo."""
    lines = ["services by name (getent in the pod, then TCP echo to the address found):"]
    width = max((len(f"{r.source} ({r.node})") for r in results), default=0)
    service_width = max((len(f"{r.target.dns_name}:{r.target.port}") for r in results), default=0)
    for r in results:
        where, service = f"{r.source} ({r.node})", f"{r.target.dns_name}:{r.target.port}"
        if r.resolved:
            mark = "✓" if r.resolved == (r.target.cluster_ip,) else "✗"
            address = f"{mark} {','.join(r.resolved)}"
        else:
            address = "✗ not resolved"
        echo = _mark(r.tcp) + (f" ({r.tcp.error})" if r.tcp.error else "")
        lines.append(f"  {where:<{width}}  {service:<{service_width}} -> {address}  tcp {echo}")
    good = sum(r.ok for r in results)
    lines.append(f"{good}/{len(results)} service lookups ok (resolved to the cluster IP, echoed)")
    return "\n".join(lines)
