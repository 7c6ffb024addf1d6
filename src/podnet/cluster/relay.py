"""The API relay: the master's loopback port, made reachable inside one node namespace.

The master listens on 127.0.0.1 of the root namespace only (network-safety rule), and a
node agent runs inside its node namespace, whose 127.0.0.1 is its own. The relay runs in
the root namespace, opens its *listening* socket inside the node namespace (a socket
stays in the namespace it was created in) on 127.0.0.1:<port>, and forwards each
connection to 127.0.0.1:<port> of the root namespace. So the node's kubeconfig names the
same ``https://127.0.0.1:<port>`` as the admin's, and TLS passes through untouched.

With several masters (``--target-port`` repeated) the relay is the agent's failover: each
connection goes to the master that answered last, and on a refused or timed-out connect
to the next one in order, so an agent keeps one server address while masters die. Without
``--netns`` it listens on the root namespace's loopback: the admin kubeconfig's single
server in front of several masters.

    python -m podnet.cluster.relay --netns pn-<id>-node1 --port 6443 \
        --target-port 6443 --target-port 6444

On a real host, ``--target HOST:PORT`` names masters elsewhere (the listening side stays
127.0.0.1):

    python -m podnet.cluster.relay --port 6443 --target 10.0.0.21:6443 --target 10.0.0.22:6443

The local cluster's relays are loopback only on both sides, but one per master in the
external host's namespace, which listens on that master's underlay address
(``--host``, see ``podnet.cluster.masteraccess``): the endpoint of ``default/kubernetes``.
In the root namespace it only ever listens on 127.0.0.1. SIGTERM ends it.

Bounds (``podnet.listener``): at most ``--max-connections-per-source`` connections from
one address (a pod reaching the master's address is one source) and what the descriptor
limit allows in all; a client that says nothing within ``--first-byte-timeout`` seconds
(a TLS client speaks first) or whose connection carries no byte either way for
``--idle-timeout`` seconds is closed; accept failures are logged once per period.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Awaitable, Callable

from podnet import logsetup, netns
from podnet.cluster.echo import Handler
from podnet.listener import ConnectionLimits, Listener

CHUNK = 65536
CONNECT_TIMEOUT = 3.0  # per master; a refused connect (dead master) fails at once
# An agent, the controllers or kubectl hold a few connections each; 256 from one source
# is far beyond them and keeps one pod from the relay's descriptors.
PER_SOURCE = 256
FIRST_BYTE_TIMEOUT = 10.0
IDLE_TIMEOUT = 900.0  # watches without bookmarks can be quiet for minutes


def listen_in(namespace: str | None, port: int, host: str = "127.0.0.1") -> socket.socket:
    """A listening TCP socket on ``host``:``port`` inside ``namespace`` (None: here)."""
    if namespace is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    else:
        with netns.entered(namespace):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


class Activity:
    """When a relayed connection last carried a byte, either way."""

    def __init__(self, idle_timeout: float) -> None:
        self.idle_timeout = idle_timeout
        self.last = asyncio.get_running_loop().time()

    def idle_for(self) -> float:
        return asyncio.get_running_loop().time() - self.last


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, activity: Activity
) -> None:
    try:
        while True:
            try:
                wait = max(0.1, activity.idle_timeout - activity.idle_for())
                data = await asyncio.wait_for(reader.read(CHUNK), wait)
            except TimeoutError:
                if activity.idle_for() >= activity.idle_timeout:
                    break  # quiet both ways for the idle timeout: hang up
                continue
            if not data:
                break
            activity.last = asyncio.get_running_loop().time()
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


Address = tuple[str, int]


class Targets:
    """The masters' addresses, tried from the one that answered last, then in order."""

    def __init__(self, addresses: list[Address]) -> None:
        if not addresses:
            raise ValueError("the relay needs at least one target")
        self.addresses = list(addresses)
        self.current = 0

    def order(self) -> list[Address]:
        """Addresses in the order to try them now."""
        return self.addresses[self.current :] + self.addresses[: self.current]

    def worked(self, address: Address) -> None:
        """Stick to ``address`` for the next connections."""
        self.current = self.addresses.index(address)


async def open_first(
    targets: Targets,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A connection to the first master that accepts one, or None if none does."""
    for host, port in targets.order():
        try:
            opened = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT)
        except (OSError, TimeoutError):
            continue
        targets.worked((host, port))
        return opened
    return None


def _addresses(targets: int | list[int] | list[Address]) -> list[Address]:
    items = [targets] if isinstance(targets, int) else targets
    return [("127.0.0.1", t) if isinstance(t, int) else t for t in items]


def connection_handler(
    target: int | list[int] | list[Address],
    first_byte_timeout: float = FIRST_BYTE_TIMEOUT,
    idle_timeout: float = IDLE_TIMEOUT,
) -> Handler:
    """The callback that joins one inner connection to a master (a loopback port or
    ``(host, port)``; several: failover in order), once the client has said something
    (within ``first_byte_timeout`` s), until it is idle for ``idle_timeout`` s."""
    targets = Targets(_addresses(target))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await asyncio.wait_for(reader.read(CHUNK), first_byte_timeout)
        except (TimeoutError, ConnectionError):
            first = b""
        upstream = await open_first(targets) if first else None
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        up_writer.write(first)
        activity = Activity(idle_timeout)
        await asyncio.gather(_pipe(reader, up_writer, activity), _pipe(up_reader, writer, activity))

    return handle


def stream_server(handler: Handler) -> Callable[[socket.socket], Awaitable[None]]:
    """``handler`` over an accepted socket, for ``podnet.listener``."""

    async def serve(conn: socket.socket) -> None:
        reader, writer = await asyncio.open_connection(sock=conn, limit=CHUNK)
        try:
            await handler(reader, writer)
        finally:
            with contextlib.suppress(OSError):
                writer.close()

    return serve


async def relay(
    namespace: str | None,
    port: int,
    targets: int | list[int] | list[Address],
    host: str = "127.0.0.1",
    limits: ConnectionLimits | None = None,
) -> None:
    """Forward connections until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if namespace is None and host != "127.0.0.1":
        raise ValueError("in the root namespace the relay listens on 127.0.0.1 only")
    limits = limits or ConnectionLimits(PER_SOURCE, 0, FIRST_BYTE_TIMEOUT, IDLE_TIMEOUT)
    sock = listen_in(namespace, port, host)
    handler = connection_handler(targets, limits.handshake_timeout, limits.idle_timeout)
    # two descriptors a connection: the client's and the master's
    listener = Listener(sock, stream_server(handler), limits, "relay", fds_per_connection=2)
    listener.start()
    where = namespace or "root namespace"
    print(f"relay: {where} {host}:{port} -> {_addresses(targets)}", flush=True)
    try:
        await stop.wait()
    finally:
        await listener.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m podnet.cluster.relay")
    parser.add_argument("--netns", default=None, help="default: the root namespace")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (other: --netns only)"
    )
    parser.add_argument(
        "--target-port", type=int, action="append", default=[], help="repeat; default: --port"
    )
    parser.add_argument(
        "--target", action="append", default=[], help="HOST:PORT of a master (repeat)"
    )
    parser.add_argument("--max-connections-per-source", type=int, default=PER_SOURCE)
    parser.add_argument("--first-byte-timeout", type=float, default=FIRST_BYTE_TIMEOUT)
    parser.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT)
    parser.add_argument("--log-level", choices=logsetup.LEVELS, default="info")
    parser.add_argument("--log-format", choices=logsetup.FORMATS, default="text")
    args = parser.parse_args(argv)
    targets = [("127.0.0.1", p) for p in args.target_port]
    for value in args.target:
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit():
            parser.error(f"--target {value!r}: expected HOST:PORT")
        targets.append((host.strip("[]"), int(port)))
    if args.netns is None and args.host != "127.0.0.1":
        parser.error("--host other than 127.0.0.1 needs --netns (the root namespace: loopback)")
    try:
        limits = ConnectionLimits(
            args.max_connections_per_source, 0, args.first_byte_timeout, args.idle_timeout
        )
    except ValueError as exc:
        parser.error(str(exc))
    targets = targets or [("127.0.0.1", args.port)]
    logsetup.configure(args.log_level, args.log_format)
    asyncio.run(relay(args.netns, args.port, targets, args.host, limits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
