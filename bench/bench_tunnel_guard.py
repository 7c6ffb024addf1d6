"""The cost of the tunnel guard: cross-node VXLAN iperf3 with and without it, interleaved.

Run: .venv/bin/python bench/bench_tunnel_guard.py [--rounds 5] [--seconds 3]

A lab (podnet.testing.lab) with two vxlan nodes and one pod on each. Each round measures
pod-to-pod TCP throughput with the guard as the data plane sets it up and with the
guard's rules taken out of both nodes (the input and forward chains flushed by hand; then
``setup_node`` puts them back), in alternating order. Interleaving the two cancels most
of the drift of a shared machine; the result is the median ratio guarded / unguarded.
All traffic stays in the lab's namespaces; every iperf3 run is bounded by --seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time
import uuid

from podnet import netns
from podnet.testing.lab import Lab, sh, up

PORT = "5201"


def iperf(server_ns: str, client_ns: str, ip: str, seconds: int) -> float:
    """Gbit/s of one TCP stream."""
    server = subprocess.Popen(
        netns.command(server_ns, ["iperf3", "-s", "-1", "-p", PORT]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        argv = ["iperf3", "-c", ip, "-p", PORT, "-t", str(seconds), "-J"]
        done = netns.run(client_ns, argv, timeout=seconds + 20)
        return float(json.loads(done.stdout)["end"]["sum_received"]["bits_per_second"]) / 1e9
    finally:
        server.kill()
        server.wait(5)


def unguard(lab: Lab, nodes: list[int]) -> None:
    for i in nodes:
        for chain in ("input", "forward"):
            sh(lab.node_ns(i), "nft", "flush", "chain", "inet", "podnet", chain)


async def run(args: argparse.Namespace) -> None:
    lab = Lab(f"pnb-{os.getpid()}-{uuid.uuid4().hex[:4]}")
    try:
        lab.build(nodes=2)
        planes = await up(lab, [1, 2])
        a_ns, a = lab.pod(1, 10, "a")
        c_ns, c = lab.pod(2, 10, "c")
        await planes[1].attach_pod(a)
        await planes[2].attach_pod(c)
        ratios = []
        for round_ in range(args.rounds):
            samples = {}
            for guard in (True, False) if round_ % 2 == 0 else (False, True):
                if not guard:
                    unguard(lab, [1, 2])
                samples[guard] = iperf(c_ns, a_ns, str(c.address.ip), args.seconds)
                for i in (1, 2):
                    await planes[i].setup_node(lab.network(i))  # the guard back
            ratios.append(samples[True] / samples[False])
            print(f"  guarded {samples[True]:.2f} Gbit/s, unguarded {samples[False]:.2f} Gbit/s")
        print(f"== tunnel guard: median ratio guarded/unguarded {statistics.median(ratios):.3f}")
    finally:
        await lab.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=3)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
