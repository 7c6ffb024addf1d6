"""Answers on the wire (``QueryHandler``): queries built with dnslib, answers parsed back.
Flags, EDNS, TC, FORMERR/NOTIMP/REFUSED, the answer cache and its invalidation, and a
fuzz of random bytes that must never raise."""

from __future__ import annotations

import asyncio
import ipaddress
import struct

from dnslib import EDNS0, QTYPE, RCODE, DNSRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.dns.handler import QueryHandler
from podnet.dns.zone import ZoneIndex
from podnet.testing.dns import endpoint_slice, query, service

SVC = "web.default.svc.cluster.local"


def handler(ready: bool = True) -> QueryHandler:
    zone = ZoneIndex(reverse_networks=[ipaddress.ip_network("172.30.0.0/16")])
    found = QueryHandler(zone, None, ready=lambda: ready)
    zone.on_change = found.invalidate
    zone.put_service(service("default", "web"))
    return found


def answer(h: QueryHandler, q: DNSRecord | bytes, tcp: bool = False) -> DNSRecord:
    data = q if isinstance(q, bytes) else bytes(q.pack())
    raw = h.answer(data, tcp)
    assert isinstance(raw, bytes)
    return DNSRecord.parse(raw)


def test_a_answer_flags_and_question_echo() -> None:
    h = handler()
    q = query("Web.Default.svc.cluster.local", "A")
    a = answer(h, q)
    assert a.header.id == q.header.id and a.header.qr and a.header.aa and a.header.ra
    assert a.header.rcode == RCODE.NOERROR
    assert str(a.q.qname) == "Web.Default.svc.cluster.local."  # the asker's spelling
    assert [(str(rr.rname), str(rr.rdata), rr.ttl) for rr in a.rr] == [
        ("Web.Default.svc.cluster.local.", "172.30.0.10", 5)
    ]
    assert not a.ar  # no EDNS asked, none given


def test_nxdomain_and_nodata_on_the_wire() -> None:
    h = handler()
    missing = answer(h, query("nope.default.svc.cluster.local"))
    assert missing.header.rcode == RCODE.NXDOMAIN and missing.header.aa
    assert [rr.rtype for rr in missing.auth] == [QTYPE.SOA]
    nodata = answer(h, query(SVC, "AAAA"))
    assert nodata.header.rcode == RCODE.NOERROR and not nodata.rr
    assert [rr.rtype for rr in nodata.auth] == [QTYPE.SOA]


def test_edns_is_answered_with_edns() -> None:
    a = answer(handler(), query(SVC, "A", edns=4096))
    opts = [rr for rr in a.ar if rr.rtype == QTYPE.OPT]
    assert len(opts) == 1 and opts[0].rclass == 1232


def big_headless(h: QueryHandler, endpoints: int) -> None:
    h.index.put_service(service("default", "big", None))
    addresses = [(f"10.128.{i // 250}.{i % 250 + 1}", None, True) for i in range(endpoints)]
    h.index.put_slice(endpoint_slice("default", "big", "big", addresses))


def test_large_answers_are_truncated_over_udp_and_whole_over_tcp() -> None:
    h = handler()
    big_headless(h, 60)  # 60 A records: ~1,000 bytes
    name = "big.default.svc.cluster.local"
    small = answer(h, query(name))
    assert small.header.tc and not small.rr  # over 512 bytes without EDNS
    roomy = answer(h, query(name, edns=4096))
    assert not roomy.header.tc and len(roomy.rr) == 60
    whole = answer(h, query(name), tcp=True)
    assert not whole.header.tc and len(whole.rr) == 60


def test_malformed_queries_get_formerr_or_nothing() -> None:
    h = handler()
    good = bytes(query(SVC).pack())
    formerr = h.answer(good[:12] + b"\x07garbage")
    assert isinstance(formerr, bytes)
    header = DNSRecord.parse(formerr).header
    assert header.rcode == RCODE.FORMERR and header.id == struct.unpack("!H", good[:2])[0]
    assert h.answer(b"\x01\x02\x03") is None  # shorter than a header: nothing to answer
    response = bytearray(good)
    response[2] |= 0x80
    assert h.answer(bytes(response)) is None  # a response: never answered
    two = query(SVC)
    two.add_question(query("x.cluster.local").q)
    assert answer(h, two).header.rcode == RCODE.FORMERR
    notify = bytearray(good)
    notify[2] = (notify[2] & 0x87) | (4 << 3)  # opcode NOTIFY
    assert answer(h, bytes(notify)).header.rcode == RCODE.NOTIMP
    chaos = DNSRecord.question("version.bind", "TXT", "CH")
    assert answer(h, chaos).header.rcode == RCODE.REFUSED
    assert h.malformed == 6


def test_edns_version_1_is_badvers() -> None:
    q = query(SVC)
    q.add_ar(EDNS0(udp_len=1232, version=1))
    a = answer(handler(), q)
    opt = next(rr for rr in a.ar if rr.rtype == QTYPE.OPT)
    assert (opt.ttl >> 24) == 1  # extended rcode 16 (BADVERS) = 1 << 4


def test_cache_answers_repeats_and_is_invalidated_per_name() -> None:
    h = handler()
    h.index.put_service(service("default", "other", "172.30.0.20"))
    web, other = query(SVC), query("other.default.svc.cluster.local")
    answer(h, web)
    answer(h, other)
    again = query(SVC)  # same question, another ID
    assert str(answer(h, again).rr[0].rdata) == "172.30.0.10"
    assert h.udp_cache.hits == 1
    h.index.put_service(service("default", "web", "172.30.0.11"))  # web's entry goes
    assert len(h.udp_cache) == 1
    assert str(answer(h, query(SVC)).rr[0].rdata) == "172.30.0.11"
    h.index.remove_service(("default", "web"))
    assert answer(h, query(SVC)).header.rcode == RCODE.NXDOMAIN


def test_negative_answers_are_invalidated_when_the_name_appears() -> None:
    h = handler()
    name = "late.default.svc.cluster.local"
    assert answer(h, query(name)).header.rcode == RCODE.NXDOMAIN
    h.index.put_service(service("default", "late", "172.30.0.30"))
    assert str(answer(h, query(name)).rr[0].rdata) == "172.30.0.30"


def test_servfail_until_ready() -> None:
    h = handler(ready=False)
    assert answer(h, query(SVC)).header.rcode == RCODE.SERVFAIL
    assert len(h.udp_cache) == 0


def test_without_forwarder_outside_names_servfail() -> None:
    pending = handler().answer(bytes(query("www.example.com").pack()))
    assert pending is not None and not isinstance(pending, bytes)
    raw = asyncio.run(pending)
    assert raw is not None and DNSRecord.parse(raw).header.rcode == RCODE.SERVFAIL


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=600))
def test_fuzz_random_bytes_never_raise(data: bytes) -> None:
    h = FUZZ_HANDLER
    result = h.answer(data)
    if isinstance(result, bytes):
        assert len(result) >= 12 and result[:2] == data[:2] and result[2] & 0x80
    elif result is not None:
        result.close()  # a query for a name outside the zone: would be forwarded


@settings(max_examples=1000, deadline=None)
@given(st.integers(0, 511), st.integers(0, 255))
def test_fuzz_flipped_bytes_of_a_valid_query(position: int, value: int) -> None:
    data = bytearray(query(SVC, "SRV", edns=1232).pack())
    data[position % len(data)] = value
    result = FUZZ_HANDLER.answer(bytes(data))
    if result is not None and not isinstance(result, bytes):
        result.close()
    if isinstance(result, bytes):
        assert DNSRecord.parse(result).header.qr  # a well-formed answer


FUZZ_HANDLER = handler()
