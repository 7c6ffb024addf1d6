"""The service proxy at scale on the linux data plane: per-packet cost, change and resync.

Run: sudo .venv/bin/python bench/bench_services.py [--services 5000] [--endpoints 10]
     [--rounds 5] [--connections 300] [--changes 50]

A two-node lab (``podnet.testing.servicelab``: VXLAN, pods a and b on node-1, c on
node-2, each answering on TCP 8080). The measured service has pod c (the other node) as
its endpoint; the others get ``--endpoints`` made-up endpoints each, so they cost what
they cost in the kernel (map elements, chains) without needing processes.

- connect latency through the measured cluster IP from pod b, with a table of 10
  services and with one of ``--services``, interleaved over ``--rounds`` rounds of
  ``--connections`` sequential connects (connect, read the answer, close); the medians
  of the rounds' medians, and their ratio (goal: 10-service latency / big-table latency
  >= 0.95: the per-packet cost does not grow with services). The same run measures
  connects to pod c's IP directly, the floor.
- iperf3 from pod b to pod c through a cluster IP and to c's IP, interleaved (goal:
  ratio >= 0.95).
- endpoint change -> kernel at ``--services``: one service's endpoints change and
  ``sync_services`` runs (render, diff, one nft transaction); p50/p99 over
  ``--changes`` changes, and the compile of one change in ``ServiceCompiler``.
- memory: the proxy's state (compiler, table, rendered value) at ``--services``.
- full resync at ``--services``: a restarted data plane (a new ``LinuxDataPlane`` in the
  node) syncing the same table, which reads the kernel's table back and finds nothing to
  do (the agent restart); and a full build into an empty table.

Everything runs inside namespaces this script creates, removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_throughput import IPERF_PORT, iperf
from podnet import netns
from podnet.services.compile import ServiceCompiler
from podnet.services.model import Endpoint, ServicePort, ServiceTable
from podnet.testing.lab import SERVICES, sh
from podnet.testing.servicelab import PORT, Cluster, service_cluster

LATENCY = """
import json, socket, sys, time
ip, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
found = []
for _ in range(count):
    start = time.perf_counter()
    with socket.create_connection((ip, port), timeout=2) as c:
        c.makefile().readline()
    found.append((time.perf_counter() - start) * 1e6)
print(json.dumps(found))
"""


def filler(count: int, endpoints: int, offset: int = 0) -> list[ServicePort]:
    """``count`` services with ``endpoints`` made-up endpoints each (in 10.130.0.0/16:
    cluster network, no pod behind them), on cluster IPs from 172.30.1.0 up."""
    ports = []
    for i in range(count):
        vip = SERVICES.network_address + 256 + i
        base = int(IPv4Address("10.130.0.0")) + (i + offset) * endpoints
        eps = tuple(Endpoint(IPv4Address(base + k), 8080) for k in range(endpoints))
        ports.append(ServicePort("bench", f"s{i:05d}", "", "tcp", 80, vip, endpoints=eps))
    return ports


def table(cluster: Cluster, measured: ServicePort, others: list[ServicePort]) -> ServiceTable:
    ports = [cluster.for_node(measured, 1), *others]
    nodes = tuple(cluster.lab.node_ip(n) for n in sorted(cluster.planes))
    return ServiceTable(tuple(sorted(ports, key=lambda p: p.key)), nodes)


def connects(cluster: Cluster, ip: object, port: int, count: int) -> list[float]:
    """``count`` sequential connects from pod b; each one's latency in microseconds."""
    argv = [sys.executable, "-c", LATENCY, str(ip), str(port), str(count)]
    done = netns.run(cluster.netns_of["b"], argv, timeout=300)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


VIP = SERVICES.network_address + 10


async def sync(cluster: Cluster, node: int, services: ServiceTable) -> float:
    started = time.perf_counter()
    await cluster.planes[node].sync_services(cluster.lab.network(node), services)
    return time.perf_counter() - started


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(cluster: Cluster, args: argparse.Namespace) -> None:
    measured = cluster.service("measured", 10, "c")
    small = table(cluster, measured, filler(9, args.endpoints))
    big = table(cluster, measured, filler(args.services - 1, args.endpoints))
    build = await sync(cluster, 1, big)
    print(f"full build of {args.services} services x {args.endpoints} endpoints: {build:.2f} s")
    print(f"  (transactions in-process: {cluster.planes[1].services.in_process})")
    results: dict[str, list[float]] = {"small": [], "big": [], "pod": []}
    for n in range(args.rounds):  # ABBA order: a drift in time weighs on both alike
        order = (("small", small), ("big", big))
        for name, services in order if n % 2 == 0 else order[::-1]:
            await sync(cluster, 1, services)
            results[name].append(statistics.median(connects(cluster, VIP, 80, args.connections)))
        direct = connects(cluster, cluster.ip_of["c"], PORT, args.connections)
        results["pod"].append(statistics.median(direct))
    small_us, big_us, pod_us = (statistics.median(results[k]) for k in ("small", "big", "pod"))
    print(
        f"connect latency via cluster IP, medians of {args.rounds} rounds x "
        f"{args.connections}: 10 services {small_us:.0f} us, {args.services} services "
        f"{big_us:.0f} us, pod IP directly {pod_us:.0f} us"
    )
    print(f"  ratio 10/{args.services} services: {small_us / big_us:.3f} (goal >= 0.95)")
    print(f"  ratio pod IP / cluster IP (10 services): {pod_us / small_us:.3f}")


async def throughput(cluster: Cluster, args: argparse.Namespace) -> None:
    """iperf3, one TCP stream from pod b to pod c (the other node): to a cluster IP whose
    endpoint is c, and to c's IP, interleaved; medians and the ratio."""
    port = int(IPERF_PORT)
    endpoint = Endpoint(cluster.ip_of["c"], port)
    vip = SERVICES.network_address + 20
    service = ServicePort("bench", "iperf", "", "tcp", port, vip, endpoints=(endpoint,))
    await cluster.apply(cluster.service("measured", 10, "c"), service)
    found: dict[str, list[float]] = {"vip": [], "pod": []}
    server, client = cluster.netns_of["c"], cluster.netns_of["b"]
    for _ in range(args.rounds):
        found["vip"].append(iperf(server, client, str(vip), args.seconds))
        found["pod"].append(iperf(server, client, str(endpoint.ip), args.seconds))
    through, direct = statistics.median(found["vip"]), statistics.median(found["pod"])
    print(
        f"iperf3 across nodes, medians of {args.rounds} x {args.seconds} s: through a "
        f"cluster IP {through:.2f} Gbit/s, to the pod IP {direct:.2f} Gbit/s, ratio "
        f"{through / direct:.3f} (goal >= 0.95)"
    )


async def changes(cluster: Cluster, args: argparse.Namespace) -> None:
    measured = cluster.service("measured", 10, "c")
    others = filler(args.services - 1, args.endpoints)
    await sync(cluster, 1, table(cluster, measured, others))
    timings = []
    for n in range(args.changes):
        k = n % len(others)
        moved = dataclasses.replace(
            others[k], endpoints=filler(1, args.endpoints, 10**4 + n)[0].endpoints
        )
        others[k] = moved
        timings.append(await sync(cluster, 1, table(cluster, measured, others)))
    print(
        f"endpoint change -> kernel at {args.services} services (render, diff, nft): "
        f"p50 {pct(timings, 0.5) * 1000:.1f} ms, p99 {pct(timings, 0.99) * 1000:.1f} ms "
        f"over {args.changes} (goal p99 < 100 ms)"
    )
    compile_times = compile_changes(args)
    print(
        f"compile of one EndpointSlice change at {args.services} services: "
        f"p50 {pct(compile_times, 0.5) * 1000:.2f} ms, p99 {pct(compile_times, 0.99) * 1000:.2f} ms"
    )
    restarted = cluster.lab.plane(1)
    services = table(cluster, measured, others)
    started = time.perf_counter()
    await restarted.sync_services(cluster.lab.network(1), services)
    resync = time.perf_counter() - started
    assert restarted.services.transactions == 0, "a restart found something to change"
    print(
        f"full resync after a restart at {args.services} services (read back, no change): "
        f"{resync:.2f} s (goal < 2 s)"
    )
    sh(cluster.lab.node_ns(1), "nft", "delete", "table", "ip", "podnet_services")
    rebuilt = cluster.lab.plane(1)
    started = time.perf_counter()
    await rebuilt.sync_services(cluster.lab.network(1), services)
    print(f"full build after the table was lost: {time.perf_counter() - started:.2f} s")


def service_objects(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``args.services`` Services (``bench/s00000``...), each with one EndpointSlice of
    ``args.endpoints`` endpoints."""
    services: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []
    for i in range(args.services):
        name = f"s{i:05d}"
        spec = {"clusterIP": str(SERVICES.network_address + 256 + i), "ports": [{"port": 80}]}
        services.append({"metadata": {"namespace": "bench", "name": name}, "spec": spec})
        slices.append(endpoint_slice(name, i * args.endpoints, args.endpoints))
    return services, slices


def compile_changes(args: argparse.Namespace) -> list[float]:
    compiler = ServiceCompiler("node-1")
    services, slices = service_objects(args)
    compiler.replace_services(services)
    compiler.replace_slices(slices)
    compiler.table()
    timings = []
    for n in range(args.changes):
        changed = endpoint_slice(f"s{n:05d}", 10**6 + n * args.endpoints, args.endpoints)
        started = time.perf_counter()
        compiler.put_slice(changed)
        compiler.table()
        timings.append(time.perf_counter() - started)
    return timings


def memory(args: argparse.Namespace) -> None:
    """What the proxy's own state costs in the agent: the compiler's objects, the table
    and the rendered nftables value, as the process's resident size grows."""
    import gc
    import resource

    from podnet.dataplane.interface import NodeNetwork
    from podnet.dataplane.linux.servicetable import ServiceRenderer
    from podnet.testing.lab import CLUSTER

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    services, slices = service_objects(args)
    compiler = ServiceCompiler("node-1")
    compiler.replace_services(services)
    compiler.replace_slices(slices)
    node = NodeNetwork("node-1", IPv4Address("198.51.100.11"), CLUSTER, (CLUSTER,), SERVICES, 1450)
    rendered = ServiceRenderer(node).render(compiler.table())
    gc.collect()
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(
        f"proxy state for {args.services} services x {args.endpoints} endpoints "
        f"({len(rendered.chains)} chains): +{grown:.0f} MB resident (API objects included)"
    )


def endpoint_slice(name: str, first: int, count: int) -> dict[str, object]:
    base = int(IPv4Address("10.130.0.0")) + first
    return {
        "metadata": {
            "namespace": "bench",
            "name": f"{name}-1",
            "labels": {"kubernetes.io/service-name": name},
        },
        "endpoints": [{"addresses": [str(IPv4Address(base + k))]} for k in range(count)],
        "ports": [{"port": 8080, "protocol": "TCP"}],
    }


async def run(args: argparse.Namespace) -> None:
    if "memory" in args.parts:
        memory(args)
    async with service_cluster("bsvc") as cluster:
        await cluster.apply(cluster.service("measured", 10, "c"))  # both nodes
        if "throughput" in args.parts:
            await throughput(cluster, args)
        if "latency" in args.parts:
            await latency(cluster, args)
        if "changes" in args.parts:
            await changes(cluster, args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--services", type=int, default=5000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--seconds", type=int, default=5, help="per iperf3 run")
    parser.add_argument(
        "--parts", default="memory,throughput,latency,changes", help="comma-separated"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
