"""Per-client bounds of the cluster DNS: token buckets of queries, and counted slots
(TCP connections, forwards waiting on upstreams), each keyed by the source address.

Two buckets, because two kinds of query cost very different amounts: a repeated
question is answered from the answer cache (a dict lookup and a send, a few µs), any
other (a new name, a forwarded one) is parsed, resolved and encoded through dnslib
(about 300 µs). Every query takes a token of the ``qps`` bucket; a query the cache
cannot answer also takes one of the ``uncached_qps`` bucket, so a pod asking for
ever-new names costs the DNS thread at most ``uncached_qps`` times 300 µs a second (7 % of
a core by default), and its flood beyond that is dropped at about 1 µs a query. Each
bucket holds ``BURST_SECONDS`` of its rate.

A client is a pod: its source address is the key, and the data plane's anti-spoofing
ties that address to the pod's port, so one pod cannot spend another pod's tokens.

Over UDP the ``qps`` rate is also enforced by the kernel, per source, before the socket
(the node's ``inet podnet`` table, ``podnet.dataplane.linux.nftrules``): one pod's flood
cannot fill the socket's queue, which every pod shares, whatever CPU this thread gets.

The practice followed:
- over UDP a query beyond the bucket is dropped, not answered, as BIND's response rate
  limiting with ``slip 0`` and Unbound's ``ip-ratelimit`` do: answering a flood costs as
  much as serving it, and the client's own retry is what a burst needs;
- over TCP, where a query cannot be lost, the connection waits for its next token
  (the client's sends back up through TCP's flow control), or is closed when that
  wait would be longer than the idle timeout;
- a forward beyond the client's in-flight bound is answered REFUSED at once, as
  CoreDNS's ``forward`` plugin answers beyond ``max_concurrent``.

``ClientLimits`` defaults let a normal pod do thousands of queries a second (hundreds of
lookups, each expanded over the search path) and hundreds of new or forwarded names a
second without ever being limited.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_QPS = 5000.0
DEFAULT_UNCACHED_QPS = 250.0
BURST_SECONDS = 2.0  # what a bucket holds: a pod starting up asks much at once
DEFAULT_TCP_CONNECTIONS = 16
DEFAULT_FORWARDS = 32
MAX_CLIENTS = 4096  # buckets kept; beyond it the full (idle) ones are forgotten


@dataclass(frozen=True)
class ClientLimits:
    """What one source address may use of the DNS (rates in queries a second)."""

    qps: float = DEFAULT_QPS
    uncached_qps: float = DEFAULT_UNCACHED_QPS
    tcp_connections: int = DEFAULT_TCP_CONNECTIONS
    forwards: int = DEFAULT_FORWARDS

    def __post_init__(self) -> None:
        for name in ("qps", "uncached_qps"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 1):
                raise ValueError(f"DNS client {name} must be a number >= 1, not {value!r}")
        if self.uncached_qps > self.qps:
            raise ValueError(
                f"DNS client uncached_qps ({self.uncached_qps}) cannot exceed qps ({self.qps}):"
                " every uncached query is a query"
            )
        for name in ("tcp_connections", "forwards"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DNS client {name} must be an integer >= 1, not {value!r}")


class TokenBuckets:
    """One token bucket per client: ``qps`` tokens a second, at most ``BURST_SECONDS``
    of them saved. A bucket is ``[tokens, when]``; a new client starts full."""

    def __init__(self, qps: float) -> None:
        self.qps = qps
        self.burst = max(1.0, qps * BURST_SECONDS)
        self.buckets: dict[str, list[float]] = {}
        self.limited = 0  # queries refused a token (dropped over UDP, delayed over TCP)

    def take(self, client: str, now: float) -> bool:
        """Spend one of ``client``'s tokens at ``now``; False (counted) when it has none."""
        bucket = self.buckets.get(client)
        if bucket is None:
            self._room(now)
            self.buckets[client] = [self.burst - 1.0, now]
            return True
        tokens = bucket[0] + (now - bucket[1]) * self.qps
        if tokens > self.burst:
            tokens = self.burst
        bucket[1] = now
        if tokens < 1.0:
            bucket[0] = tokens
            self.limited += 1
            return False
        bucket[0] = tokens - 1.0
        return True

    def reserve(self, client: str, now: float, longest: float) -> float | None:
        """Seconds until ``client``'s next token, which is taken for it (0: at once); None
        (nothing taken) when that is more than ``longest``. Reserving lets several
        waiters of one client each get a slot of their own instead of racing."""
        if self.take(client, now):
            return 0.0
        bucket = self.buckets[client]
        wait = (1.0 - bucket[0]) / self.qps
        if wait > longest:
            return None
        bucket[0] -= 1.0  # below zero: the tokens of the next ``wait`` seconds are spoken for
        return wait

    def _room(self, now: float) -> None:
        """Keep the table bounded: forget the clients whose buckets are full again (they
        start full when they come back, so nothing changes for them)."""
        if len(self.buckets) < MAX_CLIENTS:
            return
        rate, burst = self.qps, self.burst
        full = [
            c for c, (tokens, when) in self.buckets.items() if tokens + (now - when) * rate >= burst
        ]
        for client in full:
            del self.buckets[client]
        if len(self.buckets) >= MAX_CLIENTS:  # all busy at once: only without a client check
            self.buckets.clear()


class Slots:
    """At most ``limit`` of something held at once per client (connections, forwards)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: dict[str, int] = {}
        self.refused = 0

    def acquire(self, client: str) -> bool:
        """Hold one more for ``client``; False (counted) when it holds ``limit`` already."""
        count = self.held.get(client, 0)
        if count >= self.limit:
            self.refused += 1
            return False
        self.held[client] = count + 1
        return True

    def release(self, client: str) -> None:
        """Give one back (the table keeps only clients holding some)."""
        count = self.held.get(client, 0) - 1
        if count > 0:
            self.held[client] = count
        else:
            self.held.pop(client, None)
