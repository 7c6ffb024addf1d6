"""One watch as a raw TLS stream: HTTP/1.1, chunked, one JSON event per line.

Cheap on purpose: no HTTP library, no asyncio TLS transport (its pure-Python record
shuffling costs more than the event itself) and no JSON decoding per event. The socket is
a non-blocking ``ssl.SSLSocket`` read from a ``loop.add_reader`` callback, so decryption
happens in OpenSSL's C code straight off the kernel buffer. The head is read once;
each event line gives its type (the first ``"type":"..."``) and its resourceVersion (the
first ``"resourceVersion":"..."``, the object's own: inside a JSON string every quote is
escaped, so the pattern cannot match there). An ``ERROR`` event's code is read too.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

TYPE = re.compile(rb'"type":\s*"(\w+)"')
VERSION = re.compile(rb'"resourceVersion":\s*"(\d+)"')
CODE = re.compile(rb'"code":\s*(\d+)')

READ_SIZE = 256 * 1024

# (event type, resourceVersion or 0, HTTP-like code of an ERROR event or 0)
EventSink = Callable[[bytes, int, int], None]


@dataclass(frozen=True)
class Endpoint:
    """Where the master listens and how to trust it."""

    host: str
    port: int
    context: ssl.SSLContext


def auth_header(token: str) -> dict[str, str]:
    """A bearer token's header; none for "" (a client certificate authenticates)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def request_head(endpoint: Endpoint, path: str, query: dict[str, str], token: str) -> bytes:
    """The bytes of one GET request with a bearer token ("": none, mTLS)."""
    target = f"{path}?{urlencode(query)}" if query else path
    auth = "".join(f"{k}: {v}\r\n" for k, v in auth_header(token).items())
    return (
        f"GET {target} HTTP/1.1\r\nHost: {endpoint.host}:{endpoint.port}\r\n"
        f"{auth}Accept: application/json\r\nUser-Agent: podnet-sim\r\n\r\n"
    ).encode()


def parse_event(line: bytes) -> tuple[bytes, int, int]:
    """(type, resourceVersion, error code) of one watch event line."""
    kind = TYPE.search(line, 0, 64)
    version = VERSION.search(line)
    code = CODE.search(line) if kind and kind.group(1) == b"ERROR" else None
    return (
        kind.group(1) if kind else b"",
        int(version.group(1)) if version else 0,
        int(code.group(1)) if code else 0,
    )


class WatchStream:
    """Reads one watch response; ``done`` resolves with the HTTP status when it ends."""

    def __init__(
        self, sink: EventSink, sock: ssl.SSLSocket, lines: Callable[[bytes], None] | None = None
    ) -> None:
        self.sink = sink
        self.lines = lines  # also given each whole event line, when set
        self.sock = sock
        self.status = 0
        self.events = 0  # event lines read
        self.broken = False  # the body was not valid chunked framing
        self.opened: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._head = b""
        self._buffer = bytearray()  # undecoded chunked body
        self._line = bytearray()  # the event line so far
        self._left = -1  # bytes left in the current chunk (-1: expect a size line)
        self._closed = False

    def readable(self) -> None:
        """The ``add_reader`` callback: read everything OpenSSL can give now."""
        while not self._closed:
            try:
                data = self.sock.recv(READ_SIZE)
            except (ssl.SSLWantReadError, BlockingIOError):
                return
            except (OSError, ssl.SSLError):
                data = b""
            if not data:
                self.close()
                return
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if not self.status:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.status = int(self._head[9:12])
            data, self._head = self._head[end + 4 :], b""
            if not self.opened.done():
                self.opened.set_result(self.status)
            if self.status != 200:
                self.close()
                return
        self._buffer += data
        self._decode()

    def _decode(self) -> None:
        """Chunked transfer coding: size line, data, CRLF; a zero size ends the body."""
        buffer = self._buffer
        position = 0
        while position < len(buffer):
            if self._left == -1:  # a size line
                end = buffer.find(b"\r\n", position)
                if end < 0:
                    break
                try:
                    size = int(buffer[position:end].split(b";")[0], 16)
                except ValueError:  # not chunked framing (a server bug): give up
                    self.broken = True
                    self.close()
                    break
                position = end + 2
                if size == 0:
                    self.close()
                    break
                self._left = size
            elif self._left == 0:  # the CRLF after a chunk's data
                if len(buffer) - position < 2:
                    break
                position += 2
                self._left = -1
            else:
                take = min(self._left, len(buffer) - position)
                self._body(buffer[position : position + take])
                position += take
                self._left -= take
        del buffer[:position]

    def _body(self, piece: bytearray) -> None:
        start = 0
        while True:
            end = piece.find(b"\n", start)
            if end < 0:
                self._line += piece[start:]
                return
            if self._line:
                self._line += piece[start:end]
                line = bytes(self._line)
                self._line.clear()
            else:
                line = bytes(piece[start:end])
            start = end + 1
            if line.strip():
                self.events += 1
                self.sink(*parse_event(line))
                if self.lines is not None:
                    self.lines(line)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()
        if not self.opened.done():
            self.opened.set_result(self.status)
        if not self.done.done():
            self.done.set_result(self.status)


async def _ready(sock: socket.socket, write: bool) -> None:
    """Wait until ``sock`` is readable (or writable)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await waiter
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def tls_connect(endpoint: Endpoint) -> ssl.SSLSocket:
    """A connected, handshaken, non-blocking TLS socket to the master."""
    loop = asyncio.get_running_loop()
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setblocking(False)
    try:
        await loop.sock_connect(raw, (endpoint.host, endpoint.port))
        sock = endpoint.context.wrap_socket(
            raw, server_hostname=endpoint.host, do_handshake_on_connect=False
        )
    except BaseException:
        raw.close()
        raise
    try:
        while True:
            try:
                sock.do_handshake()
                return sock
            except ssl.SSLWantReadError:
                await _ready(sock, write=False)
            except ssl.SSLWantWriteError:
                await _ready(sock, write=True)
    except BaseException:
        sock.close()
        raise


async def send_all(sock: ssl.SSLSocket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except (ssl.SSLWantWriteError, BlockingIOError):
            await _ready(sock, write=True)
        except ssl.SSLWantReadError:
            await _ready(sock, write=False)


async def open_watch(
    endpoint: Endpoint,
    path: str,
    query: dict[str, str],
    token: str,
    sink: EventSink,
    lines: Callable[[bytes], None] | None = None,
) -> WatchStream:
    """Connect, send the request and wait for the response head."""
    sock = await tls_connect(endpoint)
    stream = WatchStream(sink, sock, lines)
    try:
        await send_all(sock, request_head(endpoint, path, query, token))
        asyncio.get_running_loop().add_reader(sock.fileno(), stream.readable)
        await stream.opened
    except BaseException:
        stream.close()
        raise
    return stream
