"""The cluster DNS's CoreDNS-style counters (podnet.dns.tally, podnet.dns.metrics) after
real queries to the server in-process on 127.0.0.1: queries by type, answers by rcode,
answer-cache hits (the UDP fast path's too) and misses, upstream failures; and a flood of
distinct names adds no series."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator

import pytest
from dnslib import RCODE, DNSRecord
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from podnet.dns.forwarder import Forwarder
from podnet.dns.handler import QueryHandler
from podnet.dns.metrics import answered
from podnet.dns.server import DnsServer, Listen
from podnet.dns.upstreams import Upstreams
from podnet.dns.zone import ZoneIndex
from podnet.testing.dns import ask, service
from podnet.testing.metricstext import sample

SVC = "web.default.svc.cluster.local"


def closed_port() -> int:
    """A UDP port on 127.0.0.1 nothing listens on (an upstream that never answers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Answered(Collector):
    def __init__(self, server: DnsServer, forwarder: Forwarder) -> None:
        self.server, self.forwarder = server, forwarder

    def collect(self) -> Iterator[Metric]:
        return answered(self.server.handler.tally, self.forwarder.failures)


@pytest.fixture
async def running() -> AsyncIterator[tuple[DnsServer, CollectorRegistry]]:
    zone = ZoneIndex()
    upstream = Upstreams(fixed=[("127.0.0.1", closed_port())])
    forwarder = Forwarder(upstream, timeout=0.2)
    handler = QueryHandler(zone, forwarder)
    zone.on_change = handler.invalidate
    zone.put_service(service("default", "web"))
    server = DnsServer(handler, Listen("127.0.0.1", 0, None, None))
    await server.start()
    registry = CollectorRegistry()
    registry.register(Answered(server, forwarder))
    yield server, registry
    await server.stop()


async def asked(port: int, name: str, qtype: str = "A", tcp: bool = False) -> DNSRecord:
    return await asyncio.to_thread(ask, ("127.0.0.1", port), name, qtype, tcp)


async def test_queries_answers_cache_and_upstream_failures_are_counted(
    running: tuple[DnsServer, CollectorRegistry],
) -> None:
    server, registry = running
    for _ in range(3):  # one miss, then two hits from the UDP fast path
        assert (await asked(server.port, SVC)).header.rcode == RCODE.NOERROR
    assert (await asked(server.port, SVC, tcp=True)).header.rcode == RCODE.NOERROR  # miss
    assert (await asked(server.port, SVC, tcp=True)).header.rcode == RCODE.NOERROR  # hit
    missing = "nope.default.svc.cluster.local"
    assert (await asked(server.port, missing, "AAAA")).header.rcode == RCODE.NXDOMAIN
    srv = "_http._tcp.web.default.svc.cluster.local"
    assert (await asked(server.port, srv, "SRV")).header.rcode in (RCODE.NOERROR, RCODE.NXDOMAIN)
    outside = await asked(server.port, "example.org", tcp=True)  # TCP: one ask, no retry
    assert outside.header.rcode == RCODE.SERVFAIL  # the upstream never answers
    text = generate_latest(registry)
    requests = "podnet_dns_requests_total"
    assert sample(text, requests, type="A") == 6.0
    assert sample(text, requests, type="AAAA") == 1.0
    assert sample(text, requests, type="SRV") == 1.0
    assert sample(text, requests, type="MX") == 0.0
    assert sample(text, "podnet_dns_responses_total", rcode="NXDOMAIN") == 1.0
    assert sample(text, "podnet_dns_responses_total", rcode="SERVFAIL") == 1.0
    assert sample(text, "podnet_dns_responses_total") == 8.0
    assert sample(text, "podnet_dns_cache_hits_total") == 3.0
    assert sample(text, "podnet_dns_cache_misses_total") == 5.0
    failures = "podnet_dns_upstream_failures_total"
    assert sample(text, failures, reason="error") == 1.0
    assert sample(text, failures, reason="unanswered") == 1.0
    assert sample(text, failures, reason="busy") == 0.0


async def test_distinct_names_and_garbage_add_no_series(
    running: tuple[DnsServer, CollectorRegistry],
) -> None:
    server, registry = running
    before = len(generate_latest(registry).splitlines())
    for i in range(30):
        await asked(server.port, f"n{i}.attacker.svc.cluster.local", "TXT")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"\x12\x34garbage", ("127.0.0.1", server.port))
    await asyncio.sleep(0.2)
    text = generate_latest(registry)
    assert len(text.splitlines()) == before
    assert b"attacker" not in text
    assert sample(text, "podnet_dns_requests_total", type="TXT") == 30.0
    other = sample(text, "podnet_dns_requests_total", type="other") or 0
    assert other <= 1.0  # the garbage, when it was read as a query at all
