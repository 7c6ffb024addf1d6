"""Many reachability probes from one network namespace at once, for policy tests.

Run inside a pod's namespace: ``python -m podnet.testing.probe TARGETS_JSON`` where the
JSON is a list of ``[ip, protocol, port]`` or ``[ip, protocol, port, source_port]``
(protocol ``tcp`` or ``udp``); it prints a JSON list of booleans in the same order. A
test that probes the same pairs again and again gives each probe its own source port:
otherwise the kernel may pick a port used a minute ago, and conntrack, which still holds
that earlier flow, would let a now-denied datagram through as part of it.

TCP: the connection opens (a listener answered) and the echo comes back. UDP: a datagram
sent to an echo server comes back. Every probe is bounded in time (``TIMEOUT``, a fixed
number of UDP tries), and all run concurrently, so a batch takes about one timeout
however many targets are denied.
"""

from __future__ import annotations

import asyncio
import errno
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from podnet import netns

TIMEOUT = 1.5
UDP_TRIES = 3
PAYLOAD = b"podnet-probe\n"


async def tcp(ip: str, port: int, source: int = 0, timeout: float = TIMEOUT) -> bool:
    """Whether a TCP connection to ``ip:port`` opens and echoes within ``timeout``."""
    local = ("0.0.0.0", source) if source else None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(ip, port, local_addr=local)
            try:
                writer.write(PAYLOAD)
                await writer.drain()
                return await reader.readexactly(len(PAYLOAD)) == PAYLOAD
            finally:
                writer.close()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise  # the test's own mistake (a source port in use), not a verdict
        return False
    except (TimeoutError, asyncio.IncompleteReadError):
        return False


class _Answer(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if data == PAYLOAD and not self.received.done():
            self.received.set_result(True)


async def udp(ip: str, port: int, source: int = 0, timeout: float = TIMEOUT) -> bool:
    """Whether a UDP echo from ``ip:port`` answers one of ``UDP_TRIES`` datagrams."""
    loop = asyncio.get_running_loop()
    local = ("0.0.0.0", source) if source else None
    transport, answer = await loop.create_datagram_endpoint(
        _Answer, local_addr=local, remote_addr=(ip, port)
    )
    try:
        for _ in range(UDP_TRIES):
            transport.sendto(PAYLOAD)
            try:
                async with asyncio.timeout(timeout / UDP_TRIES):
                    return await asyncio.shield(answer.received)
            except TimeoutError:
                continue
        return False
    finally:
        transport.close()


async def probe_all(targets: Sequence[Sequence[object]]) -> list[bool]:
    """Every ``(ip, protocol, port)`` probed concurrently."""
    checks = {"tcp": tcp, "udp": udp}
    jobs = []
    for ip, proto, port, *source in targets:
        check = checks[str(proto).lower()]
        jobs.append(check(str(ip), int(str(port)), int(str(source[0])) if source else 0))
    return list(await asyncio.gather(*jobs))


class SourcePorts:
    """Hands out source ports in turn from a range, so that a port comes back only after
    the whole range (tens of thousands of probes, minutes) has been used. The default
    range sits below the kernel's ephemeral ports (32768 and up), so a port the kernel
    picked for some other connection (maybe still in TIME_WAIT) is never asked for."""

    def __init__(self, first: int = 10000, last: int = 32767, start: int | None = None) -> None:
        self.first, self.last = first, last
        self._next = first if start is None else start

    def take(self) -> int:
        """The next port."""
        port = self._next
        self._next = self.first if port >= self.last else port + 1
        return port


def main(argv: list[str] | None = None) -> int:
    """Entry point: probe the JSON list in argv[1]; print the results as JSON."""
    args = sys.argv[1:] if argv is None else argv
    targets = json.loads(args[0])
    print(json.dumps(asyncio.run(probe_all(targets))))
    return 0


if __name__ == "__main__":
    sys.exit(main())


Pair = tuple[str, str, str, int]  # (source key, destination key, protocol, port)


def probe_pairs(
    netns_of: Mapping[str, str],
    ip_of: Mapping[str, Any],
    services: Sequence[tuple[str, int]],
    ports: SourcePorts,
) -> dict[Pair, bool]:
    """Every ordered pair of distinct pods on every (protocol, port) in ``services``: one
    probe process per source pod, inside its namespace, all running at once. Keys of both
    mappings name the pods; protocols are kept as given in the result."""
    jobs = {}
    for src, ns in netns_of.items():
        targets = [
            (str(ip_of[dst]), protocol.lower(), port, ports.take())
            for dst in netns_of
            if dst != src
            for protocol, port in services
        ]
        argv = [sys.executable, "-m", "podnet.testing.probe", json.dumps(targets)]
        jobs[src] = subprocess.Popen(netns.command(ns, argv), stdout=subprocess.PIPE, text=True)
    found: dict[Pair, bool] = {}
    for src, job in jobs.items():
        out, _ = job.communicate(timeout=60)
        results = iter(json.loads(out))
        for dst in netns_of:
            if dst != src:
                for protocol, port in services:
                    found[(src, dst, protocol, port)] = next(results)
    return found
