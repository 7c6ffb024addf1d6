"""A TCP listener that bounds its connections: per source address, in all, and in time.

asyncio's own server accepts every connection it can, and on "too many open files" logs
the failure once per attempt: a pod pinned 5,000 of the master's descriptors with idle
connections, and 11,000 connections made the API relay log 10,558 errors (issue 19,
finding 12). ``Listener`` accepts in its own loop instead:

- at most ``per_source`` connections from one address, and ``total`` in all (by default
  what the process's descriptor limit allows, less a reserve for everything else); a
  connection over either is accepted and reset at once, so the client sees the refusal
  and the descriptor is free again;
- a failed accept (EMFILE, ENFILE, ENOBUFS) waits ``ACCEPT_RETRY`` before the next one,
  never a busy loop; refusals and failures are logged at most once per period
  (``podnet.ratelog``), with the number left out;
- what a connection may do and for how long (a TLS handshake deadline, an idle
  timeout) is the ``serve`` coroutine's: it runs for the connection's lifetime and the
  connection is counted until it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from podnet.ratelog import RateLimitedLog

log = logging.getLogger("podnet.listener")

ACCEPT_RETRY = 0.1  # seconds after a failed accept (no descriptor left) before the next
FD_RESERVE = 256  # descriptors kept for everything but connections (etcd, files, logs),
# or a quarter of a lower limit
Serve = Callable[[socket.socket], Awaitable[None]]


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds on one listener's connections (0: no per-source cap; total 0: from the
    descriptor limit)."""

    per_source: int = 1000
    total: int = 0
    handshake_timeout: float = 10.0  # seconds to finish TLS (or, relayed, to say anything)
    idle_timeout: float = 120.0  # seconds a connection may stay without a request/bytes

    def __post_init__(self) -> None:
        if self.per_source < 0 or self.total < 0:
            raise ValueError("connection caps are counts (0: the default)")
        if self.handshake_timeout <= 0 or self.idle_timeout <= 0:
            raise ValueError("connection timeouts are positive seconds")


def descriptor_budget(fds_per_connection: int = 1) -> int:
    """How many connections the process's descriptor limit leaves room for."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, (soft - min(FD_RESERVE, soft // 4)) // fds_per_connection)


class Listener:
    """Accepts on ``sock`` and runs ``serve`` for each connection within the limits."""

    def __init__(
        self,
        sock: socket.socket,
        serve: Serve,
        limits: ConnectionLimits,
        name: str,
        fds_per_connection: int = 1,
    ) -> None:
        self.sock = sock
        self.serve = serve
        self.limits = limits
        self.name = name
        self.total = limits.total or descriptor_budget(fds_per_connection)
        self.by_source: dict[str, int] = {}
        self.open = 0
        self.refused = 0
        self.accept_errors = 0
        self._log = RateLimitedLog(log)
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Accept in the background until ``close``."""
        self.sock.setblocking(False)
        self._accepting = asyncio.create_task(self._accept_forever(), name=f"{self.name}-accept")

    async def close(self) -> None:
        """Stop accepting and end every connection's ``serve``."""
        tasks = [t for t in (self._accepting, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.sock.close()

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(self.sock)
            except OSError as exc:  # no descriptor or buffer left: wait, never spin
                self.accept_errors += 1
                name = errno.errorcode.get(exc.errno or 0, "error")
                self._log.warning(name, "%s: accept failed: %s", self.name, exc)
                await asyncio.sleep(ACCEPT_RETRY)
                continue
            source = str(address[0]) if isinstance(address, tuple) else str(address)
            why = self._refusal(source)
            if why:
                self.refused += 1
                self._log.warning(why, "%s: connection from %s refused: %s", self.name, source, why)
                _reset(conn)
                continue
            self._count(source, 1)
            task = asyncio.create_task(self._serve(conn, source))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _refusal(self, source: str) -> str:
        if self.open >= self.total:
            return f"{self.total} connections open (the listener's cap)"
        cap = self.limits.per_source
        if cap and self.by_source.get(source, 0) >= cap:
            return f"{cap} connections open from one source (the per-source cap)"
        return ""

    async def _serve(self, conn: socket.socket, source: str) -> None:
        try:
            await self.serve(conn)
        except Exception as exc:  # one connection's failure is that connection's alone
            log.debug("%s: connection from %s ended: %r", self.name, source, exc)
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            self._count(source, -1)

    def _count(self, source: str, delta: int) -> None:
        self.open += delta
        left = self.by_source.get(source, 0) + delta
        if left > 0:
            self.by_source[source] = left
        else:
            self.by_source.pop(source, None)


def _reset(conn: socket.socket) -> None:
    """Close with a RST (SO_LINGER 0): the client learns at once, no TIME_WAIT here."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def listening_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A non-blocking IPv4 TCP socket listening on ``host``:``port``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock
