"""100 nodes joining at once through the simulator, the CSR path (issue 20: all Ready < 60 s).

Run: .venv/bin/python bench/bench_join_many.py [--nodes 100] [--workers 2]

One private etcd and one real ``podnet master`` on loopback (simulator.cluster). Each
simulated node gets its own bootstrap token bound to its name (what ``podnet adm token
create --node NAME`` makes: ``podnet.api.tokenissue.create_bootstrap``), made before the
clock starts. Then all ``--nodes`` start at once, spread over ``--workers`` processes;
each one joins as ``podnet adm join node`` does (simulator.join: discovery of
``/cluster-info`` pinned by the CA hash, a key, a CertificateSigningRequest the master
approves and signs) and its agent then runs on that client certificate (mTLS, no token):
Node, Lease, HostSubnet, Ready. Measured per node, from the start: its certificate issued
(the node has it) and its Node Ready as the master shows it (an admin watch of Nodes).

The in-run baseline: the same nodes on a fresh cluster (new etcd and master) with
pre-issued credentials (each node's bearer token in the token file: no join, no CSR).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from podnet.api.clusterinfo import ca_cert_hash
from podnet.api.tokenissue import create_bootstrap
from podnet.api.tokenstore import StoreSettings
from podnet.api.tokenstore import run as with_store
from podnet.store.base import Store
from podnet.testing.api import aiohttp_session_for
from simulator.cluster import Cluster, start_cluster
from simulator.fleet import Fleet, node_names
from simulator.measure import percentile, timed_get
from simulator.wire import open_watch
from simulator.worker import endpoint_of, raise_file_limit

GOAL = 60.0
NODES = "/api/v1/nodes"
Results = dict[str, Any]


def bootstrap_tokens(state_dir: Path, names: list[str]) -> dict[str, str]:
    """One bootstrap token per node, bound to it, in the master's etcd; name -> token."""
    settings = StoreSettings.require(state_dir)

    async def issue(store: Store) -> dict[str, str]:
        return {n: await create_bootstrap(store, settings.prefix, node=n) for n in names}

    return with_store(settings, issue)


def is_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def watch_ready(cluster: Cluster, since: int, ready: dict[str, float]) -> None:
    """Admin watch of Nodes from ``since``: when each Node is first seen Ready."""
    server, ca, token = cluster.parts()

    def line(raw: bytes) -> None:
        node = json.loads(raw).get("object") or {}
        name = (node.get("metadata") or {}).get("name")
        if name and name not in ready and is_ready(node):
            ready[name] = time.monotonic()

    query = {"watch": "true", "resourceVersion": str(since)}
    endpoint = endpoint_of(server, ca.decode())
    stream = await open_watch(endpoint, NODES, query, token, lambda *_: None, line)
    try:
        await stream.done
    finally:
        stream.close()


async def one_phase(cluster: Cluster, args: argparse.Namespace, work: Path, join: bool) -> Results:
    """All nodes at once, joining (``join``) or on pre-issued tokens; per-node times."""
    server, ca, _ = cluster.parts()
    names = node_names(args.nodes)
    if join:
        tokens = bootstrap_tokens(cluster.master.state_dir, names)
        fleet = Fleet(server, b"", tokens, work)
        how = {"ca_hash": ca_cert_hash(ca), "state_dir": str(work / "nodes")}
        await fleet.start(args.workers, join=how)
    else:
        fleet = Fleet(server, ca, cluster.tokens, work)
        await fleet.start(args.workers)
    ready: dict[str, float] = {}
    try:
        async with aiohttp_session_for(cluster.master.kubeconfig, 2) as api:
            _, body = await timed_get(api, NODES)
            since = int(json.loads(body)["metadata"]["resourceVersion"])
            watcher = asyncio.create_task(watch_ready(cluster, since, ready))
            await asyncio.sleep(0.5)  # the watch is open before the clock starts
            started = time.monotonic()
            command = {"cmd": "join" if join else "register", "deadline": args.timeout}
            answers = await fleet.ask(command, "registered", args.timeout + 60)
            deadline = time.monotonic() + 10
            while len(ready) < args.nodes and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # the agents are done: the watch catches up
            watcher.cancel()
            _, body = await timed_get(api, NODES)
        stored = {n["metadata"]["name"]: is_ready(n) for n in json.loads(body)["items"]}
    finally:
        await fleet.stop()
    joined = {n: m for a in answers for n, m in a.get("joined_at", {}).items()}
    return {
        "ready": {n: t - started for n, t in ready.items()},
        "discovered": [m["discovered"] - started for m in joined.values() if "discovered" in m],
        "certified": [m["certified"] - started for m in joined.values() if "certified" in m],
        "ready stored": sum(stored.get(n, False) for n in names),
        "failed": sum(a["failed"] + a["unfinished"] for a in answers),
        "failures": [f for a in answers for f in a["failures"]][:5],
    }


def spread(values: list[float]) -> str:
    if not values:
        return "none"
    return (
        f"median {percentile(values, 50):.2f} s, p99 {percentile(values, 99):.2f} s, "
        f"max {max(values):.2f} s"
    )


def report(args: argparse.Namespace, joined: Results, baseline: Results) -> bool:
    """Print the figures; whether the goal is met."""
    ready = list(joined["ready"].values())
    count = len(ready)
    print(f"== {args.nodes} nodes joining at once (CSR path, mTLS agents), {args.workers} workers")
    print(f"  cluster discovered: {spread(joined['discovered'])}")
    print(f"  certificate issued: {spread(joined['certified'])}")
    print(f"  Node Ready:         {spread(ready)}")
    print(
        f"  Ready: {count} of {args.nodes} (stored Ready at the end: {joined['ready stored']}); "
        f"failed or unfinished: {joined['failed']} {joined['failures'] or ''}"
    )
    met = count == args.nodes and max(ready, default=float("inf")) < GOAL
    print(f"  goal: all Ready < {GOAL:.0f} s: {'met' if met else 'NOT MET'}")
    base = list(baseline["ready"].values())
    print(f"== baseline: the same {args.nodes} nodes on pre-issued tokens (no CSR path)")
    print(
        f"  Node Ready:         {spread(base)}; Ready: {len(base)} of {args.nodes}; "
        f"failed or unfinished: {baseline['failed']} {baseline['failures'] or ''}"
    )
    if ready and base:
        ratio = max(ready) / max(base)
        median = percentile(ready, 50) / percentile(base, 50)
        print(f"  ratio join / baseline: all Ready {ratio:.1f}x, median {median:.1f}x")
    return met


async def run(args: argparse.Namespace, work: Path) -> tuple[Results, Results]:
    """The join phase and the baseline phase, each on its own fresh cluster."""
    raise_file_limit()
    results = []
    for join in (True, False):
        phase_dir = work / ("join" if join else "baseline")
        cluster = start_cluster(
            phase_dir, args.nodes, "--network-plugin", "networkpolicy",
            "--cluster-network", "10.128.0.0/9:8",
        )  # fmt: skip
        try:
            results.append(await one_phase(cluster, args, phase_dir, join))
        finally:
            cluster.stop()
            keep_logs(phase_dir, Path(args.log_dir) / phase_dir.name)
    return results[0], results[1]


def keep_logs(work: Path, into: Path) -> None:
    """The master's and the workers' logs, copied out of the run's temporary dir."""
    into.mkdir(parents=True, exist_ok=True)
    for log in [work / "master" / "master.log", *work.glob("sim-worker-*.log")]:
        if log.exists():
            shutil.copy(log, into / log.name)


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2, help="simulator processes")
    parser.add_argument("--timeout", type=float, default=300.0, help="per phase, seconds")
    parser.add_argument("--log-dir", default="/tmp/podnet-join-many-logs", help="logs kept here")
    return parser.parse_args(argv)


def main() -> None:
    args = options()
    with tempfile.TemporaryDirectory(prefix="podnet-join-many-") as tmp:
        joined, baseline = asyncio.run(run(args, Path(tmp)))
    report(args, joined, baseline)


if __name__ == "__main__":
    main()
