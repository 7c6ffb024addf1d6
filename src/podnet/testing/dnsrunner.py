"""The cluster DNS, or a fake upstream, as a process of its own inside a test namespace.

``python -m podnet.testing.dnsrunner serve --subnet 10.128.0.0/23 --objects FILE`` runs
the agent's ``ClusterDns`` (the same listeners, bound to br0 and the subnet's gateway
address) fed by a JSON file of objects as its listings, then by JSON lines on stdin
(``{"type": "ADDED", "kind": "services", "object": {...}}``). It prints ``bound PORT``
once it answers, and ``applied N`` after each line it has applied: the tests' and the
benchmark's readiness signals.

``--unguarded`` drops the device binding and the source check: the tests' proof that
their attacks would get answers without them. ``--client-qps`` and
``--client-uncached-qps`` set the per-client limits (the benchmark's single client
measures the server's capacity with limits it never reaches).

``python -m podnet.testing.dnsrunner upstream --address A --record NAME=IP ...`` runs a
``StaticUpstream`` there and prints ``ready PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from podnet.client import LISTED, WatchEvent
from podnet.dataplane.interface import NodeNetwork
from podnet.dns.ratelimit import DEFAULT_QPS, DEFAULT_UNCACHED_QPS, ClientLimits
from podnet.dns.server import DnsServer, Limits, Listen
from podnet.dns.sync import ClusterDns, DnsSettings
from podnet.model.kinds import ENDPOINT_SLICE, POD, SERVICE, Kind
from podnet.testing.dns import StaticUpstream

KINDS = {kind.plural: kind for kind in (SERVICE, ENDPOINT_SLICE, POD)}


class StdinFeed:
    """Listings from a file, then events from stdin lines, per kind."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]) -> None:
        self.queues: dict[str, asyncio.Queue[WatchEvent]] = {k: asyncio.Queue() for k in KINDS}
        for plural, queue in self.queues.items():
            queue.put_nowait(WatchEvent(LISTED, items=tuple(objects.get(plural, ()))))

    async def watch(self, kind: Kind) -> AsyncIterator[WatchEvent]:
        while True:
            yield await self.queues[kind.plural].get()


def say(line: str) -> None:
    print(line, flush=True)


async def read_lines(feed: StdinFeed, cluster: ClusterDns) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        event = json.loads(line)
        before = cluster.changes
        feed.queues[event["kind"]].put_nowait(WatchEvent(event["type"], event["object"]))
        while cluster.changes == before:
            await asyncio.sleep(0.0005)
        say(f"applied {cluster.changes}")


async def serve(args: argparse.Namespace) -> None:
    subnet = ipaddress.IPv4Network(args.subnet)
    node = NodeNetwork(
        node_name="dns-test",
        node_ip=ipaddress.IPv4Address("192.0.2.1"),
        subnet=subnet,
        cluster_networks=(ipaddress.IPv4Network("10.128.0.0/14"),),
        service_network=ipaddress.IPv4Network("172.30.0.0/16"),
        mtu=1450,
    )
    objects = json.loads(Path(args.objects).read_text()) if args.objects else {}
    feed = StdinFeed(objects)
    settings = DnsSettings(
        port=args.port,
        device=args.device or None,
        upstream_resolv_conf=Path(args.upstream_resolv_conf) if args.upstream_resolv_conf else None,
        retry=0.1,
        limits=Limits(clients=ClientLimits(args.client_qps, args.client_uncached_qps)),
    )
    cluster = ClusterDns(feed, node, settings)
    if args.unguarded:  # the counterfactual of the tests' attacks: no device, no source check
        listen = Listen(str(node.gateway.ip), args.port, None, None)
        cluster.server = DnsServer(cluster.handler, listen, settings.limits)
    tasks = [asyncio.create_task(body(), name=name) for name, body in cluster.tasks()]
    await cluster.bound.wait()
    while not cluster.is_ready():
        await asyncio.sleep(0.01)
    say(f"bound {cluster.server.port}")
    await read_lines(feed, cluster)
    for task in tasks:
        task.cancel()


async def upstream(args: argparse.Namespace) -> None:
    records: dict[str, list[str]] = {}
    for item in args.record:
        name, ip = item.split("=", 1)
        records.setdefault(name, []).append(ip)
    server = await StaticUpstream(records).start(args.address, args.port)
    say(f"ready {server.port}")
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m podnet.testing.dnsrunner")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve")
    run.add_argument("--subnet", required=True)
    run.add_argument("--port", type=int, default=53)
    run.add_argument("--device", default="br0")
    run.add_argument("--objects")
    run.add_argument("--upstream-resolv-conf")
    run.add_argument("--unguarded", action="store_true", help="answer anyone (tests only)")
    run.add_argument("--client-qps", type=float, default=DEFAULT_QPS)
    run.add_argument("--client-uncached-qps", type=float, default=DEFAULT_UNCACHED_QPS)
    fake = sub.add_parser("upstream")
    fake.add_argument("--address", required=True)
    fake.add_argument("--port", type=int, default=53)
    fake.add_argument("--record", action="append", default=[])
    args = parser.parse_args()
    asyncio.run(serve(args) if args.command == "serve" else upstream(args))


if __name__ == "__main__":
    main()
