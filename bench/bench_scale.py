"""Scale benchmarks (issue 9 item 7): 5,000 simulated nodes and 150,000 pods, one master.

Run: .venv/bin/python bench/bench_scale.py [--nodes 5000] [--pods 150000] [--duration 300]
Smoke: .venv/bin/python bench/bench_scale.py --nodes 20 --pods 200 --duration 10

One private etcd and one real ``podnet master`` on loopback, then in order:

1. Lists: ``--list-objects`` namespaces made through the API and ``--pods`` pods written
   straight to etcd (see simulator.cluster), then lists of the namespaces per second and
   the time to read the list of every pod (whole, and in pages of 500).
2. Registration: ``--nodes`` simulated agents (simulator.agent) start at once: Node,
   Lease, HostSubnet poll, Ready. Time until the master has allocated every HostSubnet
   (an admin watch counts them), and a check that none is missing, twice or overlapping.
3. Fan-out: every agent watches ``--kinds`` from now on (pods always), the heartbeats
   go on, and ``--rate`` pod changes a second for ``--duration`` seconds are made; every
   watcher must see every change. Latency is write sent -> the last watcher has it.

CPU of the master and of the simulator's processes, and the master's RSS, are sampled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp

from podnet.testing.api import aiohttp_session_for, namespace
from simulator.cluster import Cluster, start_cluster, write_pods
from simulator.fleet import Fleet, node_names
from simulator.measure import (
    FanOut,
    Usage,
    lists_per_second,
    median_of,
    paged_list_seconds,
    percentile,
    subnet_problems,
    timed_get,
)
from simulator.wire import open_watch
from simulator.worker import endpoint_of, raise_file_limit

# What podnet.agent watches (networkpolicy plugin), most important first.
AGENT_KINDS = ["pods", "hostsubnets", "namespaces", "netnamespaces", "networkpolicies"]
HOSTSUBNETS = "/apis/network.openshift.io/v1/hostsubnets"
PODS = "/api/v1/pods"
IN_FLIGHT = 20  # pod changes awaiting their answer at once
CHANGE_TIMEOUT = 30.0  # seconds for one pod change's answer
LOCK = Path(tempfile.gettempdir()) / "podnet-bench-scale.lock"
Results = dict[str, Any]


def kinds_that_fit(nodes: int, wanted: list[str]) -> list[str]:
    """The watched kinds the master's open-file limit allows: each agent holds one
    connection for requests and one per watched kind (pods always)."""
    budget = resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 2000
    kinds = ["pods", *(k for k in wanted if k != "pods")]
    while len(kinds) > 1 and nodes * (1 + len(kinds)) > budget:
        kinds.pop()
    return kinds


async def make_namespaces(api: Any, names: list[str]) -> None:
    queue = list(names)

    async def worker() -> None:
        while queue:
            name = queue.pop()
            async with api.post("/api/v1/namespaces", json=namespace(name)) as answer:
                if answer.status != 201:
                    raise RuntimeError(f"namespace {name}: {answer.status}")

    await asyncio.gather(*(worker() for _ in range(32)))


async def list_version(api: Any, path: str) -> int:
    _, body = await timed_get(api, path, {"limit": "1"})
    return int(json.loads(body)["metadata"]["resourceVersion"])


async def wait_for_count(api: Any, path: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        _, body = await timed_get(api, path)
        if len(json.loads(body)["items"]) >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: fewer than {count} items after {timeout}s")
        await asyncio.sleep(2)


async def bench_lists(cluster: Cluster, args: argparse.Namespace, out: Results) -> None:
    async with aiohttp_session_for(cluster.master.kubeconfig, 40) as api:
        names = [f"ns-{i:05d}" for i in range(args.list_objects)]
        await make_namespaces(api, names)
        started = time.perf_counter()
        await write_pods(cluster, names[: args.namespaces], args.pods, node_names(args.nodes))
        out["pods written/s"] = args.pods / (time.perf_counter() - started)
        await wait_for_count(api, PODS, args.pods, 300)
        total = args.list_objects + 3  # default, kube-node-lease, kube-system or the like
        out["namespace lists/s"] = await lists_per_second(api, "/api/v1/namespaces", 5)
        whole = [(await timed_get(api, PODS))[0] for _ in range(3)]
        out["pod list seconds"] = median_of(whole)
        out["pod list bytes"] = len((await timed_get(api, PODS))[1])
        paged, whole_walk = await paged_list_seconds(api, PODS, 500, args.pods)
        out["pod list paged seconds"] = paged
        print(
            f"== lists: {out['pods written/s']:.0f} pods/s written to etcd; "
            f"{out['namespace lists/s']:.0f} lists/s of ~{total} namespaces (goal >= 200); "
            f"list of {args.pods} pods ({out['pod list bytes'] / 1e6:.0f} MB) "
            f"{out['pod list seconds']:.2f} s (goal < 3), in pages of 500 "
            f"{paged:.2f} s{'' if whole_walk else ' (extrapolated from 30 s of pages)'}",
            flush=True,
        )


async def count_added(cluster: Cluster, since: int, want: int, done: asyncio.Future[float]) -> None:
    """Admin watch of HostSubnets: resolve ``done`` with the time the ``want``-th
    ADDED arrives."""
    server, ca, token = cluster.parts()
    added = 0

    def sink(type_: bytes, version: int, code: int) -> None:
        nonlocal added
        added += type_ == b"ADDED"
        if added >= want and not done.done():
            done.set_result(time.monotonic())

    query = {"watch": "true", "resourceVersion": str(since)}
    stream = await open_watch(endpoint_of(server, ca.decode()), HOSTSUBNETS, query, token, sink)
    try:
        waits: list[asyncio.Future[Any]] = [done, stream.done]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stream.close()


async def bench_registration(
    cluster: Cluster, fleet: Fleet, usage: Usage, args: argparse.Namespace, out: Results
) -> None:
    async with aiohttp_session_for(cluster.master.kubeconfig, 4) as api:
        since = await list_version(api, HOSTSUBNETS)
        allocated: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        observer = asyncio.create_task(count_added(cluster, since, args.nodes, allocated))
        usage.begin()
        started = time.monotonic()
        command = {"cmd": "register", "deadline": args.timeout}
        answers = await fleet.ask(command, "registered", args.timeout + 60)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(allocated), 10)
        observer.cancel()
        _, body = await timed_get(api, HOSTSUBNETS)
    ready = [t for a in answers for t in a["done"]]
    out["failed registrations"] = sum(a["failed"] + a["unfinished"] for a in answers)
    out["all subnets s"] = allocated.result() - started if allocated.done() else float("nan")
    out["all ready s"] = max(ready) - started if ready else float("nan")
    hostsubnets = json.loads(body)["items"]
    problems = subnet_problems(hostsubnets, node_names(args.nodes))
    seen = {n: s for a in answers for n, s in a["subnets"].items()}
    stored = {h["metadata"]["name"]: h["subnet"] for h in hostsubnets}
    problems += [
        f"{n} saw {s}, stored {stored.get(n)}" for n, s in seen.items() if stored.get(n) != s
    ][:5]
    out["subnet problems"] = problems
    print(
        f"== registration of {args.nodes} nodes at once: every HostSubnet allocated in "
        f"{out['all subnets s']:.1f} s (goal < 60), every agent Ready in "
        f"{out['all ready s']:.1f} s; {out['failed registrations']} failed or unfinished; "
        f"{len(hostsubnets)} HostSubnets, problems: {problems or 'none'}",
        flush=True,
    )
    for answer in answers:
        if answer["failures"]:
            print("   failures:", answer["failures"][:3])
    print(f"   {usage.summary()}", flush=True)


async def change_pod(api: Any, args: argparse.Namespace, i: int) -> tuple[int, float]:
    """Label change ``i`` on a stored pod: (its resourceVersion, when it was sent)."""
    pod = i % args.pods
    ns = f"ns-{pod % args.namespaces:05d}"
    patch = {"metadata": {"labels": {"bench-change": str(i)}}}
    sent = time.monotonic()
    try:
        async with api.patch(
            f"/api/v1/namespaces/{ns}/pods/pod-{pod:06d}",
            data=json.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
            timeout=aiohttp.ClientTimeout(total=CHANGE_TIMEOUT),
        ) as answer:
            body = await answer.json()
            if answer.status != 200:
                raise RuntimeError(f"patch pod-{pod:06d}: {answer.status} {body}")
    except (TimeoutError, aiohttp.ClientError):
        return 0, sent  # not made (or not known to be): counted apart, not watched for
    return int(body["metadata"]["resourceVersion"]), sent


async def make_changes(api: Any, args: argparse.Namespace) -> dict[int, float]:
    """``rate`` label changes a second for ``duration`` seconds, sent on schedule whether
    or not the earlier ones have been answered (at most ``IN_FLIGHT`` at once: past that
    the schedule slips, and the achieved rate says so); resourceVersion -> sent at."""
    count = int(args.rate * args.duration)
    started = time.monotonic()
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int) -> tuple[int, float]:
        try:
            return await change_pod(api, args, i)
        finally:
            slots.release()

    tasks = []
    for i in range(count):
        await asyncio.sleep(max(0.0, started + i / args.rate - time.monotonic()))
        await slots.acquire()
        if time.monotonic() > started + args.duration * 1.5:
            slots.release()
            break  # far behind schedule: the run is bounded in time as well as count
        tasks.append(asyncio.create_task(one(i)))
    made = dict(await asyncio.gather(*tasks))
    made.pop(0, None)
    return made


async def bench_fanout(
    cluster: Cluster, fleet: Fleet, usage: Usage, args: argparse.Namespace, out: Results
) -> None:
    kinds = kinds_that_fit(args.nodes, args.kinds.split(","))
    async with aiohttp_session_for(cluster.master.kubeconfig, 4) as api:
        since = await list_version(api, PODS)
        started = time.monotonic()
        await fleet.ask({"cmd": "watch", "kinds": kinds, "since": since}, "watching", args.timeout)
        out["watches open s"] = time.monotonic() - started
        print(
            f"== fan-out: {args.nodes} agents x {len(kinds)} watches ({','.join(kinds)}) open "
            f"in {out['watches open s']:.1f} s; {args.rate}/s pod changes for {args.duration} s",
            flush=True,
        )
        usage.begin()
        before = await master_figures(cluster)
        writes = await make_changes(api, args)
        out["write rate"] = len(writes) / (time.monotonic() - started - out["watches open s"])
        deadline = time.monotonic() + args.drain
        while True:
            fan = FanOut(args.nodes, writes, await fleet.ask({"cmd": "report"}, "report", 120))
            if fan.complete() or time.monotonic() > deadline:
                break
            await asyncio.sleep(2)
    latencies = fan.latencies_ms()
    counts = fan.counts()
    out.update(
        missed=fan.missed(),
        unexpected=fan.unexpected(),
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        max_ms=max(latencies, default=float("nan")),
        rss_peak_mb=max(usage.rss, default=0.0),
        expired=fan.total("expired"),
        writes=len(writes),
        per_watcher=(min(counts, default=0), max(counts, default=0)),
        watchers=len(counts),
        heartbeats=fan.total("heartbeats"),
        kinds=kinds,
    )
    print(
        f"   {len(writes)} changes made of {int(args.rate * args.duration)} scheduled "
        f"({out['write rate']:.1f}/s) x {args.nodes} watchers: "
        f"{out['missed']} deliveries missed, {out['unexpected']} unexpected; per watcher "
        f"{min(counts, default=0)}..{max(counts, default=0)} pod events",
        flush=True,
    )
    print(
        f"   write -> last watcher: p50 {out['p50_ms']:.0f} ms, p99 {out['p99_ms']:.0f} ms "
        f"(goal < 1000), max {out['max_ms']:.0f} ms; first watcher p50 "
        f"{percentile(fan.first_ms(), 50):.0f} ms",
        flush=True,
    )
    for start, n, p50, p99, top, first in fan.timeline():
        print(
            f"     writes from {start:4.0f} s: {n} events, p50 {p50:.0f} ms, p99 {p99:.0f} "
            f"ms, max {top:.0f} ms; first watcher p50 {first:.0f} ms",
            flush=True,
        )
    slowest = fan.slowest_nodes()
    print(f"   last watcher of the events over 1 s, most often: {slowest}", flush=True)
    origin = min(writes.values(), default=0.0)
    for node, _ in slowest[:2]:
        opens = {k: [round(t - origin, 1) for t in v] for k, v in fan.opened(node).items()}
        print(f"     {node}: watches opened at (s from the first write) {opens}", flush=True)
    print(
        f"   410 relists {out['expired']}, reconnects {fan.total('reconnects')}, request "
        f"retries {fan.total('retries')}, heartbeats {fan.total('heartbeats')}, errors "
        f"{fan.errors() or 'none'}",
        flush=True,
    )
    print(f"   {usage.summary()} (goal RSS < 2048 MB)", flush=True)
    after = await master_figures(cluster)
    deltas = {k: round(v - before.get(k, 0.0), 3) for k, v in after.items()}
    print(f"   master, during the fan-out: {deltas}", flush=True)


MASTER_FIGURES = (
    "podnet_apiserver_watches_expired_total",
    "podnet_apiserver_watch_dispatch_seconds_count",
    "podnet_apiserver_watch_dispatch_seconds_bucket",
    "podnet_gc_pause_seconds_count",
    "podnet_gc_pause_seconds_sum",
    "podnet_malloc_trim_seconds_count",
    "podnet_malloc_trim_seconds_sum",
)


async def master_figures(cluster: Cluster) -> dict[str, float]:
    """The master's own view from /metrics: watches told 410 before or during their
    replay, dispatch rounds over 0.5 s, collector and trim pauses."""
    async with (
        aiohttp_session_for(cluster.master.kubeconfig, 1) as api,
        api.get("/metrics") as answer,
    ):
        text = await answer.text()
    picked: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name not in MASTER_FIGURES:
            continue
        if name.endswith("_bucket") and 'le="0.5"' not in line and 'le="+Inf"' not in line:
            continue
        series, _, value = line.rpartition(" ")
        picked[series.replace("podnet_", "")] = float(value)
    return picked


async def run(args: argparse.Namespace, work: Path) -> Results:
    """The three benchmarks on one cluster; their figures."""
    raise_file_limit()
    out: Results = {}
    cluster_network = "10.128.0.0/9:8"  # 32,768 node subnets of /24
    etcd_dir = None
    if args.etcd_in_memory:  # a private directory on the tmpfs, removed with etcd's data
        etcd_dir = Path(tempfile.mkdtemp(prefix="podnet-scale-etcd-", dir="/dev/shm"))
    cluster = start_cluster(
        work,
        args.nodes,
        "--network-plugin",
        "networkpolicy",
        "--cluster-network",
        cluster_network,
        etcd_dir=etcd_dir,
    )
    fleet: Fleet | None = None
    sampler: asyncio.Task[None] | None = None
    try:
        await bench_lists(cluster, args, out)
        server, ca, _ = cluster.parts()
        fleet = Fleet(server, ca, cluster.tokens, work)
        await fleet.start(args.workers, poll_seconds=args.poll, subnet_wait=args.subnet_wait)
        async with aiohttp_session_for(cluster.master.kubeconfig, 1) as probe:
            usage = Usage(cluster.pid, fleet.pids, probe)
            sampler = asyncio.create_task(usage.sample_forever())
            await bench_registration(cluster, fleet, usage, args, out)
            if not args.no_fanout:
                await bench_fanout(cluster, fleet, usage, args, out)
            sampler.cancel()
    finally:
        if sampler is not None:
            sampler.cancel()
        if fleet is not None:
            await fleet.stop()
        etcd_log = cluster.etcd.data_dir / "etcd.log"
        if etcd_log.exists():  # removed with etcd's data
            Path(args.log_dir).mkdir(parents=True, exist_ok=True)
            shutil.copy(etcd_log, Path(args.log_dir) / "etcd.log")
        cluster.stop()
        if etcd_dir is not None:
            shutil.rmtree(etcd_dir, ignore_errors=True)
        keep_logs(work, Path(args.log_dir))
    return out


def keep_logs(work: Path, into: Path) -> None:
    """The master's and the workers' logs, copied out of the run's temporary dir."""
    into.mkdir(parents=True, exist_ok=True)
    for log in [work / "master" / "master.log", *work.glob("sim-worker-*.log")]:
        if log.exists():
            shutil.copy(log, into / log.name)


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--namespaces", type=int, default=150, help="namespaces holding pods")
    parser.add_argument("--list-objects", type=int, default=2000, help="namespaces to list")
    parser.add_argument("--rate", type=float, default=10.0, help="pod changes per second")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of changes")
    parser.add_argument("--drain", type=float, default=30.0, help="seconds to wait for stragglers")
    parser.add_argument("--workers", type=int, default=2, help="simulator processes")
    parser.add_argument(
        "--subnet-wait",
        choices=["watch", "poll"],
        default="watch",
        help="how an agent waits for its HostSubnet: watch it by name (the agent's "
        "objectwait) or GET it every --poll seconds (the agent before objectwait)",
    )
    parser.add_argument("--poll", type=float, default=0.5, help="HostSubnet poll period")
    parser.add_argument("--kinds", default=",".join(AGENT_KINDS), help="kinds each agent watches")
    parser.add_argument("--timeout", type=float, default=900.0, help="per phase, seconds")
    parser.add_argument("--no-fanout", action="store_true", help="stop after registration")
    parser.add_argument(
        "--etcd-in-memory",
        action="store_true",
        help="etcd's data on /dev/shm: no disk waits (how much of a figure is the disk's)",
    )
    parser.add_argument("--log-dir", default="/tmp/podnet-scale-logs", help="logs kept here")
    return parser.parse_args(argv)


async def run_until_terminated(args: argparse.Namespace, work: Path) -> Results:
    """``run``, cancelled by SIGTERM (so etcd, the master and the workers are stopped)."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run(args, work)


@contextlib.contextmanager
def one_run_at_a_time() -> Iterator[None]:
    """Two scale runs at once on 2 cores measure each other: the second one waits."""
    with open(LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for the other bench_scale run to end ({LOCK})", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def main() -> None:
    args = options()
    with one_run_at_a_time(), tempfile.TemporaryDirectory(prefix="podnet-scale-") as tmp:
        asyncio.run(run_until_terminated(args, Path(tmp)))


if __name__ == "__main__":
    main()
