"""The DNS wire format, through dnslib: parsing queries, encoding answers, truncation.

- ``parse_query`` reads a datagram or TCP message. Anything that is not one well-formed
  standard query is a ``BadQuery`` carrying the error answer to send, or None (drop:
  a response, or less than a header, which cannot be answered).
- ``zone_reply`` encodes a ``Resolution``: the server is authoritative and offers
  recursion (it forwards what is not in the zone); a query with EDNS gets EDNS back.
- ``fit`` applies the transport's size limit: over UDP, 512 bytes or the EDNS payload
  size the client offered; an answer larger than that is sent as its header and question
  with TC set, and the client asks again over TCP.
"""

from __future__ import annotations

from typing import Any

from dnslib import (
    AAAA,
    CNAME,
    EDNS0,
    NS,
    PTR,
    QTYPE,
    RR,
    SOA,
    SRV,
    TXT,
    A,
    DNSHeader,
    DNSQuestion,
    DNSRecord,
)

from podnet.dns.lookup import Resolution
from podnet.dns.names import normalize
from podnet.dns.records import Record

NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 2, 3, 4, 5
BADVERS = 16  # extended rcode: 1 in the OPT record, 0 in the header
OPT = 41
CLASS_IN, CLASS_ANY = 1, 255
UDP_MIN = 512
UDP_MAX = 4096  # the most we send over UDP, whatever the client offers
OUR_PAYLOAD = 1232  # the EDNS payload size we offer (the DNS flag day's value)
TCP_MAX = 65535

_RDATA: dict[int, Any] = {
    QTYPE.A: lambda d: A(d[0]),
    QTYPE.AAAA: lambda d: AAAA(d[0]),
    QTYPE.CNAME: lambda d: CNAME(d[0]),
    QTYPE.PTR: lambda d: PTR(d[0]),
    QTYPE.NS: lambda d: NS(d[0]),
    QTYPE.TXT: lambda d: TXT(d[0]),
    QTYPE.SRV: lambda d: SRV(d[0], d[1], d[2], d[3]),
    QTYPE.SOA: lambda d: SOA(d[0], d[1], d[2:]),
}


class BadQuery(Exception):
    """A message that is not one standard query; ``answer`` is what to send (or None)."""

    def __init__(self, why: str, answer: bytes | None) -> None:
        super().__init__(why)
        self.answer = answer


def error_header(data: bytes, rcode: int) -> bytes | None:
    """A bare answer header with ``rcode`` for the query header in ``data`` (ID, opcode
    and RD copied; no sections), or None when there is no query header to answer."""
    if len(data) < 12 or data[2] & 0x80:  # too short, or a response (never answer those)
        return None
    flags = 0x80 | (data[2] & 0x79)  # QR, opcode, RD
    return data[:2] + bytes([flags, rcode & 0x0F]) + bytes(8)


def parse_query(data: bytes) -> DNSRecord:
    """The query in ``data``, or ``BadQuery`` saying what to answer instead."""
    try:
        query = DNSRecord.parse(data)
    except Exception as exc:  # dnslib raises several kinds on malformed input
        raise BadQuery(f"malformed: {exc}", error_header(data, FORMERR)) from None
    header = query.header
    if header.qr:
        raise BadQuery("a response, not a query", None)
    if header.opcode != 0:
        raise BadQuery(f"opcode {header.opcode}", error_header(data, NOTIMP))
    opts = [rr for rr in query.ar if rr.rtype == OPT]
    if len(query.questions) != 1 or query.rr or query.auth or len(opts) > 1:
        raise BadQuery("not exactly one question", error_header(data, FORMERR))
    if query.q.qclass not in (CLASS_IN, CLASS_ANY):
        raise BadQuery(f"class {query.q.qclass}", error_header(data, REFUSED))
    if opts and (opts[0].ttl >> 16) & 0xFF:  # EDNS version other than 0
        raise BadQuery("EDNS version", _badvers(query))
    return query


def _badvers(query: DNSRecord) -> bytes:
    reply = _reply(query, NOERROR, authoritative=False)
    reply.add_ar(EDNS0(udp_len=OUR_PAYLOAD, ext_rcode=BADVERS >> 4))
    return bytes(reply.pack())


def has_edns(query: DNSRecord) -> bool:
    """Whether the query carries an OPT record."""
    return any(rr.rtype == OPT for rr in query.ar)


def udp_limit(query: DNSRecord) -> int:
    """How large a UDP answer to this query may be (RFC 1035, RFC 6891)."""
    for rr in query.ar:
        if rr.rtype == OPT:
            return max(UDP_MIN, min(int(rr.rclass), UDP_MAX))
    return UDP_MIN


def _reply(query: DNSRecord, rcode: int, authoritative: bool) -> DNSRecord:
    header = DNSHeader(
        id=query.header.id, qr=1, aa=int(authoritative), ra=1, rd=query.header.rd, rcode=rcode
    )
    return DNSRecord(header, questions=[DNSQuestion(query.q.qname, query.q.qtype, query.q.qclass)])


def to_rr(record: Record, ttl: int, owner: Any = None) -> RR:
    """A ``Record`` as a dnslib resource record, owned by ``owner`` (default: its name)."""
    rdata = _RDATA[record.rtype](record.data)
    return RR(owner if owner is not None else record.name, record.rtype, CLASS_IN, ttl, rdata)


def zone_reply(query: DNSRecord, result: Resolution, ttl: int) -> DNSRecord:
    """The answer to ``query`` that ``result`` describes. Records at the asked name keep
    the asker's spelling of it (resolvers that mix case compare it)."""
    reply = _reply(query, result.rcode, result.authoritative)
    asked = normalize(str(query.q.qname))
    for record in result.answers:
        owner = query.q.qname if record.name == asked else None
        reply.add_answer(to_rr(record, ttl, owner))
    for record in result.authority:
        reply.add_auth(to_rr(record, ttl))
    for record in result.additional:
        reply.add_ar(to_rr(record, ttl))
    if has_edns(query):
        reply.add_ar(EDNS0(udp_len=OUR_PAYLOAD))
    return reply


def status_reply(query: DNSRecord, rcode: int) -> bytes:
    """An answer with no records: SERVFAIL, REFUSED (EDNS echoed)."""
    reply = _reply(query, rcode, authoritative=False)
    if has_edns(query):
        reply.add_ar(EDNS0(udp_len=OUR_PAYLOAD))
    return bytes(reply.pack())


def truncated(query: DNSRecord) -> bytes:
    """The TC answer to ``query``: header and question only (EDNS echoed)."""
    reply = _reply(query, NOERROR, authoritative=False)
    reply.header.tc = 1
    if has_edns(query):
        reply.add_ar(EDNS0(udp_len=OUR_PAYLOAD))
    return bytes(reply.pack())


def fit(query: DNSRecord, answer: bytes, limit: int) -> bytes:
    """``answer`` if it fits in ``limit`` bytes, else the TC answer."""
    return answer if len(answer) <= limit else truncated(query)
