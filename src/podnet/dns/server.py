"""The DNS listeners: UDP and TCP on one address and port, feeding a ``QueryHandler``.

Who may ask: the sockets can be bound to a device (``SO_BINDTODEVICE``): the node agent
binds them to br0, so the kernel hands them only packets that came in from this node's
pods, never from the tunnel (other nodes' pods) or the underlay. On top of that, a query
whose source is not in ``clients`` (this node's pod subnet) is dropped, and a TCP
connection from elsewhere is closed at once.

Bounds, so that no client can make the server grow: at most ``tcp_connections`` open TCP
connections (more are closed on accept), each closed after ``tcp_idle`` seconds without a
complete query or ``tcp_queries`` queries; at most ``udp_pending`` forwarded UDP queries
waiting (more are dropped: the client retries); UDP answers are dropped rather than
queued when the socket's send buffer is full. The answer
caches are bounded by entries and bytes (``podnet.dns.cache``).

Per client (source address, ``podnet.dns.ratelimit``), so that one pod cannot take what
the others need: token buckets of queries and of uncached queries (a UDP query beyond
them is dropped before any work is done for it; a TCP connection waits for its next
token), at most
``clients.tcp_connections`` TCP connections, and at most ``clients.forwards`` queries
waiting on upstreams (``podnet.dns.forwarder``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
import struct
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from podnet.dns.cache import HIT
from podnet.dns.handler import QueryHandler
from podnet.dns.ratelimit import ClientLimits, Slots, TokenBuckets

log = logging.getLogger("podnet.dns.server")

UDP_RECEIVE_BUFFER = 4 * 1024 * 1024  # the kernel's queue of datagrams (capped by rmem_max)
UDP_RECEIVE_SIZE = 65535
UDP_BATCH = 64  # datagrams read per wake-up before other work gets its turn
MAX_KNOWN_SOURCES = 4096
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Listen:
    """Where the server listens and whom it answers (``clients`` None: anyone)."""

    address: str
    port: int = 53
    device: str | None = None
    clients: Network | None = None


@dataclass(frozen=True)
class Limits:
    """The server's bounds (see the module docstring)."""

    tcp_connections: int = 128
    tcp_idle: float = 10.0
    tcp_queries: int = 1000
    udp_pending: int = 512
    clients: ClientLimits = field(default_factory=ClientLimits)  # per source address


class ClientCheck:
    """Whether a source address may ask (remembered per address string, bounded)."""

    def __init__(self, clients: Network | None) -> None:
        self.clients = clients
        self.known: dict[str, bool] = {}  # source address -> allowed
        self.refused = 0

    def __call__(self, host: str) -> bool:
        if self.clients is None:
            return True
        allowed = self.known.get(host)
        if allowed is None:
            try:
                allowed = ipaddress.ip_address(host) in self.clients
            except ValueError:
                allowed = False
            if len(self.known) >= MAX_KNOWN_SOURCES:
                self.known.clear()
            self.known[host] = allowed
        if not allowed:
            self.refused += 1
        return allowed


class _Udp:
    """The UDP socket, read straight from the event loop's selector: each wake-up reads
    up to ``UDP_BATCH`` datagrams, and answers go out with a non-blocking ``sendto``
    (one dropped when the kernel's buffer is full: the client asks again). This costs
    about half of what asyncio's datagram transport does per query, and queues
    nothing in user space. A query beyond its client's token buckets is dropped right
    after it is read (one dict lookup and a few float operations)."""

    def __init__(self, server: DnsServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock

    def readable(self) -> None:
        sock, server = self.sock, self.server
        answer_of, allowed = server.handler.answer, server.allowed
        cache = server.handler.udp_cache
        cached, known, cell_of = cache.answers.get, allowed.known.get, cache.cells.get
        cells = server.handler.tally.cells  # counted per query: podnet.dns.tally
        recvfrom, sendto = sock.recvfrom, sock.sendto
        take, work = server.buckets.take, server.uncached.take
        now = server.clock()  # one clock read per batch
        for _ in range(UDP_BATCH):
            try:
                data, addr = recvfrom(UDP_RECEIVE_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # an ICMP error about an earlier answer
                log.debug("UDP error: %s", exc)
                continue
            host = addr[0]
            if not (known(host) or allowed(host)) or not take(host, now):
                continue
            key = data[2:]
            hit = cached(key)  # the common case, inline: a repeated question
            if hit is not None:
                cells[cell_of(key, HIT)] += 1
                try:
                    sendto(data[:2] + hit, addr)
                except OSError:
                    server.dropped += 1
                continue
            if not work(host, now):
                continue
            answer = answer_of(data, False, host)
            if answer is None:
                continue
            if isinstance(answer, bytes):
                self.send(answer, addr)
            else:
                server.later(answer, self, addr)

    def send(self, answer: bytes, addr: tuple[Any, ...]) -> None:
        try:
            self.sock.sendto(answer, addr)
        except (BlockingIOError, InterruptedError):
            self.server.dropped += 1
        except OSError as exc:
            log.debug("UDP answer to %s not sent: %s", addr[0], exc)


def _socket(listen: Listen, kind: socket.SocketKind, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in listen.address else socket.AF_INET
    sock = socket.socket(family, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if kind == socket.SOCK_DGRAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RECEIVE_BUFFER)
        if listen.device:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, listen.device.encode())
        sock.bind((listen.address, port))
        if kind == socket.SOCK_STREAM:
            sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def bound_pair(listen: Listen, attempts: int = 20) -> tuple[socket.socket, socket.socket]:
    """UDP and TCP sockets bound to one port; port 0 takes a free TCP port and tries
    again when that port is taken for UDP."""
    for _ in range(attempts if listen.port == 0 else 1):
        tcp = _socket(listen, socket.SOCK_STREAM, listen.port)
        try:
            return _socket(listen, socket.SOCK_DGRAM, tcp.getsockname()[1]), tcp
        except OSError as exc:
            tcp.close()
            if exc.errno != errno.EADDRINUSE or listen.port != 0:
                raise
    raise OSError(errno.EADDRINUSE, "no port free for both UDP and TCP")


class DnsServer:
    """UDP and TCP listeners answering through ``handler``."""

    def __init__(
        self,
        handler: QueryHandler,
        listen: Listen,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: the token buckets' time (tests stop it)."""
        self.handler = handler
        self.clock = clock
        self.listen = listen
        self.limits = limits or Limits()
        self.allowed = ClientCheck(listen.clients)
        clients = self.limits.clients
        self.buckets = TokenBuckets(clients.qps)  # every query
        self.uncached = TokenBuckets(clients.uncached_qps)  # those the cache cannot answer
        self.tcp_slots = Slots(clients.tcp_connections)
        self.port = listen.port  # the bound port (when ``listen.port`` is 0)
        self.connections = 0
        self.dropped = 0  # answers or queries dropped at a bound
        self._udp: _Udp | None = None
        self._tcp: asyncio.Server | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Bind both listeners (OSError when the address or device is missing)."""
        udp, tcp = bound_pair(self.listen)
        self.port = tcp.getsockname()[1]
        loop = asyncio.get_running_loop()
        self._udp = _Udp(self, udp)
        loop.add_reader(udp, self._udp.readable)
        self._tcp = await asyncio.start_server(self._serve_tcp, sock=tcp)
        log.info("DNS listening on %s port %d (UDP, TCP)", self.listen.address, self.port)

    async def stop(self) -> None:
        """Close the listeners and drop what is in progress."""
        if self._udp is not None:
            asyncio.get_running_loop().remove_reader(self._udp.sock)
            self._udp.sock.close()
            self._udp = None
        if self._tcp is not None:
            self._tcp.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp.wait_closed(), 1.0)
            self._tcp = None
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    @property
    def serving(self) -> bool:
        return self._udp is not None

    def later(
        self, answer: Coroutine[Any, Any, bytes | None], udp: _Udp, addr: tuple[Any, ...]
    ) -> None:
        """Send a forwarded UDP answer when it comes (dropped beyond ``udp_pending``)."""
        if len(self._pending) >= self.limits.udp_pending:
            answer.close()
            self.dropped += 1
            return
        task = asyncio.create_task(self._send_later(answer, udp, addr))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send_later(
        self, answer: Coroutine[Any, Any, bytes | None], udp: _Udp, addr: tuple[Any, ...]
    ) -> None:
        try:
            data = await answer
        except Exception:
            log.exception("a forwarded answer failed")
            return
        if data is not None:
            udp.send(data, addr)

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host = (writer.get_extra_info("peername") or ("",))[0]
        if not self.allowed(host) or self.connections >= self.limits.tcp_connections:
            self.dropped += 1
            writer.transport.abort()
            return
        if not self.tcp_slots.acquire(host):
            writer.transport.abort()
            return
        self.connections += 1
        try:
            await self._tcp_queries(reader, writer, host)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError):
            pass
        finally:
            self.connections -= 1
            self.tcp_slots.release(host)
            writer.close()

    async def _tcp_queries(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str
    ) -> None:
        limits = self.limits
        for _ in range(limits.tcp_queries):
            async with asyncio.timeout(limits.tcp_idle):
                (size,) = struct.unpack("!H", await reader.readexactly(2))
                data = await reader.readexactly(size)
            if not await self._paced(self.buckets, host):
                return
            cached = self.handler.tcp_cache.answers.get(data[2:]) is not None
            if not (cached or await self._paced(self.uncached, host)):
                return
            answer = self.handler.answer(data, True, host)
            if answer is not None and not isinstance(answer, bytes):
                answer = await answer
            if answer is None:
                continue
            writer.write(struct.pack("!H", len(answer)) + answer)
            async with asyncio.timeout(limits.tcp_idle):
                await writer.drain()
        await _part(reader, writer, limits.tcp_idle)

    async def _paced(self, bucket: TokenBuckets, host: str) -> bool:
        """Wait for ``host``'s next token of ``bucket``; False (close the connection)
        when it is so far over its rate that it would idle out waiting."""
        wait = bucket.reserve(host, self.clock(), self.limits.tcp_idle)
        if wait:
            await asyncio.sleep(wait)
        return wait is not None


async def _part(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, idle: float) -> None:
    """End a connection at its query bound without losing the answers already written.

    Closing a socket whose receive buffer still holds queries (a client pipelining past
    the bound) sends a reset, and the client's kernel may drop answers it has not read
    yet. So: FIN after the answers, then read and discard what the client still sends,
    for at most ``idle`` seconds and 64 KiB, before the caller closes."""
    if not writer.can_write_eof():
        return
    writer.write_eof()
    left = 65536
    async with asyncio.timeout(idle):
        while left > 0 and (chunk := await reader.read(min(left, 4096))):
            left -= len(chunk)
