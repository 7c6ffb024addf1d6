"""A DNS flood from one pod (issue 19, finding 5): what another pod's queries and the
agent's policy programming get during it, against the same run without a flood.

Run (root): .venv/bin/python bench/bench_dns_flood.py [--runs 3] [--probes 200]
            [--changes 10]

A one-node local cluster (etcd, master, the agent; NetworkPolicy plugin; the agent's
/metrics on its namespace's loopback), pods ``victim`` and ``flooder`` on the node. Each
run measures three phases in turn: no flood; a flood of one name (the answer cache's
case); a flood of ever-new names (the costly case: each is parsed, resolved and
encoded). The flooder (``podnet.testing.dnsflood``) sends UDP queries from its pod as
fast as one core lets it. During each phase:

- the victim asks a service's name ``--probes`` times, one query at a time (1 s
  timeout, no retry): answered count, p50 and p99; goal: all answered, p99 < 10 ms;
- ``--changes`` NetworkPolicies are created, each timed from the API request until
  the agent has applied it to the kernel (its ``policy.json`` note counts one more
  change); goal: p99 < 50 ms;
- the agent's CPU (share of one core) and the flooder's queries limited per /metrics.

Medians over the runs are printed per phase. Everything runs inside namespaces the
cluster makes, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_dns import cpu_seconds, percentile
from podnet.cluster import lifecycle, nodes, pods
from podnet.cluster.state import ClusterState
from podnet.model.kinds import HOST_SUBNET, NETWORK_POLICY, SERVICE
from podnet.testing.dnsflood import Flood, counter, metrics, probe, restart_agent

NS = "flood"
WEB = f"web.{NS}.svc.cluster.local"
METRICS_PORT = 9153
PHASES = ("none", "same", "fresh")
LIMITED = ("qps", "uncached_qps")


def policy(name: str, port: int) -> dict[str, Any]:
    ingress = [
        {"from": [{"podSelector": {"matchLabels": {"app": "victim"}}}], "ports": [{"port": port}]}
    ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"podSelector": {"matchLabels": {"app": "flooder"}}, "ingress": ingress},
    }


def setup(state_dir: Path) -> dict[str, str]:
    """The cluster, its service and pods; the namespaces and addresses the phases use."""
    spec = lifecycle.ClusterSpec(nodes=1, plugin="networkpolicy")
    lifecycle.cluster_up(state_dir, spec, say=lambda _: None)
    with pods.admin_api(state_dir) as api:
        pods.ensure_namespace(api, NS)
        ports = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
        body = {"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": ports}}
        api.create(SERVICE, {"apiVersion": "v1", "kind": "Service", **body}, NS)
        subnet = IPv4Network(api.get(HOST_SUBNET, None, "node1")["subnet"])
    victim = pods.run_pod(state_dir, "victim", NS, "node1", {"app": "victim"})
    flooder = pods.run_pod(state_dir, "flooder", NS, "node1", {"app": "flooder"})
    restart_agent(state_dir, "node1", ["--metrics-address", f"127.0.0.1:{METRICS_PORT}"])
    state = ClusterState.load(state_dir)
    assert state is not None and state.nodes["node1"].agent is not None
    where = {
        "gateway": str(subnet.network_address + 1),
        "node": state.nodes["node1"].netns,
        "victim": victim.netns,
        "flooder": flooder.netns,
        "agent": str(state.nodes["node1"].agent.pid),
    }
    deadline = time.monotonic() + 60
    while probe(where["victim"], where["gateway"], WEB, 1)[0] is None:
        if time.monotonic() > deadline:
            raise RuntimeError("the agent's DNS does not answer")
    metrics(where["node"], METRICS_PORT)
    time.sleep(2.0)  # the agent's first policy apply
    return where


def policy_note(state_dir: Path) -> dict[str, Any]:
    path = nodes.node_paths(state_dir, "node1").agent_dir / "policy.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def policy_latencies(state_dir: Path, count: int, tag: str) -> list[float]:
    """ms from each policy create (the API request sent) until the agent has applied
    it to the kernel (its note, ``policy.json``, counts one more change; polled every
    ms)."""
    found = []
    with pods.admin_api(state_dir) as api:
        for k in range(count):
            before = policy_note(state_dir).get("changes", 0)
            start = time.perf_counter()
            api.create(NETWORK_POLICY, policy(f"{tag}-{k}", 9000 + k), NS)
            while policy_note(state_dir).get("changes", 0) == before:
                if time.perf_counter() - start > 30:
                    raise RuntimeError("the agent did not apply a policy in 30 s")
                time.sleep(0.001)
            found.append((time.perf_counter() - start) * 1000)
            time.sleep(0.2)
    return found


def phase(
    state_dir: Path, where: dict[str, str], kind: str, args: argparse.Namespace, tag: str
) -> dict[str, float]:
    """One phase: the victim's queries and the policy changes, under ``kind`` of flood."""
    seconds = args.probes * 0.015 + args.changes * 0.5 + 6
    flood = None
    if kind != "none":
        names = [WEB, f"nope.{NS}.svc.cluster.local"]
        flood = Flood(where["flooder"], where["gateway"], seconds, names, fresh=kind == "fresh")
        time.sleep(1.0)
    agent = int(where["agent"])
    text = metrics(where["node"], METRICS_PORT)
    limited_before = sum(
        counter(text, f'podnet_dns_client_limited_total{{limit="{x}"}}') for x in LIMITED
    )
    cpu_before, wall_before = cpu_seconds(agent), time.monotonic()
    answers: list[float | None] = []
    prober = threading.Thread(
        target=lambda: answers.extend(
            probe(where["victim"], where["gateway"], WEB, args.probes, 1.0, 0.01)
        )
    )
    prober.start()
    changes = policy_latencies(state_dir, args.changes, tag)
    prober.join()
    cpu = (cpu_seconds(agent) - cpu_before) / (time.monotonic() - wall_before) * 100
    text = metrics(where["node"], METRICS_PORT)
    limited = sum(counter(text, f'podnet_dns_client_limited_total{{limit="{x}"}}') for x in LIMITED)
    if flood is not None:
        flood.stop()
    answered = [a for a in answers if a is not None]
    return {
        "answered": len(answered) / len(answers) * 100,
        "p50": percentile(answered, 50) if answered else float("inf"),
        "p99": percentile([a if a is not None else 1000.0 for a in answers], 99),
        "policy_p50": percentile(changes, 50),
        "policy_p99": percentile(changes, 99),
        "cpu": cpu,
        "limited": limited - limited_before,
    }


def report(results: dict[str, list[dict[str, float]]]) -> None:
    runs = len(results["none"])
    print(f"\nmedians of {runs} runs (victim: answered %, p50/p99 ms; policy create -> kernel)")
    print("goals during a flood: victim all answered and p99 < 10 ms; policy p99 < 50 ms")
    for kind in PHASES:
        med = {key: statistics.median(r[key] for r in results[kind]) for key in results[kind][0]}
        print(
            f"  flood {kind:5s}  victim {med['answered']:5.1f}%"
            f" p50 {med['p50']:6.2f} p99 {med['p99']:7.2f}"
            f"   policy p50 {med['policy_p50']:6.1f} p99 {med['policy_p99']:6.1f}"
            f"   agent CPU {med['cpu']:5.1f}%   flooder limited {med['limited']:9.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--changes", type=int, default=10)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_dns_flood needs root (namespaces)")
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in PHASES}
    with tempfile.TemporaryDirectory(prefix="bench-dns-flood-") as tmp:
        state_dir = Path(tmp) / "cluster"
        try:
            where = setup(state_dir)
            for run in range(args.runs):
                for kind in PHASES if run % 2 == 0 else reversed(PHASES):
                    found = phase(state_dir, where, kind, args, f"r{run}-{kind}")
                    results[kind].append(found)
                    print(
                        f"run {run + 1} flood {kind:5s} "
                        + " ".join(f"{k}={v:.1f}" for k, v in found.items()),
                        flush=True,
                    )
        finally:
            lifecycle.cluster_down(state_dir, say=lambda _: None)
    report(results)


if __name__ == "__main__":
    main()
