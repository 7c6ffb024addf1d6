"""The DNS listeners on 127.0.0.1 (a high port, no root): UDP and TCP answers, TC then
TCP, pipelined TCP, the connection and idle bounds, the client guard, and random bytes
over both transports leaving the server answering."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import struct
from collections.abc import AsyncIterator

import pytest
from dnslib import RCODE, DNSRecord

from podnet.dns.handler import QueryHandler
from podnet.dns.server import DnsServer, Limits, Listen
from podnet.dns.zone import ZoneIndex
from podnet.testing.dns import addresses, ask, ask_bytes, endpoint_slice, query, service

SVC = "web.default.svc.cluster.local"


def zone_handler() -> QueryHandler:
    zone = ZoneIndex()
    found = QueryHandler(zone, None)
    zone.on_change = found.invalidate
    zone.put_service(service("default", "web"))
    zone.put_service(service("default", "big", None))
    many = [(f"10.128.0.{i}", None, True) for i in range(1, 61)]
    zone.put_slice(endpoint_slice("default", "big", "big", many))
    return found


async def started(limits: Limits | None = None, clients: str | None = None) -> DnsServer:
    network = ipaddress.ip_network(clients) if clients else None
    server = DnsServer(zone_handler(), Listen("127.0.0.1", 0, None, network), limits)
    await server.start()
    return server


@pytest.fixture
async def server() -> AsyncIterator[DnsServer]:
    running = await started(Limits(tcp_connections=3, tcp_idle=0.3, tcp_queries=5))
    yield running
    await running.stop()


async def in_thread(*args: object, **kwargs: object) -> DNSRecord:
    return await asyncio.to_thread(ask, *args, **kwargs)  # type: ignore[arg-type]


async def test_udp_and_tcp_answers(server: DnsServer) -> None:
    where = ("127.0.0.1", server.port)
    assert addresses(await in_thread(where, SVC)) == ["172.30.0.10"]
    assert addresses(await in_thread(where, SVC, tcp=True)) == ["172.30.0.10"]


async def test_truncated_over_udp_then_whole_over_tcp(server: DnsServer) -> None:
    where = ("127.0.0.1", server.port)
    udp = await in_thread(where, "big.default.svc.cluster.local")
    assert udp.header.tc and not udp.rr
    tcp = await in_thread(where, "big.default.svc.cluster.local", tcp=True)
    assert not tcp.header.tc and len(tcp.rr) == 60


def pipelined(port: int, count: int) -> list[int]:
    """IDs of the answers to ``count`` queries written at once on one connection."""
    queries = [query(SVC) for _ in range(count)]
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        for q in queries:
            data = bytes(q.pack())
            sock.sendall(struct.pack("!H", len(data)) + data)
        ids = []
        stream = sock.makefile("rb")
        while len(ids) < count:
            head = stream.read(2)
            if len(head) < 2:
                break  # closed by the server
            ids.append(DNSRecord.parse(stream.read(struct.unpack("!H", head)[0])).header.id)
    assert [q.header.id for q in queries][: len(ids)] == ids
    return ids


async def test_pipelined_tcp_queries_up_to_the_per_connection_bound(server: DnsServer) -> None:
    assert len(await asyncio.to_thread(pipelined, server.port, 3)) == 3
    # tcp_queries=5: the sixth query on one connection is not answered (closed).
    assert len(await asyncio.to_thread(pipelined, server.port, 6)) == 5


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes ``sock`` (EOF or reset) within its timeout."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


async def test_tcp_connection_bound_and_idle_timeout(server: DnsServer) -> None:
    port = server.port
    held = [socket.create_connection(("127.0.0.1", port), timeout=3) for _ in range(3)]
    try:
        await wait_for(lambda: server.connections == 3)
        extra = socket.create_connection(("127.0.0.1", port), timeout=3)
        with extra:
            assert await asyncio.to_thread(closed_by_server, extra)  # over the bound
        # Idle connections are closed after tcp_idle (0.3 s) without a query.
        for sock in held:
            assert await asyncio.to_thread(closed_by_server, sock)
        await wait_for(lambda: server.connections == 0)
    finally:
        for sock in held:
            sock.close()
    assert addresses(await in_thread(("127.0.0.1", port), SVC, tcp=True)) == ["172.30.0.10"]


async def wait_for(condition: object, limit: int = 500) -> None:
    for _ in range(limit):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_sources_outside_the_clients_get_nothing() -> None:
    server = await started(clients="10.128.0.0/23")
    try:
        where = ("127.0.0.1", server.port)
        with pytest.raises(TimeoutError):
            await asyncio.to_thread(ask_bytes, where, bytes(query(SVC).pack()), False, 0.3)
        with pytest.raises((EOFError, ConnectionResetError)):
            await asyncio.to_thread(ask_bytes, where, bytes(query(SVC).pack()), True, 3.0)
        assert server.allowed.refused == 2
    finally:
        await server.stop()


def send_garbage(port: int, seed: int) -> None:
    rng = __import__("random").Random(seed)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for _ in range(300):
            udp.sendto(rng.randbytes(rng.randrange(0, 700)), ("127.0.0.1", port))
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", port), timeout=3) as tcp:
            size = rng.randrange(0, 70000)
            tcp.sendall(struct.pack("!H", size % 65536) + rng.randbytes(min(size, 3000)))


async def test_random_bytes_over_both_transports_leave_it_answering(server: DnsServer) -> None:
    await asyncio.to_thread(send_garbage, server.port, int.from_bytes(os.urandom(4)))
    where = ("127.0.0.1", server.port)
    assert addresses(await in_thread(where, SVC)) == ["172.30.0.10"]
    assert addresses(await in_thread(where, SVC, tcp=True)) == ["172.30.0.10"]
    assert server.serving


async def test_formerr_over_udp(server: DnsServer) -> None:
    data = bytes(query(SVC).pack())[:12] + b"\x3fbroken"
    raw = await asyncio.to_thread(ask_bytes, ("127.0.0.1", server.port), data)
    assert DNSRecord.parse(raw).header.rcode == RCODE.FORMERR
