"""Forwarding names outside the cluster zone to the node's upstream resolvers.

Each forwarded query goes out with a fresh random ID (the client's ID is put back on
the answer) from a fresh socket, so an off-path spoofer must guess both the port and the
ID; an answer counts only if it comes from the server asked, carries that ID and repeats
the question. The upstreams are tried in order, each for ``timeout`` seconds; one that
fails, or answers SERVFAIL or REFUSED, hands the question to the next. When none gives
an answer the caller answers SERVFAIL (``UpstreamError``).

A client's UDP query goes out over UDP (a truncated answer is passed on, and the client
asks again over TCP), its TCP query over TCP.

Answers are kept in a small cache (``max_entries``), for as long as their smallest TTL
(at most ``MAX_TTL``), or, when negative, their SOA's minimum (at most
``MAX_NEGATIVE_TTL``); served from the cache, their TTLs count down. At most
``max_in_flight`` queries wait on upstreams at once: beyond that a query fails at once,
so a flood of unanswerable names cannot pile up sockets; and one client (a source
address) may hold at most ``per_client`` of them: beyond that its query fails at once
with ``ClientBusy`` (answered REFUSED, as CoreDNS's ``max_concurrent``), so one pod
asking for names that never answer cannot take the forwarder from the others.

``failures`` counts what went wrong, by reason (``FAILURES``): ``error`` (an upstream
asked that gave no answer: timeout, socket error, malformed answer), ``servfail`` (an
upstream answered SERVFAIL or REFUSED), ``unanswered`` (no upstream gave an answer: the
client gets SERVFAIL), ``busy`` (``max_in_flight`` reached), ``no_upstreams``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from dnslib import DNSRecord

from podnet.dns.names import normalize
from podnet.dns.ratelimit import DEFAULT_FORWARDS, Slots
from podnet.dns.upstreams import Server, Upstreams
from podnet.dns.wire import NOERROR, NXDOMAIN, OPT, REFUSED, SERVFAIL, has_edns

DEFAULT_TIMEOUT = 1.5
MAX_TTL = 300
MAX_NEGATIVE_TTL = 60
DEFAULT_CACHE_ENTRIES = 2048
DEFAULT_MAX_IN_FLIGHT = 256
SOA_TYPE = 6

CacheKey = tuple[str, int, int, bool, int]
FAILURES = ("error", "servfail", "unanswered", "busy", "no_upstreams")


def _no_failures() -> dict[str, int]:
    return dict.fromkeys(FAILURES, 0)


class UpstreamError(Exception):
    """No upstream answered the question."""


class ClientBusy(UpstreamError):
    """The asking client already has ``per_client`` queries waiting on upstreams."""


def _cache_key(query: DNSRecord) -> CacheKey:
    q = query.q
    return (normalize(str(q.qname)), q.qtype, q.qclass, has_edns(query), query.header.rd)


def _same_question(query: DNSRecord, answer: DNSRecord) -> bool:
    if len(answer.questions) != 1:
        return False
    a, q = answer.q, query.q
    return (a.qtype, a.qclass) == (q.qtype, q.qclass) and normalize(str(a.qname)) == normalize(
        str(q.qname)
    )


def cache_ttl(answer: DNSRecord) -> int:
    """How long an upstream answer may be reused (0: not at all)."""
    rcode = answer.header.rcode
    if answer.header.tc or rcode not in (NOERROR, NXDOMAIN):
        return 0
    if rcode == NOERROR and answer.rr:
        return min(MAX_TTL, *(rr.ttl for rr in answer.rr))
    soa = [rr for rr in answer.auth if rr.rtype == SOA_TYPE]
    if not soa:
        return 0
    return min(MAX_NEGATIVE_TTL, soa[0].ttl, soa[0].rdata.times[4])


class _Answer(asyncio.DatagramProtocol):
    """Receives the one answer to a forwarded query on its own socket."""

    def __init__(self, query: DNSRecord, ident: int) -> None:
        self.query = query
        self.ident = ident
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        if self.answer.done() or len(data) < 12 or int.from_bytes(data[:2]) != self.ident:
            return
        with contextlib.suppress(Exception):  # garbage: keep waiting for the real answer
            if _same_question(self.query, DNSRecord.parse(data)):
                self.answer.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.answer.done():  # ICMP unreachable: no server there
            self.answer.set_exception(exc)


@dataclass(eq=False)
class Forwarder:
    """Answers queries for names outside the zone by asking the upstreams."""

    upstreams: Upstreams
    timeout: float = DEFAULT_TIMEOUT  # seconds per upstream
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_entries: int = DEFAULT_CACHE_ENTRIES
    clock: Callable[[], float] = time.monotonic
    per_client: int = DEFAULT_FORWARDS
    in_flight: int = field(default=0, init=False)
    clients: Slots = field(init=False)  # the queries each client has waiting
    failures: dict[str, int] = field(default_factory=_no_failures, init=False)  # by reason
    _cache: OrderedDict[CacheKey, tuple[bytes, float, int]] = field(
        default_factory=OrderedDict, init=False
    )

    def __post_init__(self) -> None:
        self.clients = Slots(self.per_client)

    async def forward(
        self, query: DNSRecord, data: bytes, tcp: bool = False, client: str = ""
    ) -> bytes:
        """The answer to ``query`` (``data``, as ``client`` sent it) with the client's ID."""
        key = _cache_key(query)
        cached = self._cached(key, query)
        if cached is not None:
            return cached
        servers = self.upstreams.servers()
        if not servers:
            self.failures["no_upstreams"] += 1
            raise UpstreamError("no upstream resolvers")
        if self.in_flight >= self.max_in_flight:
            self.failures["busy"] += 1
            raise UpstreamError(f"{self.in_flight} queries already wait on upstreams")
        if not self.clients.acquire(client):
            raise ClientBusy(f"{client} has {self.per_client} queries waiting on upstreams")
        self.in_flight += 1
        try:
            answer = await self._ask_each(servers, query, data, tcp)
        finally:
            self.in_flight -= 1
            self.clients.release(client)
        self._store(key, answer)
        return data[:2] + answer[2:]

    async def _ask_each(
        self, servers: list[Server], query: DNSRecord, data: bytes, tcp: bool
    ) -> bytes:
        fallback: bytes | None = None
        problems = []
        for server in servers:
            try:
                answer = await asyncio.wait_for(self._ask(server, query, data, tcp), self.timeout)
            except (OSError, TimeoutError, EOFError, ValueError) as exc:
                self.failures["error"] += 1
                problems.append(f"{server[0]}: {type(exc).__name__} {exc}".strip())
                continue
            if answer[3] & 0x0F not in (SERVFAIL, REFUSED):
                return answer
            self.failures["servfail"] += 1
            fallback = answer
        if fallback is not None:
            return fallback
        self.failures["unanswered"] += 1
        raise UpstreamError("; ".join(problems))

    async def _ask(self, server: Server, query: DNSRecord, data: bytes, tcp: bool) -> bytes:
        ident = secrets.randbits(16)
        message = ident.to_bytes(2) + data[2:]
        if tcp:
            return await self._ask_tcp(server, query, message, ident)
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_datagram_endpoint(
            lambda: _Answer(query, ident), remote_addr=server
        )
        try:
            transport.sendto(message)
            return await protocol.answer
        finally:
            transport.close()

    async def _ask_tcp(self, server: Server, query: DNSRecord, message: bytes, ident: int) -> bytes:
        reader, writer = await asyncio.open_connection(*server)
        try:
            writer.write(struct.pack("!H", len(message)) + message)
            await writer.drain()
            (size,) = struct.unpack("!H", await reader.readexactly(2))
            answer = await reader.readexactly(size)
        finally:
            writer.close()
        if int.from_bytes(answer[:2]) != ident:
            raise ValueError("an answer that is not ours")
        try:
            parsed = DNSRecord.parse(answer)
        except Exception as exc:
            raise ValueError(f"a malformed answer: {exc}") from None
        if not _same_question(query, parsed):
            raise ValueError("an answer to another question")
        return answer

    # ---- the cache -----------------------------------------------------------------------

    def _store(self, key: CacheKey, answer: bytes) -> None:
        try:
            ttl = cache_ttl(DNSRecord.parse(answer))
        except Exception:
            return
        if ttl <= 0:
            return
        self._cache[key] = (answer, self.clock(), ttl)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)

    def _cached(self, key: CacheKey, query: DNSRecord) -> bytes | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        answer, stored, ttl = entry
        age = int(self.clock() - stored)
        if age >= ttl:
            del self._cache[key]
            return None
        self._cache.move_to_end(key)
        reply = DNSRecord.parse(answer)
        reply.header.id = query.header.id
        reply.questions = [query.q]
        for rr in (*reply.rr, *reply.auth, *reply.ar):
            if rr.rtype != OPT:
                rr.ttl = max(0, rr.ttl - age)
        return bytes(reply.pack())
