"""CNI ADD/DEL latency through the real shim, against bridge + host-local, in one run.

Run: .venv/bin/python bench/bench_cni.py [--pods 200] [--concurrent 100] [--runs 3]
     [--pod-objects]

A one-node podnet cluster (etcd, master, node namespace with its agent) is started in a
temporary state dir. Both plugins are called exactly as a runtime calls them (a process
per command, CNI_* env, config on stdin) from inside the node namespace, on the same
pod namespaces; the order alternates between runs. Also: the wall time of N concurrent
ADDs, and the agent's RSS with the pods attached. Everything is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from cni_runner import (
    Latencies,
    Plugin,
    concurrent_adds,
    make_pod_namespaces,
    percentile,
    reference_plugin,
    remove_namespaces,
    sequential,
)
from podnet.cluster import lifecycle
from podnet.cluster.nodes import node_paths


def podnet_plugin(state_dir: Path, node: str) -> Plugin:
    paths = node_paths(state_dir, node)
    conflist = json.loads(paths.conflist.read_text())
    config = {
        "cniVersion": conflist["cniVersion"],
        "name": conflist["name"],
        **conflist["plugins"][0],
    }
    return Plugin("podnet (real shim + agent)", paths.shim, config, str(paths.cni_bin_dir))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def agent_rss_with_pods(plugin: Plugin, node_ns: str, pods: list[str], agent_pid: int) -> float:
    from podnet import netns

    with netns.entered(node_ns):
        for pod in pods:
            plugin.call("ADD", f"rss-{pod}", pod)
    rss = rss_mb(agent_pid)
    with netns.entered(node_ns):
        for pod in pods:
            plugin.call("DEL", f"rss-{pod}", pod)
    return rss


def make_pod_objects(state_dir: Path, node: str, pods: list[str]) -> None:
    """A Pod object for every container id the podnet plugin will be called with, as the
    kubelet creates the Pod before the sandbox (``--pod-objects``): the ADD then writes
    the Pod's status, and no mirror Pod is made for it."""
    from podnet.cluster.pods import admin_api
    from podnet.model.kinds import POD

    with admin_api(state_dir) as api:
        for prefix in ("seq", "par", "rss"):
            for pod in pods:
                meta = {"name": f"{prefix}-{pod}", "namespace": "default"}
                spec = {"nodeName": node, "containers": [{"name": "main", "image": "bench"}]}
                api.create(POD, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


def report(label: str, runs: list[Latencies]) -> dict[str, float]:
    merged = {k: statistics.median(r.summary()[k] for r in runs) for k in runs[0].summary()}
    cells = "  ".join(f"{k} {v:6.1f} ms" for k, v in merged.items())
    print(f"  {label:<30} {cells}")
    return merged


def main(args: argparse.Namespace) -> None:
    state_dir = Path(tempfile.mkdtemp(prefix="podnet-bench-cni-"))
    tag = uuid.uuid4().hex[:4]
    pods: list[str] = []
    try:
        state = lifecycle.cluster_up(state_dir, lifecycle.ClusterSpec(nodes=1), say=lambda _: None)
        node = next(iter(state.nodes.values()))
        assert node.agent is not None
        ours, ref = podnet_plugin(state_dir, node.name), reference_plugin(state_dir / "ref-ipam")
        pods = make_pod_namespaces(f"pnb-{tag}", max(args.pods, args.concurrent))
        if args.pod_objects:
            make_pod_objects(state_dir, node.name, pods)
        path = (
            "Pod objects made first (kubelet)"
            if args.pod_objects
            else "no Pod objects (mirror Pods)"
        )
        print(f"== podnet's path: {path}")
        results: dict[str, list[Latencies]] = {ours.label: [], ref.label: []}
        walls: dict[str, list[float]] = {ours.label: [], ref.label: []}
        for run in range(args.runs):
            order = (ours, ref) if run % 2 == 0 else (ref, ours)
            for plugin in order:
                results[plugin.label].append(sequential(plugin, node.netns, pods[: args.pods]))
                walls[plugin.label].append(
                    concurrent_adds(plugin, node.netns, pods[: args.concurrent])
                )
        print(f"== CNI latency, {args.pods} pods one after another (median of {args.runs} runs)")
        mine = report(ours.label, results[ours.label])
        base = report(ref.label, results[ref.label])
        print(
            f"  ratio ADD p50 podnet/reference: {mine['ADD p50'] / base['ADD p50']:.2f}  "
            f"DEL p50: {mine['DEL p50'] / base['DEL p50']:.2f}  "
            f"(goal: ADD p50 ≤ reference, p99 < 60 ms; podnet p99 ADD {mine['ADD p99']:.1f} ms)"
        )
        print(f"== {args.concurrent} concurrent ADDs (wall, median of {args.runs})")
        for label, values in walls.items():
            print(f"  {label:<30} {statistics.median(values):.2f} s")
        rss = agent_rss_with_pods(ours, node.netns, pods[: args.pods], node.agent.pid)
        print(f"== agent RSS with {args.pods} pods attached: {rss:.0f} MB (goal < 80 MB)")
        all_adds = [v for r in results[ours.label] for v in r.add]
        print(
            f"  (podnet ADD p99 over all {len(all_adds)} calls: {percentile(all_adds, 99):.1f} ms)"
        )
    finally:
        remove_namespaces(pods)
        lifecycle.cluster_down(state_dir, say=lambda _: None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--concurrent", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--pod-objects",
        action="store_true",
        help="create each pod's Pod object before its ADD, as the kubelet does "
        "(default: none, as a bare runtime such as podman; the agent makes mirror Pods)",
    )
    main(parser.parse_args())
