"""TCP echo inside many network namespaces from one event loop thread, so a test probes
reachability without a process per pod (the chaos runtime's sandboxes)."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from podnet import netns

ECHO_PORT = 8080


class EchoServers:
    """TCP echo on port 8080 inside each live sandbox, served by one event loop thread.

    The listening socket is created inside the sandbox's namespace (a socket stays in
    the namespace it was made in). ``stop`` closes it and every accepted connection, so
    nothing of ours pins a namespace that is about to be removed."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: dict[str, asyncio.Server] = {}
        self.conns: dict[str, set[asyncio.StreamWriter]] = {}

    def start(self, key: str, namespace: str) -> None:
        """Serve echo in ``namespace`` under ``key``."""
        with netns.entered(namespace):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", ECHO_PORT))
        sock.listen(64)
        sock.setblocking(False)
        conns: set[asyncio.StreamWriter] = set()

        async def serve() -> asyncio.Server:
            return await asyncio.start_server(self._handler(conns), sock=sock)

        server = asyncio.run_coroutine_threadsafe(serve(), self.loop).result(10)
        self.servers[key], self.conns[key] = server, conns

    def _handler(self, conns: set[asyncio.StreamWriter]) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conns.add(writer)
            try:
                while data := await asyncio.wait_for(reader.read(4096), 10):
                    writer.write(data)
                    await writer.drain()
            except (OSError, TimeoutError):
                pass
            finally:
                conns.discard(writer)
                writer.close()

        return handle

    def stop(self, key: str) -> None:
        """Close ``key``'s listener and connections (no-op if unknown)."""
        server, conns = self.servers.pop(key, None), self.conns.pop(key, set())
        if server is None:
            return

        async def close() -> None:
            server.close()
            for writer in list(conns):
                writer.transport.abort()
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)

    def close(self) -> None:
        """Stop every server and the loop."""
        for key in list(self.servers):
            self.stop(key)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
