"""iperf3 through a ClusterIP against iperf3 to the pod IP directly: same run, same pods.

Run: sudo .venv/bin/python bench/bench_service_throughput.py [--rounds 10] [--seconds 3]

The service proxy's lab (``podnet.testing.servicelab``: two VXLAN nodes on the linux data
plane, pods a and b on node-1, c on node-2). Two services on TCP 5201, each with one
endpoint: ``same`` -> pod a (same node as the client, over br0) and ``cross`` -> pod c
(the other node, over VXLAN). The client is pod b. Each round measures one TCP stream to
the cluster IP and one to the pod's IP for both paths, in alternating order (ABBA), so
the drift of a shared machine weighs on both sides alike; the result per path is the
median over rounds of the per-round ratio cluster IP / pod IP (goal >= 0.95), with the
median Gbit/s of each side.

``--no-redirects`` first turns ICMP redirects off in both nodes (a pod's packet to a
cluster IP whose endpoint shares its node goes in and out of br0, and the node answers
with redirects, rate-limited); the node set-up leaves them on.

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

from bench_throughput import IPERF_PORT, iperf
from podnet.services.model import Endpoint, ServicePort
from podnet.testing.lab import SERVICES, sh
from podnet.testing.servicelab import Cluster, service_cluster

CLIENT = "b"
PATHS = {"same node (br0)": ("a", 20), "across nodes (vxlan)": ("c", 21)}  # server, VIP host


def service(cluster: Cluster, name: str, pod: str, host: int) -> ServicePort:
    """A service on ``172.30.0.<host>``:5201 whose one endpoint is ``pod``:5201."""
    endpoint = Endpoint(cluster.ip_of[pod], int(IPERF_PORT))
    vip = SERVICES.network_address + host
    return ServicePort("bench", name, "", "tcp", int(IPERF_PORT), vip, endpoints=(endpoint,))


def one_round(
    cluster: Cluster, server: str, vip: IPv4Address, seconds: int, flip: bool
) -> dict[str, float]:
    """Gbit/s to the cluster IP and to the pod IP, in the given order."""
    targets = {"cluster IP": str(vip), "pod IP": str(cluster.ip_of[server])}
    order = list(targets.items())
    found = {}
    for label, ip in order[::-1] if flip else order:
        found[label] = iperf(cluster.netns_of[server], cluster.netns_of[CLIENT], ip, seconds)
    return found


async def run(args: argparse.Namespace) -> None:
    async with service_cluster("bsvt") as cluster:
        ports = [
            service(cluster, label.split()[0], pod, host) for label, (pod, host) in PATHS.items()
        ]
        await cluster.apply(*ports)
        if args.no_redirects:
            for node in cluster.planes:
                for conf in ("all", "br0"):
                    key = f"net.ipv4.conf.{conf}.send_redirects=0"
                    sh(cluster.lab.node_ns(node), "sysctl", "-q", "-w", key)
        samples: dict[str, list[dict[str, float]]] = {label: [] for label in PATHS}
        for n in range(args.rounds):
            for label, (pod, host) in PATHS.items():
                vip = SERVICES.network_address + host
                got = one_round(cluster, pod, vip, args.seconds, flip=n % 2 == 1)
                samples[label].append(got)
                print(
                    f"  round {n + 1} {label}: cluster IP {got['cluster IP']:.2f} Gbit/s, "
                    f"pod IP {got['pod IP']:.2f} Gbit/s",
                    flush=True,
                )
    print(
        f"== iperf3 through a ClusterIP vs to the pod IP, 1 TCP stream, {args.seconds} s, "
        f"{args.rounds} interleaved rounds (load {os.getloadavg()[0]:.1f})"
        + (", ICMP redirects off" if args.no_redirects else "")
    )
    for label, rounds in samples.items():
        through = statistics.median(r["cluster IP"] for r in rounds)
        direct = statistics.median(r["pod IP"] for r in rounds)
        ratio = statistics.median(r["cluster IP"] / r["pod IP"] for r in rounds)
        print(
            f"  {label:<22} cluster IP {through:6.2f} Gbit/s, pod IP {direct:6.2f} Gbit/s, "
            f"median ratio {ratio:.3f} (goal >= 0.95)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--no-redirects", action="store_true")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
