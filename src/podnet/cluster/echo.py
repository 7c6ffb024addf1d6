"""A tiny TCP and UDP echo server, the default process of a test pod.

``python -m podnet.cluster.echo [--port 8080]... [--bind 0.0.0.0]`` answers every TCP
stream and UDP datagram with the same bytes, on each ``--port`` given (8080 when none),
and logs one line per TCP connection with the peer's address (the NAT test reads it to
see whose address arrived). It only answers: it never starts traffic. Connections idle
for ``IDLE_TIMEOUT`` seconds are closed, at most ``MAX_CONNECTIONS`` are served at once,
and SIGTERM/SIGINT end it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

DEFAULT_PORT = 8080
IDLE_TIMEOUT = 30.0
MAX_CONNECTIONS = 256
CHUNK = 65536


class UdpEcho(asyncio.DatagramProtocol):
    """Send every datagram back to where it came from."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if self.transport is not None:
            self.transport.sendto(data, addr)


async def _echo_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        data = await asyncio.wait_for(reader.read(CHUNK), IDLE_TIMEOUT)
        if not data:
            return
        writer.write(data)
        await writer.drain()


def tcp_handler(slots: asyncio.Semaphore) -> Handler:
    """The connection callback: log the peer, echo until EOF, idle timeout or error."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if slots.locked():
            writer.close()
            return
        async with slots:
            print(f"tcp connection from {peer[0]}:{peer[1]}", flush=True)
            try:
                await _echo_stream(reader, writer)
            except (TimeoutError, ConnectionError):
                pass
            finally:
                writer.close()

    return handle


async def serve(bind: str, ports: Sequence[int] = (DEFAULT_PORT,)) -> None:
    """Serve TCP and UDP echo on ``bind`` and each of ``ports`` until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    handler = tcp_handler(asyncio.Semaphore(MAX_CONNECTIONS))
    servers: list[asyncio.Server] = []
    endpoints: list[asyncio.BaseTransport] = []
    try:
        for port in dict.fromkeys(ports):
            servers.append(await asyncio.start_server(handler, bind, port, reuse_address=True))
            udp, _ = await loop.create_datagram_endpoint(UdpEcho, local_addr=(bind, port))
            endpoints.append(udp)
            print(f"echo: serving tcp+udp on {bind}:{port}", flush=True)
        await stop.wait()
    finally:
        for transport in endpoints:
            transport.close()
        for server in servers:
            server.close()
            await server.wait_closed()


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse options and serve."""
    parser = argparse.ArgumentParser(prog="python -m podnet.cluster.echo")
    parser.add_argument(
        "--port", type=int, action="append", help=f"repeatable (default {DEFAULT_PORT})"
    )
    parser.add_argument("--bind", default="0.0.0.0")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.bind, args.port or [DEFAULT_PORT]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
