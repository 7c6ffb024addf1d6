"""From a query's bytes to its answer's bytes: the cache, the zone, or the upstreams.

``QueryHandler.answer`` is called by both transports with the raw message:

1. a repeated question is answered from the answer cache (one per transport, as the
   size limits differ), keyed by the bytes after the ID;
2. otherwise the query is parsed (``BadQuery``: FORMERR, NOTIMP, REFUSED, or nothing);
3. a name in the zone is resolved from the index, encoded, fitted to the transport
   (TC over UDP when too large) and cached under the names it was read from; until the
   index has its first complete view of the cluster such names answer SERVFAIL (a
   client retries, where an early NXDOMAIN would be cached as the truth);
4. a name outside the zone, and an ExternalName's out-of-zone target, go to the
   forwarder: then ``answer`` returns a coroutine for the transport to run; a client
   with too many forwards waiting already is answered REFUSED.

The listeners run on a thread of their own while the agent's watches change the index
on the agent's loop: ``lock`` is held by whoever reads or changes the index, and fills
or invalidates the caches, so an answer read from the index before a change is never
stored after that change's invalidation. A repeated question is answered from the
cache without the lock (one dict lookup, atomic in CPython).

Nothing a client sends makes ``answer`` raise: an unexpected failure is logged and
answered SERVFAIL (or dropped when there is no query to answer).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from dnslib import EDNS0, DNSHeader, DNSQuestion, DNSRecord

from podnet.dns.cache import HIT, AnswerCache
from podnet.dns.forwarder import ClientBusy, Forwarder, UpstreamError
from podnet.dns.lookup import Resolution, resolve
from podnet.dns.tally import Tally, cell
from podnet.dns.wire import (
    NOERROR,
    NXDOMAIN,
    OUR_PAYLOAD,
    REFUSED,
    SERVFAIL,
    TCP_MAX,
    BadQuery,
    error_header,
    fit,
    parse_query,
    status_reply,
    udp_limit,
    zone_reply,
)
from podnet.dns.zone import ZoneIndex

log = logging.getLogger("podnet.dns")

TCP_CACHE_ENTRIES = 2000  # TCP answers are the large ones
Answer = bytes | None | Coroutine[Any, Any, bytes | None]


def _always() -> bool:
    return True


def _tcp_cache() -> AnswerCache:
    return AnswerCache(max_entries=TCP_CACHE_ENTRIES)


@dataclass(eq=False)
class QueryHandler:
    """Answers DNS messages for the zone in ``index``; forwards the rest (``forwarder``
    None: SERVFAIL). ``ready`` says whether the index is complete."""

    index: ZoneIndex
    forwarder: Forwarder | None
    ready: Callable[[], bool] = _always
    udp_cache: AnswerCache = field(default_factory=AnswerCache)
    tcp_cache: AnswerCache = field(default_factory=_tcp_cache)
    malformed: int = field(default=0, init=False)  # FORMERR/NOTIMP/REFUSED or dropped
    tally: Tally = field(default_factory=Tally, init=False)  # by type, rcode, cache (tally)
    lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def invalidate(self, names: Iterable[str]) -> None:
        """Forget the cached answers read from ``names`` (the zone index calls this)."""
        names = list(names)
        self.udp_cache.invalidate(names)
        self.tcp_cache.invalidate(names)

    def answer(self, data: bytes, tcp: bool = False, client: str = "") -> Answer:
        """The answer to ``data`` from ``client`` (None: send nothing), or a coroutine
        giving it."""
        cache = self.tcp_cache if tcp else self.udp_cache
        key = data[2:]
        hit = cache.get(key)
        if hit is not None:
            self.tally.cells[cache.cells.get(key, HIT)] += 1
            return data[:2] + hit
        try:
            query = parse_query(data)
        except BadQuery as exc:
            self.malformed += 1
            log.debug("bad query: %s", exc)
            self.tally.count(None, exc.answer)
            return exc.answer
        qtype = query.q.qtype
        try:
            with self.lock:
                answer = self._answer(query, data, key, tcp, client)
        except Exception:
            log.exception("answering %s failed", query.q)
            answer = error_header(data, SERVFAIL)
        if answer is None or isinstance(answer, bytes):
            self.tally.count(qtype, answer)
        return answer  # a coroutine counts its answer itself (_forwarded, _chased)

    def _answer(self, query: DNSRecord, data: bytes, key: bytes, tcp: bool, client: str) -> Answer:
        limit = TCP_MAX if tcp else udp_limit(query)
        result = resolve(self.index, str(query.q.qname), query.q.qtype)
        if result is None:
            return self._forwarded(query, data, tcp, limit, client)
        if result.authoritative and not self.ready():
            return status_reply(query, SERVFAIL)
        if result.external is not None:
            return self._chased(query, result, tcp, limit, client)
        answer = fit(query, bytes(zone_reply(query, result, self.index.ttl).pack()), limit)
        hit = cell(query.q.qtype, answer, cached=True)
        (self.tcp_cache if tcp else self.udp_cache).put(key, answer[2:], result.names, hit)
        return answer

    async def _forwarded(
        self, query: DNSRecord, data: bytes, tcp: bool, limit: int, client: str
    ) -> bytes:
        answer = await self._forward(query, data, tcp, limit, client)
        self.tally.count(query.q.qtype, answer)
        return answer

    async def _forward(
        self, query: DNSRecord, data: bytes, tcp: bool, limit: int, client: str
    ) -> bytes:
        if self.forwarder is None:
            return status_reply(query, SERVFAIL)
        try:
            return fit(query, await self.forwarder.forward(query, data, tcp, client), limit)
        except ClientBusy:
            return status_reply(query, REFUSED)
        except UpstreamError as exc:
            log.debug("forwarding %s failed: %s", query.q.qname, exc)
            return status_reply(query, SERVFAIL)

    async def _chased(
        self, query: DNSRecord, result: Resolution, tcp: bool, limit: int, client: str
    ) -> bytes:
        """The CNAME chain, then what the upstreams say of its out-of-zone target."""
        answer = await self._chase(query, result, tcp, limit, client)
        self.tally.count(query.q.qtype, answer)
        return answer

    async def _chase(
        self, query: DNSRecord, result: Resolution, tcp: bool, limit: int, client: str
    ) -> bytes:
        assert result.external is not None
        if self.forwarder is None:
            return status_reply(query, SERVFAIL)
        ask = DNSRecord(DNSHeader(rd=1), questions=[DNSQuestion(result.external, query.q.qtype, 1)])
        ask.add_ar(EDNS0(udp_len=OUR_PAYLOAD))
        try:
            told = DNSRecord.parse(
                await self.forwarder.forward(ask, bytes(ask.pack()), tcp, client)
            )
        except ClientBusy:
            return status_reply(query, REFUSED)
        except Exception as exc:  # UpstreamError, or an answer dnslib cannot read
            log.debug("resolving %s upstream failed: %s", result.external, exc)
            return status_reply(query, SERVFAIL)
        rcode = told.header.rcode
        if rcode not in (NOERROR, NXDOMAIN):
            return status_reply(query, SERVFAIL)
        result.rcode = rcode
        reply = zone_reply(query, result, self.index.ttl)
        reply.rr.extend(told.rr)
        reply.auth.extend(told.auth)
        reply.header.aa = 0
        if told.header.tc and not tcp:
            reply.header.tc = 1
        return fit(query, bytes(reply.pack()), limit)
