"""The API relay: the master's loopback port, made reachable inside one node namespace.

The master listens on 127.0.0.1 of the root namespace only (network-safety rule), and a
node agent runs inside its node namespace, whose 127.0.0.1 is its own. The relay runs in
the root namespace, opens its *listening* socket inside the node namespace (a socket
stays in the namespace it was created in) on 127.0.0.1:<port>, and forwards each
connection to 127.0.0.1:<port> of the root namespace. So the node's kubeconfig names the
same ``https://127.0.0.1:<port>`` as the admin's, and TLS passes through untouched.

    python -m podnet.cluster.relay --netns pn-<id>-node1 --port 6443

Loopback only on both sides; SIGTERM ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys

from podnet import netns
from podnet.cluster.echo import Handler

CHUNK = 65536


def listen_in(namespace: str, port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:``port`` inside ``namespace``."""
    with netns.entered(namespace):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


def connection_handler(target_port: int) -> Handler:
    """The callback that joins one inner connection to the master's port."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", target_port), 10
            )
        except (OSError, TimeoutError):
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


async def relay(namespace: str, port: int, target_port: int) -> None:
    """Forward connections until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sock = listen_in(namespace, port)
    handler = connection_handler(target_port)
    server = await asyncio.start_server(handler, sock=sock)
    print(f"relay: {namespace} 127.0.0.1:{port} -> 127.0.0.1:{target_port}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m podnet.cluster.relay")
    parser.add_argument("--netns", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target-port", type=int, default=0, help="default: --port")
    args = parser.parse_args(argv)
    asyncio.run(relay(args.netns, args.port, args.target_port or args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
