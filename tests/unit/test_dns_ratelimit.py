"""Per-client DNS limits: the token buckets (a stopped clock), the listeners dropping a
client's UDP queries beyond its buckets and pacing its TCP ones, the per-client TCP
connection bound, the per-client forward bound answered REFUSED, and the counters in
the agent's ``/metrics``. On 127.0.0.1, a high port, no root."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
from dnslib import RCODE, DNSRecord
from prometheus_client import CollectorRegistry, generate_latest

from podnet.dns.forwarder import Forwarder
from podnet.dns.handler import QueryHandler
from podnet.dns.metrics import DnsCollector
from podnet.dns.ratelimit import ClientLimits, Slots, TokenBuckets
from podnet.dns.server import DnsServer, Limits, Listen
from podnet.dns.upstreams import Upstreams
from podnet.dns.zone import ZoneIndex
from podnet.testing.dns import StaticUpstream, query, service

SVC = "web.default.svc.cluster.local"


class Clock:
    """A clock that moves only when the test says."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_holds_two_seconds_and_refills_at_its_rate() -> None:
    buckets = TokenBuckets(qps=10)
    assert [buckets.take("a", 0.0) for _ in range(21)].count(True) == 20
    assert buckets.limited == 1
    assert buckets.take("b", 0.0)  # another client has its own bucket
    assert [buckets.take("a", 0.5) for _ in range(6)].count(True) == 5  # 0.5 s: 5 tokens
    assert [buckets.take("a", 100.0) for _ in range(25)].count(True) == 20  # never above 2 s


def test_reserving_gives_each_waiter_its_own_slot() -> None:
    buckets = TokenBuckets(qps=2)
    for _ in range(4):
        assert buckets.reserve("a", 0.0, longest=10) == 0.0
    assert buckets.reserve("a", 0.0, longest=10) == pytest.approx(0.5)
    assert buckets.reserve("a", 0.0, longest=10) == pytest.approx(1.0)
    assert buckets.reserve("a", 0.0, longest=1.2) is None  # too long: nothing reserved
    assert buckets.reserve("a", 1.0, longest=10) == pytest.approx(0.5)


def test_slots_per_client() -> None:
    slots = Slots(2)
    assert slots.acquire("a") and slots.acquire("a") and not slots.acquire("a")
    assert slots.acquire("b")
    slots.release("a")
    assert slots.acquire("a") and slots.refused == 1
    for _ in range(3):
        slots.release("a")
    assert "a" not in slots.held


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"qps": 0}, "qps must be a number >= 1"),
        ({"qps": float("inf")}, "qps must be a number >= 1"),
        ({"qps": 10, "uncached_qps": 20}, "cannot exceed qps"),
        ({"tcp_connections": 0}, "tcp_connections must be an integer >= 1"),
        ({"forwards": 1.5}, "forwards must be an integer >= 1"),
    ],
)
def test_bad_limits_are_refused(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClientLimits(**fields)  # type: ignore[arg-type]


def zone_handler() -> QueryHandler:
    zone = ZoneIndex()
    found = QueryHandler(zone, None)
    zone.on_change = found.invalidate
    zone.put_service(service("default", "web"))
    return found


async def started(clients: ClientLimits, clock: Clock, **bounds: float) -> DnsServer:
    limits = Limits(clients=clients, **bounds)  # type: ignore[arg-type]
    server = DnsServer(zone_handler(), Listen("127.0.0.1", 0), limits, clock)
    await server.start()
    return server


def udp_answers(port: int, names: list[str], wait: float = 0.5) -> int:
    """Send one query per name at once; how many answers come back."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("127.0.0.1", port))
        for name in names:
            sock.send(bytes(query(name).pack()))
        sock.settimeout(wait)
        got = 0
        try:
            while True:
                sock.recv(4096)
                got += 1
        except TimeoutError:
            return got


async def test_udp_queries_beyond_a_clients_buckets_are_dropped() -> None:
    clock = Clock()
    server = await started(ClientLimits(qps=5, uncached_qps=2), clock)
    try:
        port = server.port
        # 10 tokens; the first ask of SVC is uncached (1 of 4 uncached tokens), the
        # other nine are answered from the cache: ten answered, five dropped.
        assert await asyncio.to_thread(udp_answers, port, [SVC] * 15) == 10
        assert server.buckets.limited == 5
        clock.now += 2.0  # full again: 10 tokens, and 4 uncached
        names = [f"n{i}.default.svc.cluster.local" for i in range(8)]
        assert await asyncio.to_thread(udp_answers, port, names) == 4
        assert server.uncached.limited == 4
    finally:
        await server.stop()


def tcp_answers(port: int, count: int) -> int:
    """Pipeline ``count`` queries on one connection; answers read until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for _ in range(count):
            data = bytes(query(SVC).pack())
            sock.sendall(struct.pack("!H", len(data)) + data)
        stream, got = sock.makefile("rb"), 0
        while len(head := stream.read(2)) == 2:
            assert DNSRecord.parse(stream.read(struct.unpack("!H", head)[0])).rr
            got += 1
        return got


async def test_tcp_waits_for_tokens_and_closes_when_the_wait_is_too_long() -> None:
    clock = Clock()  # stopped: a wait never ends in tokens, only in the sleep
    server = await started(ClientLimits(qps=1, uncached_qps=1), clock, tcp_idle=1.5)
    try:
        # 2 tokens at once, a third after a 1 s wait, a fourth would wait 2 s > idle.
        assert await asyncio.to_thread(tcp_answers, server.port, 5) == 3
        assert server.buckets.limited >= 2
    finally:
        await server.stop()


async def test_tcp_connections_per_client() -> None:
    server = await started(ClientLimits(tcp_connections=2), Clock())
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=3) for _ in range(2)]
    try:
        for _ in range(200):
            if server.connections == 2:
                break
            await asyncio.sleep(0.01)
        with socket.create_connection(("127.0.0.1", server.port), timeout=3) as extra:
            assert await asyncio.to_thread(extra.recv, 1) == b""  # closed at once
        assert server.tcp_slots.refused == 1
    finally:
        for sock in held:
            sock.close()
        await server.stop()


async def test_one_clients_forwards_beyond_its_bound_are_refused() -> None:
    upstream = await StaticUpstream({"www.example.com": ["198.51.100.7"]}).start()
    upstream.silent = True  # every forward waits its timeout
    try:
        fixed = [("127.0.0.1", upstream.port)]
        forwarder = Forwarder(Upstreams(fixed=fixed), timeout=0.5, per_client=2)
        h = QueryHandler(ZoneIndex(), forwarder)

        async def ask(name: str, client: str) -> int:
            pending = h.answer(bytes(query(name).pack()), False, client)
            assert pending is not None and not isinstance(pending, bytes)
            raw = await pending
            assert raw is not None
            return int(DNSRecord.parse(raw).header.rcode)

        greedy = [ask(f"g{i}.example.com", "10.128.0.5") for i in range(5)]
        other = ask("www.example.com", "10.128.0.6")
        codes = await asyncio.gather(*greedy, other)
        assert sorted(codes[:5]) == [RCODE.SERVFAIL] * 2 + [RCODE.REFUSED] * 3
        assert codes[5] == RCODE.SERVFAIL  # asked upstream (silent): not refused
        assert len(upstream.asked) == 3 and forwarder.clients.refused == 3
    finally:
        upstream.close()


async def test_the_counters_are_in_the_agents_metrics() -> None:
    clock = Clock()
    server = await started(ClientLimits(qps=1, uncached_qps=1), clock)
    try:
        await asyncio.to_thread(udp_answers, server.port, [SVC] * 5, 0.3)
    finally:
        await server.stop()

    class Dns:  # what the collector reads of a ClusterDns
        def __init__(self) -> None:
            self.server = server
            self.forwarder = Forwarder(Upstreams(fixed=[]))

    registry = CollectorRegistry()
    registry.register(DnsCollector(Dns()))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert 'podnet_dns_client_limited_total{limit="qps"} 3.0' in text
    assert 'podnet_dns_client_limited_total{limit="forwards"} 0.0' in text
    assert "podnet_dns_dropped_total 0.0" in text
