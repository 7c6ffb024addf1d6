"""Forwarding names outside the zone (no root: upstreams on 127.0.0.1 high ports): ID
remapping, the answer cache and its TTLs, failover between upstreams, SERVFAIL when
none answers, ExternalName targets outside the zone, and resolv.conf parsing."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from dnslib import QTYPE, RCODE, DNSRecord

from podnet.dns import forwarder as forwarder_module
from podnet.dns.forwarder import Forwarder
from podnet.dns.handler import QueryHandler
from podnet.dns.upstreams import Upstreams, nameservers
from podnet.dns.zone import ZoneIndex
from podnet.testing.dns import StaticUpstream, query, service

RECORDS = {"www.example.com": ["198.51.100.7"], "two.example.com": ["198.51.100.8"]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def upstreams() -> AsyncIterator[list[StaticUpstream]]:
    started = [await StaticUpstream(RECORDS, ttl=30).start() for _ in range(2)]
    yield started
    for upstream in started:
        upstream.close()


def handler(servers: list[StaticUpstream], clock: Clock | None = None) -> QueryHandler:
    fixed = [("127.0.0.1", s.port) for s in servers]
    forwarder = Forwarder(Upstreams(fixed=fixed), timeout=0.3, clock=clock or Clock())
    zone = ZoneIndex(reverse_networks=[ipaddress.ip_network("172.30.0.0/16")])
    found = QueryHandler(zone, forwarder)
    zone.on_change = found.invalidate
    return found


async def ask(h: QueryHandler, q: DNSRecord, tcp: bool = False) -> DNSRecord:
    pending = h.answer(bytes(q.pack()), tcp)
    raw = pending if pending is None or isinstance(pending, bytes) else await pending
    assert raw is not None
    return DNSRecord.parse(raw)


async def test_forwarded_with_a_fresh_id_and_the_clients_id_back(
    upstreams: list[StaticUpstream], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forwarder_module.secrets, "randbits", lambda bits: 4242)
    q = query("WWW.example.com")
    q.header.id = 777
    a = await ask(handler(upstreams[:1]), q)
    assert a.header.id == 777 and a.header.rcode == RCODE.NOERROR
    assert [str(rr.rdata) for rr in a.rr] == ["198.51.100.7"]
    assert upstreams[0].asked == [("www.example.com", 4242)]


async def test_tcp_queries_are_forwarded_over_tcp(upstreams: list[StaticUpstream]) -> None:
    a = await ask(handler(upstreams[:1]), query("www.example.com"), tcp=True)
    assert [str(rr.rdata) for rr in a.rr] == ["198.51.100.7"]


async def test_answers_are_cached_for_their_ttl_counting_down(
    upstreams: list[StaticUpstream],
) -> None:
    clock = Clock()
    h = handler(upstreams[:1], clock)
    await ask(h, query("www.example.com"))
    clock.now += 10
    again = await ask(h, query("www.example.com"))
    assert [rr.ttl for rr in again.rr] == [20]  # 30 s, 10 s ago
    assert len(upstreams[0].asked) == 1
    clock.now += 25  # expired
    await ask(h, query("www.example.com"))
    assert len(upstreams[0].asked) == 2


async def test_negative_answers_are_cached_by_the_soa_minimum(
    upstreams: list[StaticUpstream],
) -> None:
    clock = Clock()
    h = handler(upstreams[:1], clock)
    assert (await ask(h, query("nope.example.com"))).header.rcode == RCODE.NXDOMAIN
    assert (await ask(h, query("nope.example.com"))).header.rcode == RCODE.NXDOMAIN
    assert len(upstreams[0].asked) == 1


async def test_a_silent_upstream_hands_over_to_the_next(upstreams: list[StaticUpstream]) -> None:
    upstreams[0].silent = True
    a = await ask(handler(upstreams), query("www.example.com"))
    assert [str(rr.rdata) for rr in a.rr] == ["198.51.100.7"]
    assert len(upstreams[0].asked) == 1 and len(upstreams[1].asked) == 1


async def test_no_answer_from_any_upstream_is_servfail(upstreams: list[StaticUpstream]) -> None:
    for upstream in upstreams:
        upstream.silent = True
    assert (await ask(handler(upstreams), query("www.example.com"))).header.rcode == RCODE.SERVFAIL
    closed = StaticUpstream({})
    await closed.start()
    port = closed.port
    closed.close()  # nothing listens there: ICMP unreachable
    h = handler([])
    h.forwarder.upstreams.fixed = [("127.0.0.1", port)]  # type: ignore[union-attr]
    assert (await ask(h, query("www.example.com"))).header.rcode == RCODE.SERVFAIL
    assert (await ask(handler([]), query("www.example.com"))).header.rcode == RCODE.SERVFAIL


async def test_in_flight_bound_fails_fast(upstreams: list[StaticUpstream]) -> None:
    upstreams[0].silent = True
    h = handler(upstreams[:1])
    assert h.forwarder is not None
    h.forwarder.max_in_flight = 2
    pending = [asyncio.ensure_future(ask(h, query(f"n{i}.example.com"))) for i in range(5)]
    answers = await asyncio.gather(*pending)
    assert all(a.header.rcode == RCODE.SERVFAIL for a in answers)
    assert len(upstreams[0].asked) == 2  # the other three never went out


async def test_external_name_outside_the_zone_is_resolved_upstream(
    upstreams: list[StaticUpstream],
) -> None:
    h = handler(upstreams[:1])
    h.index.put_service(
        service("default", "ext", type="ExternalName", externalName="www.example.com")
    )
    a = await ask(h, query("ext.default.svc.cluster.local"))
    assert a.header.rcode == RCODE.NOERROR
    assert [(rr.rtype, str(rr.rdata)) for rr in a.rr] == [
        (QTYPE.CNAME, "www.example.com."),
        (QTYPE.A, "198.51.100.7"),
    ]
    h.index.put_service(
        service("default", "gone", type="ExternalName", externalName="nope.example.com")
    )
    missing = await ask(h, query("gone.default.svc.cluster.local"))
    assert missing.header.rcode == RCODE.NXDOMAIN
    assert [rr.rtype for rr in missing.rr] == [QTYPE.CNAME]


def test_nameservers_from_resolv_conf(tmp_path: Path) -> None:
    text = "# comment\nsearch example.com\nnameserver 192.0.2.1\nnameserver bogus\n"
    text += "nameserver fe80::1%eth0\nnameserver 192.0.2.2\nnameserver 192.0.2.3\n"
    assert nameservers(text) == ["192.0.2.1", "fe80::1", "192.0.2.2"]
    path = tmp_path / "resolv.conf"
    path.write_text("nameserver 10.128.0.1\nnameserver 192.0.2.9\n")
    clock = Clock()
    found = Upstreams(path, exclude={"10.128.0.1"}, recheck=5, clock=clock)
    assert found.servers() == [("192.0.2.9", 53)]  # our own address is never upstream
    path.write_text("nameserver 192.0.2.10\n")
    clock.now += 5
    assert found.servers() == [("192.0.2.10", 53)]
    path.unlink()
    clock.now += 5
    assert found.servers() == []
