"""The egress firewall's cost (issue 21): a policy change to the kernel with 100 projects x
1,000 rules on a node, and TCP throughput out of a firewalled pod, each with its baseline.

Run: .venv/bin/python bench/bench_egress.py [--changes 30] [--runs 3] [--seconds 5]

- Change: a node (a namespace of this run) holds 100 networks' firewalls of 1,000 random
  CIDR rules each (about 50,000 intervals); each change edits one rule of one project.
  Measured: compile (``podnet.egress.nodetable``, the changed policy only) and apply
  (``EgressFirewallNft``, only what differs) to the kernel. Baseline: the bare ``nft -f``
  of the same change. Goal: p99 < 100 ms.
- Throughput: pod -> node (forwarding, the firewall in its forward hook) -> outside host,
  three namespaces of this run; iperf3, the pod's network with 1,000 rules and the
  outside host allowed, against the same path with no firewall. Goal: >= 0.95.
- The first connect after a DNS look-up is not measured: dnsName rules are not built.

Everything runs inside namespaces this script creates and removes by exact name.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_throughput import iperf
from podnet import netns
from podnet.dataplane.interface import NodeNetwork
from podnet.dataplane.linux import nftables
from podnet.dataplane.linux.egressnft import EgressFirewallNft, change_script
from podnet.egress.nodetable import node_firewall

PROJECTS, RULES = 100, 1000
NODE = NodeNetwork(
    "bench",
    IPv4Address("198.51.100.1"),
    IPv4Network("10.128.0.0/24"),
    (IPv4Network("10.128.0.0/14"),),
    IPv4Network("172.30.0.0/16"),
    1450,
)
OUTSIDE = "198.51.100.10"


def policy(namespace: str, rng: random.Random) -> dict[str, Any]:
    rules = [{"type": "Allow", "to": {"cidrSelector": f"{OUTSIDE}/32"}}]
    while len(rules) < RULES - 1:
        net = IPv4Network(f"{IPv4Address(rng.getrandbits(32))}/{rng.randint(12, 30)}", False)
        if not net.overlaps(IPv4Network("10.128.0.0/14")):
            rules.append({"type": rng.choice(["Allow", "Deny"]), "to": {"cidrSelector": str(net)}})
    rules.append({"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"}})
    meta = {"namespace": namespace, "name": "default", "resourceVersion": "1"}
    return {"metadata": meta, "spec": {"egress": rules}}


@contextmanager
def namespaces(*names: str) -> Iterator[list[str]]:
    run = f"pnbe{uuid.uuid4().hex[:6]}"
    made = [f"{run}-{n}" for n in names]
    try:
        for name in made:
            netns.create(name)
        yield made
    finally:
        for name in made:
            netns.remove(name)


def sh(ns: str, *argv: str) -> None:
    subprocess.run(netns.command(ns, list(argv)), check=True, timeout=30)


def change_latency(changes: int) -> tuple[list[float], list[float]]:
    rng = random.Random(21)
    names = [f"p{i}" for i in range(PROJECTS)]
    vnids = {n: 10 + i for i, n in enumerate(names)}
    pods = [(n, IPv4Address(int(IPv4Address("10.128.0.2")) + i)) for i, n in enumerate(names)]
    policies = {n: policy(n, rng) for n in names}
    ours: list[float] = []
    floor: list[float] = []
    with namespaces("node") as (node,), netns.entered(node):
        sync = EgressFirewallNft()
        have = node_firewall(list(policies.values()), vnids, pods)
        sync.sync(NODE, have)
        for _ in range(changes):
            name = rng.choice(names)
            rules = policies[name]["spec"]["egress"]
            i = rng.randrange(1, RULES - 1)
            net = IPv4Network(f"{IPv4Address(rng.getrandbits(32))}/{rng.randint(12, 30)}", False)
            rules[i] = {"type": rng.choice(["Allow", "Deny"]), "to": {"cidrSelector": str(net)}}
            meta = policies[name]["metadata"]  # a new version, as the API would make it
            meta = {**meta, "resourceVersion": str(int(meta["resourceVersion"]) + 1)}
            policies[name] = {"metadata": meta, "spec": {"egress": list(rules)}}
            started = time.perf_counter()
            want = node_firewall(list(policies.values()), vnids, pods)
            sync.sync(NODE, want)
            ours.append((time.perf_counter() - started) * 1000)
            script = change_script(want, have)  # the same change, back, as bare nft
            started = time.perf_counter()
            nftables.run(script)
            floor.append((time.perf_counter() - started) * 1000)
            nftables.run(change_script(have, want))
            have = want
    return ours, floor


def throughput(runs: int, seconds: int) -> tuple[list[float], list[float]]:
    rng = random.Random(7)
    with namespaces("pod", "node", "out") as (pod, node, out):
        for (a, name_a), (b, name_b) in (((pod, "eth0"), (node, "eth0")),
                                         ((node, "eth1"), (out, "eth0"))):  # fmt: skip
            argv = ["ip", "link", "add", name_a, "netns", a, "type", "veth"]
            argv += ["peer", "name", name_b, "netns", b]  # made in place, never in the root
            subprocess.run(argv, check=True, timeout=30)
        sh(pod, "ip", "addr", "add", "10.128.0.5/24", "dev", "eth0")
        sh(node, "ip", "addr", "add", "10.128.0.1/24", "dev", "eth0")
        sh(node, "ip", "addr", "add", "198.51.100.1/24", "dev", "eth1")
        sh(out, "ip", "addr", "add", f"{OUTSIDE}/24", "dev", "eth0")
        for ns in (pod, node, out):
            sh(ns, "ip", "link", "set", "lo", "up")
        for ns, dev in ((pod, "eth0"), (node, "eth0"), (node, "eth1"), (out, "eth0")):
            sh(ns, "ip", "link", "set", dev, "up")
        sh(pod, "ip", "route", "add", "default", "via", "10.128.0.1")
        sh(out, "ip", "route", "add", "10.128.0.0/24", "via", "198.51.100.1")
        sh(node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        policies = [policy(f"p{i}", rng) for i in range(PROJECTS)]
        vnids = {f"p{i}": 10 + i for i in range(PROJECTS)}
        firewall = node_firewall(policies, vnids, [("p0", IPv4Address("10.128.0.5"))])
        plain: list[float] = []
        guarded: list[float] = []
        sync = EgressFirewallNft()
        for _ in range(runs):  # interleaved, pair by pair
            with netns.entered(node):
                sync.sync(NODE, node_firewall([], {}, []))
            plain.append(iperf(out, pod, OUTSIDE, seconds))
            with netns.entered(node):
                sync.sync(NODE, firewall)
            guarded.append(iperf(out, pod, OUTSIDE, seconds))
    return plain, guarded


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    ours, floor = change_latency(args.changes)
    print(f"== policy change -> kernel, {PROJECTS} projects x {RULES} rules on a node")
    print(
        f"  podnet p50 {statistics.median(ours):.1f} ms, p99 {pct(ours, 0.99):.1f} ms "
        f"(goal p99 < 100 ms); bare nft -f of the change p50 {statistics.median(floor):.1f} ms"
    )
    plain, guarded = throughput(args.runs, args.seconds)
    ratio = statistics.median(guarded) / statistics.median(plain)
    print(f"== TCP out of a firewalled pod ({RULES} rules, allowed), median of {args.runs}")
    print(
        f"  no firewall {statistics.median(plain):.2f} Gbit/s, firewall "
        f"{statistics.median(guarded):.2f} Gbit/s, ratio {ratio:.2f} (goal >= 0.95)"
    )
    print("== first connect after a DNS look-up: not measured (dnsName rules not built)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
