"""Pods on the ovs data plane against the linux one, in one run: CNI ADD latency and
throughput (same node and across nodes).

Run (root): .venv/bin/python bench/bench_ovs_pods.py [--pods 100] [--runs 3] [--seconds 5]

Two local clusters run side by side, 2 nodes each (vxlan), one per data plane (etcd,
master, agents; the ovs one with each node's own ovsdb-server and ovs-vswitchd on the
userspace datapath), each in temporary state dirs, torn down at the end.

- CNI ADD/DEL: the real shim called as a runtime calls it (``bench_cni``'s runner: one
  process per command, from inside node 1's namespace) for ``--pods`` pod namespaces
  one after another, then DEL; the two planes alternate per run (first one, then the
  other, the order swapped each run). Medians over runs of p50/p99; ratio ovs/linux.
- Throughput: iperf3, one TCP stream of ``--seconds``, pod a from pod b on the same node
  and from pod c on the other node, interleaved between the planes; medians, and
  ovs/linux ratios. Informative only: the userspace datapath without DPDK (this machine
  has no OVS kernel module) is not a throughput target.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_cni import podnet_plugin
from bench_throughput import iperf, pod_ns_ip, rtt_ms
from cni_runner import Latencies, make_pod_namespaces, remove_namespaces, sequential
from podnet.cluster import lifecycle, pods
from podnet.cluster.state import ClusterState

PLANES = ("linux", "ovs")


@contextlib.contextmanager
def clusters() -> Iterator[dict[str, Path]]:
    """A 2-node cluster per data plane, pods a and b on node1 and c on node2 in each."""
    dirs = {plane: Path(tempfile.mkdtemp(prefix=f"pn-bop-{plane}-")) for plane in PLANES}
    try:
        for plane, state_dir in dirs.items():
            spec = lifecycle.ClusterSpec(nodes=2, dataplane=plane)
            lifecycle.cluster_up(state_dir, spec, say=lambda _: None)
            for name, node in (("a", "node1"), ("b", "node1"), ("c", "node2")):
                pods.run_pod(state_dir, name, node=node)
        yield dirs
    finally:
        for state_dir in dirs.values():
            lifecycle.cluster_down(state_dir, say=lambda _: None)
            shutil.rmtree(state_dir, ignore_errors=True)  # also after a failed cluster up


def node1(state_dir: Path) -> str:
    state = ClusterState.load(state_dir)
    assert state is not None
    return state.nodes["node1"].netns


def cni(dirs: dict[str, Path], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    namespaces = make_pod_namespaces(f"pnbop-{uuid.uuid4().hex[:4]}", args.pods)
    runs: dict[str, list[Latencies]] = {plane: [] for plane in PLANES}
    try:
        for run in range(args.runs):
            order = PLANES if run % 2 == 0 else PLANES[::-1]
            for plane in order:
                plugin = podnet_plugin(dirs[plane], "node1")
                runs[plane].append(sequential(plugin, node1(dirs[plane]), namespaces))
    finally:
        remove_namespaces(namespaces)
    return {
        plane: {k: statistics.median(r.summary()[k] for r in found) for k in found[0].summary()}
        for plane, found in runs.items()
    }


def throughput(
    dirs: dict[str, Path], args: argparse.Namespace
) -> dict[tuple[str, str], list[tuple[float, float]]]:
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.runs):
        for plane in PLANES:
            a, b, c = (pod_ns_ip(dirs[plane], name) for name in "abc")
            for where, client in (("same node", b[0]), ("across nodes", c[0])):
                gbps = iperf(a[0], client, a[1], args.seconds)
                samples.setdefault((plane, where), []).append((gbps, rtt_ms(client, a[1])))
    return samples


def main(args: argparse.Namespace) -> None:
    with clusters() as dirs:
        latencies = cni(dirs, args)
        samples = throughput(dirs, args)
    print(f"== CNI through the shim, {args.pods} pods one after another, median of {args.runs}")
    for plane in PLANES:
        cells = "  ".join(f"{k} {v:6.1f} ms" for k, v in latencies[plane].items())
        print(f"  {plane:<6} {cells}")
    ovs, linux = latencies["ovs"], latencies["linux"]
    print("  ratio ovs/linux: " + "  ".join(f"{k} {ovs[k] / linux[k]:.2f}" for k in ovs))
    print(f"== iperf3, 1 TCP stream, {args.seconds}s, median of {args.runs} (informative)")
    for where in ("same node", "across nodes"):
        found = {}
        for plane in PLANES:
            values = samples[(plane, where)]
            gbps = statistics.median(g for g, _ in values)
            rtt = statistics.median(r for _, r in values)
            found[plane] = gbps
            print(f"  {where:<13} {plane:<6} {gbps:6.2f} Gbit/s  RTT {rtt:.3f} ms")
        print(f"  {where:<13} ratio ovs/linux {found['ovs'] / found['linux']:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    main(parser.parse_args())
