"""NetworkPolicy at scale on one real node, and iperf3 with a policy against none.

Run: .venv/bin/python bench/bench_policy.py [--pods 5000] [--policies 1000] [--changes 50]

Scale: a 1-node local cluster (networkpolicy plugin, real etcd, master and agent on the
linux data plane). The API gets ``--pods`` Pod objects with IPs spread over ``--nodes``
nodes (node1, the real one, holds its share; the others are names only, as pods of
other nodes are to an agent) and ``--policies`` NetworkPolicies, loaded in four steps so
the rule count is printed at each (it must grow linearly with policies). Then:

- the nftables rules and set elements of the node's policy table;
- policy create → its rule in the kernel, p50/p99 over ``--changes`` creates: the clock
  starts before the API request and stops when ``nft monitor`` in the node namespace
  prints the rule (the same-run floor: one bare ``nft -f`` adding a rule to that table);
- a full resync: the agent restarted, until it has applied the rule set again, with the
  table in place (the normal restart) and with the table deleted (a full build);
- the agent's RSS.

Multitenant: a 3-node cluster; from a change-network annotation on a NetNamespace (what
``podnet adm pod-network`` writes) to the new rules in the kernel of all 3 nodes.

Throughput: a 2-node cluster; iperf3 from a pod to a pod on the other node and on the
same node, with no policy, then with a policy isolating the server that allows the
client (and a deny-all beside it), interleaved; medians and the ratio.

Everything runs inside namespaces this script creates, removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_throughput import iperf
from podnet import netns
from podnet.cli.adm import CHANGE_NETWORK
from podnet.cluster import lifecycle, nodes, pods
from podnet.cluster.state import ClusterState
from podnet.model.kinds import HOST_SUBNET, NET_NAMESPACE, NETWORK_POLICY
from podnet.testing.api import aiohttp_session_for

CONCURRENCY = 32
NAMESPACES = 50
APPS = 20
TEAMS = 5
SYNC_TIMEOUT = 120.0


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- objects -------------------------------------------------------------------------------


def pod_object(i: int, node: str, ip: str) -> dict[str, Any]:
    ports = [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"p{i}",
            "namespace": f"ns{i % NAMESPACES}",
            "labels": {"app": f"a{i % APPS}"},
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x", "ports": ports}]},
        "status": {"phase": "Running", "podIP": ip},
    }


def policy_object(j: int, port: int, namespace: str | None = None) -> dict[str, Any]:
    """Ingress to app a<j> from app a<j+1> in a team's namespaces, on a port and on
    ``http``; every third one also limits egress to an ipBlock with an except."""
    spec: dict[str, Any] = {
        "podSelector": {"matchLabels": {"app": f"a{j % APPS}"}},
        "ingress": [
            {
                "from": [
                    {
                        "namespaceSelector": {"matchLabels": {"team": f"t{(j + 1) % TEAMS}"}},
                        "podSelector": {"matchLabels": {"app": f"a{(j + 1) % APPS}"}},
                    }
                ],
                "ports": [{"port": port}, {"port": "http"}],
            }
        ],
    }
    if j % 3 == 0:
        spec["policyTypes"] = ["Ingress", "Egress"]
        spec["egress"] = [
            {"to": [{"ipBlock": {"cidr": "10.128.0.0/14", "except": [f"10.130.{j % 250}.0/24"]}}]}
        ]
    ns = namespace or f"ns{j % NAMESPACES}"
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"pol{j}", "namespace": ns},
        "spec": spec,
    }


async def post_all(kubeconfig: Path, items: list[tuple[str, dict[str, Any]]]) -> float:
    """POST every (path, body) with CONCURRENCY in flight; objects per second."""
    queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    started = time.perf_counter()
    async with aiohttp_session_for(kubeconfig, CONCURRENCY) as api:

        async def worker() -> None:
            while not queue.empty():
                path, body = queue.get_nowait()
                async with api.post(path, json=body) as resp:
                    if resp.status >= 300:
                        raise RuntimeError(f"POST {path}: {resp.status} {await resp.text()}")

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return len(items) / (time.perf_counter() - started)


def node1_subnet(state_dir: Path) -> IPv4Network:
    with pods.admin_api(state_dir) as api:
        return IPv4Network(api.get(HOST_SUBNET, None, "node1")["subnet"])


def load_pods(state_dir: Path, kubeconfig: Path, count: int, node_count: int) -> None:
    local = list(node1_subnet(state_dir).hosts())[10:]
    items: list[tuple[str, dict[str, Any]]] = []
    namespaces = [
        (
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": f"ns{k}", "labels": {"team": f"t{k % TEAMS}"}},
            },
        )
        for k in range(NAMESPACES)
    ]
    asyncio.run(post_all(kubeconfig, namespaces))
    local_ips = iter(local)
    for i in range(count):
        node = (i // NAMESPACES) % node_count + 1  # node1: every namespace and app
        ip = (
            str(next(local_ips))
            if node == 1
            else f"10.{129 + (i // 60000)}.{(i // 250) % 240}.{i % 250 + 2}"
        )
        items.append(
            (f"/api/v1/namespaces/ns{i % NAMESPACES}/pods", pod_object(i, f"node{node}", ip))
        )
    rate = asyncio.run(post_all(kubeconfig, items))
    print(f"  loaded {count} pods ({count // node_count} on node1) at {rate:.0f}/s")


def load_policies(kubeconfig: Path, first: int, last: int) -> None:
    items = [
        (
            f"/apis/networking.k8s.io/v1/namespaces/ns{j % NAMESPACES}/networkpolicies",
            policy_object(j, 8000 + j),
        )
        for j in range(first, last)
    ]
    asyncio.run(post_all(kubeconfig, items))


# --- the node --------------------------------------------------------------------------------


def policy_state(state_dir: Path) -> dict[str, Any]:
    path = nodes.node_paths(state_dir, "node1").agent_dir / "policy.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def wait_settled(state_dir: Path, after: float = 0.0, quiet: float = 1.5) -> dict[str, Any]:
    """Wait until the agent has applied a rule set (after ``after``) and nothing new for
    ``quiet`` seconds; return its record."""
    deadline = time.time() + SYNC_TIMEOUT
    last: dict[str, Any] = {}
    since = time.time()
    while time.time() < deadline:
        now = policy_state(state_dir)
        if now.get("applied_at", 0) > after:
            if now != last:
                last, since = now, time.time()
            elif time.time() - since >= quiet:
                return now
        time.sleep(0.1)
    raise RuntimeError(f"the agent did not settle: {policy_state(state_dir)}")


def table_size(node_ns: str) -> tuple[int, int]:
    """(rules, set elements) of the policy table."""
    done = netns.run(node_ns, ["nft", "-j", "list", "table", "inet", "podnet_policy"], timeout=120)
    if done.returncode != 0:
        return 0, 0
    items = json.loads(done.stdout)["nftables"]
    rules = sum(1 for item in items if "rule" in item)
    elements = sum(
        len(item[k].get("elem", [])) for item in items for k in ("set", "map") if k in item
    )
    return rules, elements


class Monitor:
    """``nft monitor rules`` in the node namespace; the time of each added rule."""

    def __init__(self, node_ns: str) -> None:
        argv = netns.command(node_ns, ["stdbuf", "-oL", "nft", "monitor", "rules"])
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.added: list[float] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("add rule inet podnet_policy"):
                with self.lock:
                    self.added.append(time.perf_counter())

    def first_after(self, start: float, timeout: float = 10.0) -> float:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            with self.lock:
                found = [t for t in self.added if t > start]
            if found:
                return found[0]
            time.sleep(0.001)
        raise RuntimeError("no rule appeared in the kernel")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(5)


def change_latencies(
    state_dir: Path, kubeconfig: Path, node_ns: str, count: int
) -> tuple[list[float], list[dict[str, Any]]]:
    """ms from a policy create (request sent) to its rule in the kernel, and the agent's
    note of each change (its compile and apply times)."""
    monitor = Monitor(node_ns)
    time.sleep(0.5)
    found, notes = [], []
    try:
        with pods.admin_api(state_dir) as api:
            for k in range(count):
                body = policy_object(k, 9000 + k)
                body["metadata"]["name"] = f"change{k}"
                start = time.perf_counter()
                api.create(NETWORK_POLICY, body)
                found.append((monitor.first_after(start) - start) * 1000)
                time.sleep(0.2)  # let the agent settle before the next one
                notes.append(policy_state(state_dir))
    finally:
        monitor.stop()
    return found, notes


def nft_floor(node_ns: str, runs: int = 10) -> float:
    """ms of one bare ``nft -f`` adding a rule to the big table (and removing it)."""
    times = []
    chain = "inet podnet_policy bench_floor"
    script = f"add chain {chain}\nadd rule {chain} ip saddr 192.0.2.1 accept\n"
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(
            netns.command(node_ns, ["nft", "-f", "-"]), input=script, text=True, capture_output=True
        )
        times.append((time.perf_counter() - start) * 1000)
        assert done.returncode == 0, done.stderr
        netns.run(
            node_ns, ["nft", "delete", "chain", "inet", "podnet_policy", "bench_floor"], timeout=30
        )
    return statistics.median(times)


def restart_agent(state_dir: Path, delete_table: bool) -> tuple[float, dict[str, Any]]:
    """Seconds from the agent's start to its first applied rule set, and that record."""
    state = ClusterState.load(state_dir)
    assert state is not None
    node = state.nodes["node1"]
    nodes.stop_agent(node, signal.SIGTERM)
    if delete_table:
        netns.run(node.netns, ["nft", "delete", "table", "inet", "podnet_policy"], timeout=60)
    started = time.time()
    nodes.start_agent(state, node, state_dir)
    state.save(state_dir)
    record = wait_settled(state_dir, after=started, quiet=0.5)
    return record["applied_at"] - started, record


def agent_pid(state_dir: Path) -> int:
    state = ClusterState.load(state_dir)
    assert state is not None and state.nodes["node1"].agent is not None
    return state.nodes["node1"].agent.pid


def scale(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="podnet-bench-") as tmp:
        state_dir = Path(tmp)
        try:
            lifecycle.cluster_up(
                state_dir,
                lifecycle.ClusterSpec(nodes=1, plugin="networkpolicy"),
                say=lambda _: None,
            )
            kubeconfig = state_dir / "master" / "admin.kubeconfig"
            node_ns = ClusterState.load(state_dir).nodes["node1"].netns  # type: ignore[union-attr]
            load_pods(state_dir, kubeconfig, args.pods, args.nodes)
            print("== rules as policies grow (node1's table)")
            steps = [args.policies // 4 * k for k in range(1, 4)] + [args.policies]
            done = 0
            for step in steps:
                load_policies(kubeconfig, done, step)
                done = step
                wait_settled(state_dir)
                rules, elements = table_size(node_ns)
                print(
                    f"  {step:5d} policies: {rules:6d} rules, {elements:7d} set elements, "
                    f"{rules / step:.2f} rules/policy"
                )
            record = policy_state(state_dir)
            print(
                f"  agent compile {record.get('compile_ms', 0):.0f} ms, "
                f"apply {record.get('apply_ms', 0):.0f} ms for the last change"
            )
            floor = nft_floor(node_ns)
            latencies, notes = change_latencies(state_dir, kubeconfig, node_ns, args.changes)
            p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
            print(f"== policy create -> rule in the kernel ({args.changes} creates)")
            print(
                f"  p50 {p50:.1f} ms, "
                f"p99 {p99:.1f} ms (goal p99 < 100 ms); "
                f"bare nft -f floor {floor:.1f} ms, p50/floor {p50 / floor:.2f}"
            )
            compile_ms = statistics.median(n.get("compile_ms", 0) for n in notes)
            apply_ms = statistics.median(n.get("apply_ms", 0) for n in notes)
            print(
                f"  in the agent (median): compile {compile_ms:.1f} ms, "
                f"render+nft {apply_ms:.1f} ms"
            )
            wait_settled(state_dir)
            for label, delete in (("table in place", False), ("table deleted", True)):
                times = [restart_agent(state_dir, delete) for _ in range(args.runs)]
                walls = [t for t, _ in times]
                inner = [r.get("compile_ms", 0) + r.get("apply_ms", 0) for _, r in times]
                print(
                    f"== full resync, agent restarted, {label}: start to applied "
                    f"{statistics.median(walls):.2f} s, compile+apply "
                    f"{statistics.median(inner) / 1000:.2f} s (median of {args.runs}; goal < 2 s)"
                )
            wait_settled(state_dir)
            print(
                f"== agent RSS {rss_mb(agent_pid(state_dir)):.0f} MB with {args.pods} pods, "
                f"{args.policies + args.changes} policies"
            )
        except BaseException:
            log = nodes.node_paths(state_dir, "node1").agent_log
            print("agent log (tail):\n" + nodes.log_tail(log, 40))
            raise
        finally:
            lifecycle.cluster_down(state_dir, say=lambda _: None)


def throughput(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="podnet-bench-") as tmp:
        state_dir = Path(tmp)
        try:
            lifecycle.cluster_up(
                state_dir,
                lifecycle.ClusterSpec(nodes=2, plugin="networkpolicy"),
                say=lambda _: None,
            )
            server = pods.run_pod(state_dir, "server", "bench", "node1", {"app": "server"})
            far = pods.run_pod(state_dir, "far", "bench", "node2", {"app": "client"})
            near = pods.run_pod(state_dir, "near", "bench", "node1", {"app": "client"})
            assert server.ip
            allow = {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "allow-clients", "namespace": "bench"},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "server"}},
                    "ingress": [
                        {
                            "from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                            "ports": [{"port": 5201}],
                        }
                    ],
                },
            }
            deny = {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "deny", "namespace": "bench"},
                "spec": {"podSelector": {}},
            }
            results: dict[str, list[float]] = {}
            with pods.admin_api(state_dir) as api:
                for run in range(args.runs):  # ABBA: the order flips every run
                    states = (False, True) if run % 2 == 0 else (True, False)
                    for with_policy in states:
                        if with_policy:
                            api.create(NETWORK_POLICY, deny)
                            api.create(NETWORK_POLICY, allow)
                        time.sleep(1.0)
                        what = "allowed by policy" if with_policy else "no policy"
                        for label, client in (("across nodes", far), ("same node", near)):
                            results.setdefault(f"{label}, {what}", []).append(
                                iperf(server.netns, client.netns, server.ip, args.seconds)
                            )
                        if with_policy:
                            api.delete(NETWORK_POLICY, "bench", "allow-clients")
                            api.delete(NETWORK_POLICY, "bench", "deny")
            print(f"== iperf3, 1 stream, {args.seconds} s, median of {args.runs}")
            for key, values in results.items():
                print(f"  {key:<32} {statistics.median(values):6.2f} Gbit/s")
            for label in ("across nodes", "same node"):
                ratio = statistics.median(
                    results[f"{label}, allowed by policy"]
                ) / statistics.median(results[f"{label}, no policy"])
                paired = statistics.median(
                    a / b
                    for a, b in zip(
                        results[f"{label}, allowed by policy"],
                        results[f"{label}, no policy"],
                        strict=True,
                    )
                )
                print(
                    f"  {label}: with policy / without = {ratio:.2f} "
                    f"(median of per-run ratios {paired:.2f}; goal >= 0.95)"
                )
        finally:
            lifecycle.cluster_down(state_dir, say=lambda _: None)


def multitenant(args: argparse.Namespace) -> None:
    """Seconds from a change-network annotation (what `podnet adm pod-network` writes)
    to the new isolation rules in the kernel of every one of 3 nodes."""
    with tempfile.TemporaryDirectory(prefix="podnet-bench-") as tmp:
        state_dir = Path(tmp)
        try:
            spec = lifecycle.ClusterSpec(nodes=3, plugin="multitenant")
            lifecycle.cluster_up(state_dir, spec, say=lambda _: None)
            for i, (ns, node) in enumerate([("a", 1), ("a", 2), ("b", 2), ("b", 3)]):
                pods.run_pod(state_dir, f"p{i}", ns, f"node{node}", {"app": "x"})
            state = ClusterState.load(state_dir)
            assert state is not None
            time.sleep(2.0)
            monitors = [Monitor(node.netns) for node in state.nodes.values()]
            time.sleep(0.5)
            found = []
            try:
                with pods.admin_api(state_dir) as api:
                    for run in range(args.runs * 2):
                        change = "join:a" if run % 2 == 0 else "isolate"
                        patch = {"metadata": {"annotations": {CHANGE_NETWORK: change}}}
                        start = time.perf_counter()
                        api.patch(NET_NAMESPACE, None, "b", patch)
                        last = max(m.first_after(start) for m in monitors)
                        found.append(last - start)
                        time.sleep(1.0)
            finally:
                for monitor in monitors:
                    monitor.stop()
            print(
                f"== multitenant: change-network annotation -> rules on all 3 nodes ({len(found)})"
            )
            print(
                f"  p50 {statistics.median(found) * 1000:.0f} ms, max {max(found) * 1000:.0f} ms "
                "(goal < 1 s after the master applies it; this includes the master's part)"
            )
        finally:
            lifecycle.cluster_down(state_dir, say=lambda _: None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--policies", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-multitenant", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    if not args.skip_scale:
        scale(args)
    if not args.skip_throughput:
        throughput(args)
    if not args.skip_multitenant:
        multitenant(args)


if __name__ == "__main__":
    main()
