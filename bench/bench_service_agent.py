"""The node agent with 5,000 Services and 50,000 endpoints: its RSS, how soon it applies
them, and an EndpointSlice change to the kernel of every node.

Run: .venv/bin/python bench/bench_service_agent.py [--services 5000] [--endpoints 10]
     [--changes 40] [--runs 1]

Each run is a 2-node local cluster (``podnet cluster up``: real etcd, master and agents on
the linux data plane, in namespaces this script creates; each agent also serves cluster
DNS from the same watches). Through the API, ``CONCURRENCY`` requests in flight:
``--services`` Services without a selector (ClusterIPs allocated by the master), then one
EndpointSlice each with ``--endpoints`` ready endpoints in 10.131.0.0/16 (cluster network,
no pod behind them: they cost what they cost in the agent and the kernel). Then:

- each agent's RSS before the Services, and once it has applied the whole table and
  gone quiet (goal < 150 MB), with its peak (VmHWM);
- "all created" (the last create answered) -> "agent applied" (the agent's log line
  ``services applied: N service ports, M endpoints`` with the full counts, its own
  timestamp), per node;
- endpoint change -> kernel on every node: one EndpointSlice PUT through the API (the
  clock starts before the request) until ``nft monitor`` in each node's namespace prints
  the new address (an ``endpoints`` map element, or a DNAT rule); p50/p99 of the later
  node over ``--changes`` (goal p99 < 100 ms at 5,000 services), with the same-run
  floor of the API round trip alone (the PUT's answer);
- node1's agent restarted with the table in place: start -> whole table applied, and its
  RSS after that (a fresh process that got everything in one listing); ``--restarts``
  times per run (median), with ``--baseline SRC`` alternated with a restart of another
  source tree (run through ``PYTHONPATH``) under the same load.

With ``--runs`` > 1 the figures are medians over runs. Everything is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_policy import percentile, post_all, rss_mb
from podnet import netns
from podnet.cluster import lifecycle, nodes
from podnet.cluster.state import ClusterState
from podnet.testing.api import aiohttp_session_for

NAMESPACE = "bench"
NODES = ("node1", "node2")
FIRST_ENDPOINT = int(IPv4Address("10.131.0.0"))
CHANGED_ENDPOINT = int(IPv4Address("10.132.0.0"))  # each change's new address from here
APPLY_TIMEOUT = 900.0
WARM_UP = 10
APPLIED = re.compile(
    r"^(\S+ \S+) INFO podnet\.agent\.services: services applied: (\d+) service ports, "
    r"(\d+) endpoints; compiled in ([0-9.]+) ms, applied in ([0-9.]+) ms",
    re.M,
)
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
TARGETS = re.compile(r"(?:dnat to |: )(\d+\.\d+\.\d+\.\d+)(?::| \. )\d+")


def service_object(i: int) -> dict[str, Any]:
    ports = [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"s{i:05d}", "namespace": NAMESPACE},
        "spec": {"type": "ClusterIP", "ports": ports},
    }


def addresses(first: int, count: int) -> list[dict[str, Any]]:
    return [
        {"addresses": [str(IPv4Address(first + k))], "conditions": {"ready": True}}
        for k in range(count)
    ]


def slice_object(i: int, endpoints: int) -> dict[str, Any]:
    name = f"s{i:05d}"
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{name}-1",
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": name},
        },
        "addressType": "IPv4",
        "endpoints": addresses(FIRST_ENDPOINT + i * endpoints, endpoints),
        "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
    }


# --- the agents ------------------------------------------------------------------------------


def state_of(state_dir: Path) -> ClusterState:
    state = ClusterState.load(state_dir)
    assert state is not None
    return state


def agent_rss(state_dir: Path, node: str) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``node``'s agent in MB."""
    agent = state_of(state_dir).nodes[node].agent
    assert agent is not None
    rss = rss_mb(agent.pid)
    for line in Path(f"/proc/{agent.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return rss, int(line.split()[1]) / 1024
    return rss, 0.0


def applied_at(
    log: Path, ports: int, endpoints: int, offset: int = 0
) -> tuple[float, float, float] | None:
    """The first log line (after byte ``offset``) saying the agent applied a table of at
    least ``ports`` service ports and ``endpoints`` endpoints (``default/kubernetes`` comes
    on top): its epoch time, and the agent's compile and apply seconds for it."""
    text = log.read_bytes()[offset:].decode(errors="replace")
    for match in APPLIED.finditer(text):
        if int(match.group(2)) >= ports and int(match.group(3)) >= endpoints:
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp(), float(match.group(4)) / 1000, float(match.group(5)) / 1000
    return None


def applies(log: Path, offset: int) -> list[tuple[float, float]]:
    """(compile ms, apply ms) of every table the agent applied after byte ``offset``."""
    text = log.read_bytes()[offset:].decode(errors="replace")
    return [(float(m.group(4)), float(m.group(5))) for m in APPLIED.finditer(text)]


def wait_applied(
    state_dir: Path, node: str, ports: int, endpoints: int, offset: int = 0
) -> tuple[float, float, float]:
    """``applied_at``, waited for (bounded)."""
    log = nodes.node_paths(state_dir, node).agent_log
    deadline = time.time() + APPLY_TIMEOUT
    while time.time() < deadline:
        found = applied_at(log, ports, endpoints, offset)
        if found is not None:
            return found
        time.sleep(0.1)
    raise RuntimeError(f"{node} never applied {ports} ports:\n{nodes.log_tail(log, 20)}")


def wait_quiet(state_dir: Path, quiet: float = 3.0) -> None:
    """Until no agent log has grown for ``quiet`` seconds (bounded)."""
    logs = [nodes.node_paths(state_dir, n).agent_log for n in NODES]
    sizes, since, deadline = None, time.time(), time.time() + 120
    while time.time() < deadline:
        now = [log.stat().st_size for log in logs]
        if now != sizes:
            sizes, since = now, time.time()
        elif time.time() - since >= quiet:
            return
        time.sleep(0.2)


class Monitor:
    """``nft monitor`` in a node's namespace: when each address appeared in the services
    table (``endpoints`` map element ``… : <ip> . <port>``, or rule ``dnat to <ip>:<port>``)."""

    def __init__(self, node_ns: str) -> None:
        argv = netns.command(node_ns, ["stdbuf", "-oL", "nft", "monitor"])
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            now = time.perf_counter()
            if "podnet_services" not in line:
                continue
            with self.lock:
                for ip in TARGETS.findall(line):
                    self.seen.setdefault(ip, now)

    def when(self, ip: str, timeout: float) -> float | None:
        """When ``ip`` appeared (None: not within ``timeout``)."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            with self.lock:
                if ip in self.seen:
                    return self.seen[ip]
            time.sleep(0.0005)
        return None

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(5)


async def change(session: Any, args: argparse.Namespace, k: int) -> tuple[str, float, float]:
    """Change the first endpoint of one slice to a new address: (that address, the
    perf_counter before the PUT, and when its answer came)."""
    name = f"s{(k * 97) % args.services:05d}-1"
    async with session.get(f"{SLICES}/{name}") as resp:
        body = await resp.json()
    ip = str(IPv4Address(CHANGED_ENDPOINT + k))
    body["endpoints"][0]["addresses"] = [ip]
    started = time.perf_counter()
    async with session.put(f"{SLICES}/{name}", json=body) as resp:
        assert resp.status == 200, await resp.text()
    return ip, started, time.perf_counter()


async def changes(state_dir: Path, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """(ms to the kernel of the later node, ms of the PUT's answer) per change."""
    state = state_of(state_dir)
    monitors = [Monitor(state.nodes[n].netns) for n in NODES]
    kubeconfig = state_dir / "master" / "admin.kubeconfig"
    kernel, api = [], []
    try:
        async with aiohttp_session_for(kubeconfig, 1) as session:
            # nft monitor reads the whole table before it listens, and says nothing when
            # it does: warm-up changes until one shows on both nodes.
            for k in range(WARM_UP):
                ip, _, _ = await change(session, args, args.changes + k)
                if None not in [await asyncio.to_thread(m.when, ip, 10.0) for m in monitors]:
                    break
            else:
                raise RuntimeError("nft monitor never showed a change")
            for k in range(args.changes):
                await asyncio.sleep(0.3)  # one change at a time, as the goal means
                ip, started, answered = await change(session, args, k)
                seen = [await asyncio.to_thread(m.when, ip, 30.0) for m in monitors]
                if None in seen:
                    raise RuntimeError(f"{ip} did not reach every node's services table")
                kernel.append((max(s for s in seen if s is not None) - started) * 1000)
                api.append((answered - started) * 1000)
    finally:
        for monitor in monitors:
            monitor.stop()
    return kernel, api


def restart(state_dir: Path, args: argparse.Namespace) -> tuple[float, float, float, float]:
    """node1's agent restarted (SIGTERM, table in place): seconds from its start to the
    whole table applied, the agent's own compile and apply seconds, and its RSS then."""
    state = state_of(state_dir)
    node = state.nodes["node1"]
    log = nodes.node_paths(state_dir, "node1").agent_log
    nodes.stop_agent(node, signal.SIGTERM)
    offset = log.stat().st_size
    started = time.time()
    nodes.start_agent(state, node, state_dir)
    state.save(state_dir)
    total = args.services * args.endpoints
    done, compiled, applied = wait_applied(state_dir, "node1", args.services, total, offset)
    wait_quiet(state_dir)
    if args.timeline:  # the restarted agent's log up to the apply (and DNS's), from its start
        for line in log.read_bytes()[offset:].decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):  # a traceback's line has no time
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if stamp <= done or " podnet.dns: " in line:  # and when DNS got its listings
                    print(f"    +{stamp - started:6.2f} s {line[24:160]}")
    return done - started, compiled, applied, agent_rss(state_dir, "node1")[0]


def restarts(state_dir: Path, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """``--restarts`` restarts of node1's agent into ``out`` (medians); with ``--baseline``
    every other one (first, third, ...) runs that source tree instead (``PYTHONPATH``),
    an A/B under the same load and the same table."""
    for label in ("", "baseline ") if args.baseline else ("",):
        for key in ("restart -> applied", "restart compile", "restart apply", "rss restarted"):
            out[label + key] = []
    for n in range(args.restarts * (2 if args.baseline else 1)):
        label = "baseline " if args.baseline and n % 2 == 0 else ""
        if label:
            os.environ["PYTHONPATH"] = args.baseline
        try:
            found = restart(state_dir, args)
        finally:
            os.environ.pop("PYTHONPATH", None)
        print(
            f"    restart {n + 1} ({label or 'this tree'}, load {os.getloadavg()[0]:.1f}): "
            f"{found[0]:.2f} s (compile {found[1]:.2f} s, apply {found[2]:.2f} s)",
            flush=True,
        )
        for key, value in zip(
            ("restart -> applied", "restart compile", "restart apply", "rss restarted"),
            found,
            strict=True,
        ):
            out[label + key].append(value)
    for key in list(out):
        if "restart" in key and isinstance(out[key], list):
            out[key] = statistics.median(out[key])


def trimmed_rss(state_dir: Path, node: str) -> float:
    """``node``'s agent RSS after glibc's ``malloc_trim(0)``, called in it through gdb:
    what is left once heap pages that are free (but kept by malloc) go back."""
    agent = state_of(state_dir).nodes[node].agent
    assert agent is not None
    argv = ["gdb", "-p", str(agent.pid), "-batch", "-ex", "call (int) malloc_trim(0)"]
    subprocess.run(argv, capture_output=True, timeout=120, check=True)
    return agent_rss(state_dir, node)[0]


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="podnet-bench-") as tmp:
        state_dir = Path(tmp)
        try:
            lifecycle.cluster_up(state_dir, lifecycle.ClusterSpec(nodes=2), say=lambda _: None)
            kubeconfig = state_dir / "master" / "admin.kubeconfig"
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            asyncio.run(post_all(kubeconfig, [("/api/v1/namespaces", namespace)]))
            wait_quiet(state_dir)
            out["rss before"] = [agent_rss(state_dir, n)[0] for n in NODES]
            services = [
                (f"/api/v1/namespaces/{NAMESPACE}/services", service_object(i))
                for i in range(args.services)
            ]
            slices = [(SLICES, slice_object(i, args.endpoints)) for i in range(args.services)]
            out["services/s"] = asyncio.run(post_all(kubeconfig, services))
            out["slices/s"] = asyncio.run(post_all(kubeconfig, slices))
            created = time.time()
            total = args.services * args.endpoints
            found = [wait_applied(state_dir, n, args.services, total) for n in NODES]
            out["created -> applied"] = [at - created for at, _, _ in found]
            out["compile+apply"] = [c + a for _, c, a in found]
            wait_quiet(state_dir)
            sizes = [agent_rss(state_dir, n) for n in NODES]
            out["rss after"] = [rss for rss, _ in sizes]
            out["rss peak"] = [peak for _, peak in sizes]
            if args.trim:
                out["rss trimmed"] = [trimmed_rss(state_dir, n) for n in NODES]
            logs = [nodes.node_paths(state_dir, n).agent_log for n in NODES]
            offsets = [log.stat().st_size for log in logs]
            kernel, api = asyncio.run(changes(state_dir, args))
            out["change p50"], out["change p99"] = percentile(kernel, 50), percentile(kernel, 99)
            out["put p50"] = percentile(api, 50)
            inner = [ms for log, at in zip(logs, offsets, strict=True) for ms in applies(log, at)]
            out["agent compile p50"] = percentile([c for c, _ in inner], 50)
            out["agent apply p50"] = percentile([a for _, a in inner], 50)
            out["agent apply p99"] = percentile([a for _, a in inner], 99)
            restarts(state_dir, args, out)
        except BaseException:
            print(f"measured so far: {out}")
            for n in NODES:
                log = nodes.node_paths(state_dir, n).agent_log
                print(f"{n} agent log (tail):\n" + nodes.log_tail(log, 30))
            raise
        finally:
            lifecycle.cluster_down(state_dir, say=lambda _: None)
    return out


def med(runs: list[dict[str, Any]], key: str, node: int | None = None) -> float:
    return float(statistics.median(r[key] if node is None else r[key][node] for r in runs))


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    total = args.services * args.endpoints
    print(
        f"== node agents (linux data plane, DNS on) with {args.services} services and "
        f"{total} endpoints, median of {len(runs)} run(s), load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"  created through the API: {med(runs, 'services/s'):.0f} services/s, "
        f"{med(runs, 'slices/s'):.0f} slices/s"
    )
    for i, node in enumerate(NODES):
        print(
            f"  {node}: RSS {med(runs, 'rss before', i):.0f} MB before, "
            f"{med(runs, 'rss after', i):.0f} MB after the sync (peak "
            f"{med(runs, 'rss peak', i):.0f} MB; goal < 150 MB); all created -> applied "
            f"{med(runs, 'created -> applied', i):.2f} s (that apply: compile + nft "
            f"{med(runs, 'compile+apply', i):.2f} s)"
        )
        if args.trim:
            print(f"    after malloc_trim(0) in it: {med(runs, 'rss trimmed', i):.0f} MB")
    print(
        f"  endpoint change -> kernel on both nodes ({args.changes} changes): p50 "
        f"{med(runs, 'change p50'):.1f} ms, p99 {med(runs, 'change p99'):.1f} ms "
        f"(goal p99 < 100 ms); the PUT's own answer p50 {med(runs, 'put p50'):.1f} ms"
    )
    print(
        f"    in the agents (log): compile p50 {med(runs, 'agent compile p50'):.1f} ms, "
        f"render + nft p50 {med(runs, 'agent apply p50'):.1f} ms, "
        f"p99 {med(runs, 'agent apply p99'):.1f} ms"
    )
    print(
        f"  node1 agent restarted, table in place: start -> applied "
        f"{med(runs, 'restart -> applied'):.2f} s ("
        f"compile {med(runs, 'restart compile'):.2f} s + render, read-back, nft "
        f"{med(runs, 'restart apply'):.2f} s; goal < 2 s), "
        f"RSS then {med(runs, 'rss restarted'):.0f} MB"
    )
    if args.baseline:
        print(
            f"    baseline {args.baseline} (alternated): start -> applied "
            f"{med(runs, 'baseline restart -> applied'):.2f} s (compile "
            f"{med(runs, 'baseline restart compile'):.2f} s + "
            f"{med(runs, 'baseline restart apply'):.2f} s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--services", type=int, default=5000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--changes", type=int, default=40)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--timeline", action="store_true", help="the restarted agent's log")
    parser.add_argument("--restarts", type=int, default=1, help="restarts per run (median)")
    parser.add_argument(
        "--baseline", help="a src dir: alternate restarts run it (PYTHONPATH) for an A/B"
    )
    parser.add_argument(
        "--trim", action="store_true", help="also the RSS after malloc_trim in each agent (gdb)"
    )
    args = parser.parse_args()
    runs = []
    for n in range(args.runs):
        runs.append(one_run(args))
        print(f"  run {n + 1}: {runs[-1]}", flush=True)
    report(runs, args)


if __name__ == "__main__":
    main()
