"""iperf3 through a ClusterIP against iperf3 to the pod IP directly: same run, same pods.

Run: .venv/bin/python bench/bench_service_throughput.py [--rounds 10] [--seconds 3]
[--isolation]

The service proxy's lab (``podnet.testing.servicelab``: two VXLAN nodes on the linux data
plane, pods a and b on node-1, c on node-2). Two services on TCP 5201, each with one
endpoint: ``same`` -> pod a (same node as the client) and ``across`` -> pod c (the other
node, over VXLAN). The client is pod b. Each round measures one TCP stream to the cluster
IP and one to the pod's IP for both paths, in alternating order (ABBA), so the drift of a
shared machine weighs on both sides alike; the result per path is the median over rounds
of the per-round ratio cluster IP / pod IP (goal >= 0.95), with the median Gbit/s of each
side.

Each run also gives the CPU seconds both iperf3 processes spent per GB (user + system,
where the kernel does most of the stack's work for them): the per-round ratio pod IP
cost / cluster IP cost says what a CPU-bound stream would get, and moves much less with
the other load of a shared machine than Gbit/s do.

The nodes are set up for subnet mode (bridged pod traffic skips netfilter) unless
``--isolation`` sets them up as multitenant and networkpolicy nodes are (br_netfilter on,
so bridged pod-to-pod frames pass conntrack and the filter hooks too; no policy loaded).

Everything runs inside the lab's namespaces, removed at the end; every iperf3 run is
bounded by ``--seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from ipaddress import IPv4Address
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_throughput import IPERF_PORT, iperf_cost
from podnet.services.model import Endpoint, ServicePort
from podnet.testing.lab import SERVICES
from podnet.testing.servicelab import Cluster, service_cluster

CLIENT = "b"
PATHS = {"same node (br0)": ("a", 20), "across nodes (vxlan)": ("c", 21)}  # server, VIP host
SIDES = ("cluster IP", "pod IP")


def service(cluster: Cluster, name: str, pod: str, host: int) -> ServicePort:
    """A service on ``172.30.0.<host>``:5201 whose one endpoint is ``pod``:5201."""
    endpoint = Endpoint(cluster.ip_of[pod], int(IPERF_PORT))
    vip = SERVICES.network_address + host
    return ServicePort("bench", name, "", "tcp", int(IPERF_PORT), vip, endpoints=(endpoint,))


def one_round(
    cluster: Cluster, server: str, vip: IPv4Address, seconds: int, flip: bool
) -> dict[str, tuple[float, float]]:
    """(Gbit/s, CPU s/GB) to the cluster IP and to the pod IP, in the given order."""
    targets = dict(zip(SIDES, (str(vip), str(cluster.ip_of[server])), strict=True))
    order = list(targets.items())
    found = {}
    for label, ip in order[::-1] if flip else order:
        found[label] = iperf_cost(cluster.netns_of[server], cluster.netns_of[CLIENT], ip, seconds)
    return found


def summary(label: str, rounds: list[dict[str, tuple[float, float]]]) -> str:
    """Medians of one path: Gbit/s and CPU s/GB of each side, and the per-round ratios."""
    through, direct = ([r[side] for r in rounds] for side in SIDES)
    ratio = statistics.median(c[0] / p[0] for c, p in zip(through, direct, strict=True))
    cost = statistics.median(p[1] / c[1] for c, p in zip(through, direct, strict=True))
    gbits = [statistics.median(x[0] for x in side) for side in (through, direct)]
    per_gb = [statistics.median(x[1] for x in side) for side in (through, direct)]
    return (
        f"  {label:<22} cluster IP {gbits[0]:6.2f} Gbit/s, pod IP {gbits[1]:6.2f} Gbit/s, "
        f"median ratio {ratio:.3f} (goal >= 0.95)\n"
        f"  {'':<22} CPU per GB: cluster IP {per_gb[0]:.3f} s, pod IP {per_gb[1]:.3f} s, "
        f"median ratio pod IP / cluster IP {cost:.3f}"
    )


async def run(args: argparse.Namespace) -> None:
    async with service_cluster("bsvt", isolation=args.isolation) as cluster:
        ports = [
            service(cluster, label.split()[0], pod, host) for label, (pod, host) in PATHS.items()
        ]
        await cluster.apply(*ports)
        samples: dict[str, list[dict[str, tuple[float, float]]]] = {label: [] for label in PATHS}
        for n in range(args.rounds):
            for label, (pod, host) in PATHS.items():
                vip = SERVICES.network_address + host
                got = one_round(cluster, pod, vip, args.seconds, flip=n % 2 == 1)
                samples[label].append(got)
                print(
                    f"  round {n + 1} {label}: "
                    + ", ".join(
                        f"{side} {got[side][0]:.2f} Gbit/s ({got[side][1]:.3f} s/GB)"
                        for side in SIDES
                    ),
                    flush=True,
                )
    print(
        f"== iperf3 through a ClusterIP vs to the pod IP, 1 TCP stream, {args.seconds} s, "
        f"{args.rounds} interleaved rounds (load {os.getloadavg()[0]:.1f}), "
        + ("isolation nodes (br_netfilter on)" if args.isolation else "subnet-mode nodes")
    )
    for label, rounds in samples.items():
        print(summary(label, rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--isolation", action="store_true")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
