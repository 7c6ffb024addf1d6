"""Helpers for the cluster DNS's tests and benchmark: objects, queries, a fake upstream.

- ``service``, ``endpoint_slice``, ``pod``: Kubernetes objects in the API's JSON shape;
- ``ask``: one query over UDP or TCP to a server, answered as a dnslib ``DNSRecord``;
- ``StaticUpstream``: a resolver with fixed A records (NXDOMAIN for anything else) that
  counts what it is asked; the "external host" of the forwarding tests.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from dnslib import EDNS0, QTYPE, RCODE, RR, SOA, A, DNSRecord

from podnet.client import WatchEvent
from podnet.dataplane.interface import NodeNetwork
from podnet.dns.server import Listen, bound_pair
from podnet.model.kinds import Kind

Obj = dict[str, Any]


def _meta(namespace: str, name: str, **extra: Any) -> Obj:
    return {"name": name, "namespace": namespace, "resourceVersion": "1", **extra}


def service(
    namespace: str,
    name: str,
    cluster_ip: str | None = "172.30.0.10",
    ports: Iterable[tuple[str, int, str]] = (("http", 80, "TCP"),),
    **spec: Any,
) -> Obj:
    """A Service; ``cluster_ip`` None makes it headless; ``spec`` adds fields
    (``type="ExternalName", externalName=...``)."""
    body: Obj = {
        "clusterIP": "None" if cluster_ip is None else cluster_ip,
        "ports": [{"name": n, "port": p, "protocol": proto} for n, p, proto in ports],
        **spec,
    }
    if spec.get("type") == "ExternalName":
        body = dict(spec)
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(namespace, name), "spec": body}


def endpoint_slice(
    namespace: str,
    name: str,
    service_name: str,
    endpoints: Iterable[tuple[str, str | None, bool]],
    ports: Iterable[tuple[str, int, str]] = (("http", 8080, "TCP"),),
) -> Obj:
    """An EndpointSlice of ``service_name``: (address, hostname, ready) per endpoint."""
    labels = {"kubernetes.io/service-name": service_name}
    entries = []
    for address, hostname, ready in endpoints:
        entry: Obj = {"addresses": [address], "conditions": {"ready": ready}}
        if hostname:
            entry["hostname"] = hostname
        entries.append(entry)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": _meta(namespace, name, labels=labels),
        "addressType": "IPv4",
        "endpoints": entries,
        "ports": [{"name": n, "port": p, "protocol": proto} for n, p, proto in ports],
    }


def pod(namespace: str, name: str, ip: str, phase: str = "Running") -> Obj:
    """A pod with address ``ip``."""
    status = {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(namespace, name), "status": status}


def query(name: str, qtype: str = "A", edns: int | None = None) -> DNSRecord:
    """A query for ``name``/``qtype``, with an EDNS payload size when ``edns`` is given."""
    q = DNSRecord.question(name, qtype)
    if edns is not None:
        q.add_ar(EDNS0(udp_len=edns))
    return q


def ask_bytes(
    server: tuple[str, int], data: bytes, tcp: bool = False, timeout: float = 3.0
) -> bytes:
    """Send ``data`` to ``server``; the answer's bytes (TimeoutError without one)."""
    kind = socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.settimeout(timeout)
        sock.connect(server)
        if not tcp:
            sock.send(data)
            return sock.recv(65535)
        sock.sendall(struct.pack("!H", len(data)) + data)
        (size,) = struct.unpack("!H", _read(sock, 2))
        return _read(sock, size)


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("connection closed")
        data += chunk
    return data


def ask(
    server: tuple[str, int],
    name: str,
    qtype: str = "A",
    tcp: bool = False,
    edns: int | None = None,
) -> DNSRecord:
    """The parsed answer of ``server`` to ``name``/``qtype``."""
    sent = query(name, qtype, edns)
    answer = DNSRecord.parse(ask_bytes(server, bytes(sent.pack()), tcp))
    assert answer.header.id == sent.header.id
    return answer


def addresses(answer: DNSRecord) -> list[str]:
    """The A/AAAA addresses in an answer, sorted."""
    return sorted(str(rr.rdata) for rr in answer.rr if rr.rtype in (QTYPE.A, QTYPE.AAAA))


class StaticUpstream(asyncio.DatagramProtocol):
    """An upstream resolver answering ``records`` (name -> addresses) over UDP and TCP."""

    def __init__(self, records: Mapping[str, Iterable[str]], ttl: int = 60) -> None:
        self.records = {k.rstrip(".").lower(): list(v) for k, v in records.items()}
        self.ttl = ttl
        self.asked: list[tuple[str, int]] = []  # (name, id) as received
        self.silent = False  # answer nothing (a dead upstream)
        self.transport: asyncio.DatagramTransport | None = None
        self.tcp: asyncio.Server | None = None
        self.port = 0

    async def start(self, address: str = "127.0.0.1", port: int = 0) -> StaticUpstream:
        udp, tcp = bound_pair(Listen(address, port))
        self.port = tcp.getsockname()[1]
        await asyncio.get_running_loop().create_datagram_endpoint(lambda: self, sock=udp)
        self.tcp = await asyncio.start_server(self._serve_tcp, sock=tcp)
        return self

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.tcp is not None:
            self.tcp.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def answer(self, data: bytes) -> bytes | None:
        q = DNSRecord.parse(data)
        name = str(q.q.qname).rstrip(".").lower()
        self.asked.append((name, q.header.id))
        if self.silent:
            return None
        reply = q.reply()
        found = self.records.get(name)
        if found is None:
            reply.header.rcode = RCODE.NXDOMAIN
            times = (1, 3600, 600, 86400, self.ttl)
            reply.add_auth(RR("example.", QTYPE.SOA, ttl=self.ttl, rdata=SOA("ns.", "h.", times)))
        elif q.q.qtype == QTYPE.A:
            for ip in found:
                reply.add_answer(RR(q.q.qname, QTYPE.A, ttl=self.ttl, rdata=A(ip)))
        return bytes(reply.pack())

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        answer = self.answer(data)
        if answer is not None and self.transport is not None:
            self.transport.sendto(answer, addr)

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            (size,) = struct.unpack("!H", await reader.readexactly(2))
            answer = self.answer(await reader.readexactly(size))
            if answer is not None:
                writer.write(struct.pack("!H", len(answer)) + answer)
                await writer.drain()
        finally:
            writer.close()


# A node for DNS tests of the agent's side (sync, thread): its subnet is loopback's, so
# the listeners bind where a test can reach them.
NODE = NodeNetwork(
    node_name="node-1",
    node_ip=ipaddress.IPv4Address("192.0.2.10"),
    subnet=ipaddress.IPv4Network("127.0.0.0/24"),
    cluster_networks=(ipaddress.IPv4Network("10.128.0.0/14"),),
    service_network=ipaddress.IPv4Network("172.30.0.0/16"),
    mtu=1450,
)


class Feed:
    """A watch source fed by the test, one queue per kind."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[WatchEvent]] = {}

    def queue(self, kind: Kind) -> asyncio.Queue[WatchEvent]:
        return self.queues.setdefault(kind.plural, asyncio.Queue())

    async def watch(self, kind: Kind) -> AsyncIterator[WatchEvent]:
        while True:
            yield await self.queue(kind).get()
