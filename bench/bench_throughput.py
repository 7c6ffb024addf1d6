"""iperf3 pod-to-pod throughput and RTT, as ratios to a raw veth pair measured in the same run.

Run: .venv/bin/python bench/bench_throughput.py [--runs 3] [--seconds 5]

Paths: raw veth between two fresh namespaces (the ceiling); same node over br0; across
nodes over VXLAN; across nodes over host-gw routes. Each backend gets its own 2-node
local cluster in a temporary state dir, removed at the end. All traffic stays inside
the namespaces this script creates; iperf3 runs are bounded by --seconds.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from podnet import netns
from podnet.cluster import lifecycle, pods

IPERF_PORT = "5201"


def iperf(server_ns: str, client_ns: str, server_ip: str, seconds: int) -> float:
    """Gbit/s of one TCP stream from ``client_ns`` to ``server_ns``."""
    return iperf_cost(server_ns, client_ns, server_ip, seconds)[0]


def iperf_cost(server_ns: str, client_ns: str, server_ip: str, seconds: int) -> tuple[float, float]:
    """Gbit/s of one TCP stream from ``client_ns`` to ``server_ns``, and the CPU seconds
    both iperf3 processes spent (user + system, which holds most of the stack's softirq
    work) per GB received: a per-byte cost that other load on the machine moves less."""
    server = subprocess.Popen(
        netns.command(server_ns, ["iperf3", "-s", "-1", "-p", IPERF_PORT]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        result = netns.run(
            client_ns,
            ["iperf3", "-c", server_ip, "-p", IPERF_PORT, "-t", str(seconds), "-J"],
            timeout=seconds + 20,
        )
        data = json.loads(result.stdout)
        received, cpu = data["end"]["sum_received"], data["end"]["cpu_utilization_percent"]
        busy = (cpu["host_total"] + cpu["remote_total"]) / 100 * received["seconds"]
        return float(received["bits_per_second"]) / 1e9, busy / (received["bytes"] / 1e9)
    finally:
        server.kill()
        server.wait(5)


def rtt_ms(client_ns: str, ip: str) -> float:
    """Average RTT of 50 pings 10 ms apart (bounded)."""
    out = netns.run(client_ns, ["ping", "-c", "50", "-i", "0.01", "-W", "1", ip], timeout=30).stdout
    match = re.search(r"= [\d.]+/([\d.]+)/", out)
    return float(match.group(1)) if match else float("nan")


@contextmanager
def raw_veth() -> Iterator[tuple[str, str, str]]:
    """Two namespaces joined by a veth pair: (server ns, client ns, server IP)."""
    tag = uuid.uuid4().hex[:4]
    left, right = f"pnr-{tag}-a", f"pnr-{tag}-b"
    netns.create(left)
    netns.create(right)
    try:
        subprocess.run(
            [
                "ip",
                "-n",
                left,
                "link",
                "add",
                "v0",
                "type",
                "veth",
                "peer",
                "name",
                "v1",
                "netns",
                right,
            ],
            check=True,
        )
        for ns, dev, ip in ((left, "v0", "10.250.0.1/30"), (right, "v1", "10.250.0.2/30")):
            subprocess.run(["ip", "-n", ns, "addr", "add", ip, "dev", dev], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        yield left, right, "10.250.0.1"
    finally:
        netns.remove(left)
        netns.remove(right)


@contextmanager
def cluster(backend: str) -> Iterator[Path]:
    state_dir = Path(tempfile.mkdtemp(prefix=f"podnet-bench-{backend}-"))
    try:
        lifecycle.cluster_up(
            state_dir, lifecycle.ClusterSpec(nodes=2, tunnel=backend), say=lambda _: None
        )
        for name, node in (("a", "node1"), ("b", "node1"), ("c", "node2")):
            pods.run_pod(state_dir, name, node=node)
        yield state_dir
    finally:
        lifecycle.cluster_down(state_dir, say=lambda _: None)


def pod_ns_ip(state_dir: Path, name: str) -> tuple[str, str]:
    pod = pods.find_pod(pods._loaded(state_dir), name)
    return pod.netns, pod.ip


def measure(
    label: str,
    server: tuple[str, str],
    client_ns: str,
    args: argparse.Namespace,
    out: dict[str, list[tuple[float, float]]],
) -> None:
    gbps = iperf(server[0], client_ns, server[1], args.seconds)
    out.setdefault(label, []).append((gbps, rtt_ms(client_ns, server[1])))


def main(args: argparse.Namespace) -> None:
    results: dict[str, list[tuple[float, float]]] = {}
    for _ in range(args.runs):
        with raw_veth() as (left, right, ip):
            measure("raw veth pair", (left, ip), right, args, results)
    for backend in ("vxlan", "host-gw"):
        with cluster(backend) as state_dir:
            a, b, c = (pod_ns_ip(state_dir, n) for n in "abc")
            for _ in range(args.runs):
                if backend == "vxlan":
                    measure("same node (br0)", a, b[0], args, results)
                measure(f"across nodes ({backend})", a, c[0], args, results)
    base = statistics.median(g for g, _ in results["raw veth pair"])
    goals = {"same node (br0)": 0.90, "across nodes (host-gw)": 0.85, "across nodes (vxlan)": 0.70}
    print(f"== iperf3, 1 TCP stream, {args.seconds}s, median of {args.runs} runs")
    for label, samples in results.items():
        gbps = statistics.median(g for g, _ in samples)
        rtt = statistics.median(r for _, r in samples)
        goal = f"  goal ≥ {goals[label]:.0%}" if label in goals else ""
        print(f"  {label:<24} {gbps:6.2f} Gbit/s  ratio {gbps / base:5.2f}  RTT {rtt:.3f} ms{goal}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    main(parser.parse_args())
