"""Master benchmarks: API throughput vs raw etcd, watch fan-out, and RSS when loaded.

Run: .venv/bin/python bench/bench_api.py [--runs 3] [--pods 30000]
Throughput only (same-run ratios): --watchers 0 --pods 0

Everything runs on loopback: a private etcd and a real `podnet master` child process.
Baseline (same run): raw etcd puts/gets through the same asyncio etcd client (one
transaction per put, one Range per get, 32 in flight), so the ratio shows what the API
layer (HTTPS, auth, validation, JSON, registry) costs on top of etcd.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from podnet.store.base import Absent, Put
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess, start_etcd
from podnet.testing.api import aiohttp_session_for, namespace, node, pod
from podnet.testing.processes import MasterProcess, launch_master

CONCURRENCY = 32


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def run_pool(count: int, work: Any) -> float:
    """Run ``work(i)`` for i < count with CONCURRENCY in flight; ops per second."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            await work(queue.get_nowait())

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return count / (time.perf_counter() - started)


async def etcd_baseline(etcd: EtcdProcess, count: int) -> tuple[float, float]:
    store = EtcdStore(etcd.endpoint)
    await store.connect()
    prefix = f"/bench-raw-{uuid.uuid4().hex}/"
    value = json.dumps(namespace("x")).encode()
    try:
        puts = await run_pool(
            count, lambda i: store.commit([Absent(f"{prefix}{i}")], [Put(f"{prefix}{i}", value)])
        )
        # One Range per get, as before EtcdStore.get batched reads asked together: the
        # baseline stays a plain etcd get (batching would make it ~5x cheaper to compare
        # against, and the API's ratio look worse for a reason that is not the API's).
        gets = await run_pool(count, lambda i: store._get_many([f"{prefix}{i}".encode()]))
    finally:
        await store.close()
    return puts, gets


async def api_throughput(master: MasterProcess, count: int) -> dict[str, float]:
    async with aiohttp_session_for(master.kubeconfig, CONCURRENCY) as api:
        tag = uuid.uuid4().hex[:6]

        async def create(i: int) -> None:
            await post(api, "/api/v1/namespaces", namespace(f"b-{tag}-{i}"))

        async def get(i: int) -> None:
            async with api.get(f"/api/v1/namespaces/b-{tag}-{i}") as answer:
                assert answer.status == 200
                await answer.read()

        assert master.process is not None
        pid = master.process.pid
        before = cpu_seconds(pid)
        creates = await run_pool(count, create)
        between = cpu_seconds(pid)
        gets = await run_pool(count, get)
        after = cpu_seconds(pid)
        started = time.perf_counter()
        lists, items = 0, 0
        while time.perf_counter() - started < 3:
            async with api.get("/api/v1/namespaces") as answer:
                items = len((await answer.json())["items"])
            lists += 1
        elapsed = time.perf_counter() - started
        return {
            "create/s": creates,
            "get/s": gets,
            f"list/s ({items} items)": lists / elapsed,
            "master CPU ms/create": (between - before) / count * 1000,
            "master CPU ms/get": (after - between) / count * 1000,
        }


async def post(api: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> None:
    async with api.post(path, json=body) as answer:
        assert answer.status == 201, await answer.text()


async def watch_fanout(master: MasterProcess, watchers: int, writes: int) -> list[float]:
    """Latency from each write's start to the last of ``watchers`` seeing it, in ms."""
    seen: dict[str, list[float]] = {}
    ready = 0
    async with aiohttp_session_for(master.kubeconfig, watchers + 10) as api:
        async with api.get("/api/v1/nodes") as answer:
            rv = (await answer.json())["metadata"]["resourceVersion"]

        async def watch() -> None:
            nonlocal ready
            params = {"watch": "1", "resourceVersion": rv}
            async with api.get("/api/v1/nodes", params=params) as stream:
                ready += 1
                async for line in stream.content:
                    if line.strip():
                        name = json.loads(line)["object"]["metadata"]["name"]
                        seen.setdefault(name, []).append(time.perf_counter())
                        if len(seen) >= writes and all(len(v) >= watchers for v in seen.values()):
                            return

        tasks = [asyncio.create_task(watch()) for _ in range(watchers)]
        while ready < watchers:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        latencies = []
        for i in range(writes):
            name = f"fan-{i}"
            started = time.perf_counter()
            async with api.post("/api/v1/nodes", json=node(name, f"192.0.2.{i % 250 + 1}")) as a:
                assert a.status == 201
            while len(seen.get(name, [])) < watchers:
                await asyncio.sleep(0.001)
            latencies.append((max(seen[name]) - started) * 1000)
            await asyncio.sleep(0.02)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return latencies


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def load_objects(master: MasterProcess, nodes: int, namespaces: int, pods: int) -> None:
    async with aiohttp_session_for(master.kubeconfig, CONCURRENCY) as api:

        async def make_node(i: int) -> None:
            await post(api, "/api/v1/nodes", node(f"n{i}", f"10.{i // 250}.{i % 250}.1"))

        async def make_ns(i: int) -> None:
            await post(api, "/api/v1/namespaces", namespace(f"ns{i}"))

        async def make_pod(i: int) -> None:
            ns = f"ns{i % namespaces}"
            await post(api, f"/api/v1/namespaces/{ns}/pods", pod(f"p{i}", ns, f"n{i % nodes}"))

        await run_pool(nodes, make_node)
        await run_pool(namespaces, make_ns)
        rate = await run_pool(pods, make_pod)
        print(f"  loaded {pods} pods at {rate:.0f}/s")
        async with api.get("/api/v1/pods") as listed:
            assert len((await listed.json())["items"]) == pods


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="podnet-bench-") as tmp:
        etcd = start_etcd(Path(tmp) / "etcd")
        try:
            await benchmarks(etcd, Path(tmp), args)
        finally:
            etcd.stop(remove_data=True)


async def benchmarks(etcd: EtcdProcess, tmp: Path, args: argparse.Namespace) -> None:
    results: dict[str, list[float]] = {}
    fanout: list[list[float]] = []
    for run in range(args.runs):
        master = launch_master(
            etcd, tmp / f"m{run}", f"/bench-{run}/", "--network-plugin", "subnet"
        )
        try:
            raw_puts, raw_gets = await etcd_baseline(etcd, args.ops)
            api = await api_throughput(master, args.ops)
            for key, value in {
                "raw etcd put/s": raw_puts,
                "raw etcd get/s": raw_gets,
                **api,
            }.items():
                results.setdefault(key, []).append(value)
            if args.watchers:
                fanout.append(await watch_fanout(master, args.watchers, args.writes))
        finally:
            master.stop()
    print(f"== throughput (median of {args.runs} runs, {CONCURRENCY} in flight)")
    for key, values in results.items():
        print(f"  {key:<28} {statistics.median(values):8.{3 if 'CPU' in key else 0}f}")
    create = statistics.median(results["create/s"]) / statistics.median(results["raw etcd put/s"])
    get = statistics.median(results["get/s"]) / statistics.median(results["raw etcd get/s"])
    print(f"  ratio API create / raw etcd put: {create:.2f}   API get / raw etcd get: {get:.2f}")
    if not fanout or not args.pods:
        return  # --watchers 0 / --pods 0: throughput only
    p50 = statistics.median(percentile(f, 50) for f in fanout)
    p99 = statistics.median(percentile(f, 99) for f in fanout)
    print(f"== watch fan-out: {args.watchers} watchers, {args.writes} writes per run")
    print(f"  write → last watcher: p50 {p50:.1f} ms, p99 {p99:.1f} ms (goal p99 < 100 ms)")
    master = launch_master(
        etcd,
        tmp / "rss",
        "/bench-rss/",
        "--network-plugin",
        "multitenant",
        "--cluster-network",
        "10.0.0.0/8:8",
    )
    try:
        assert master.process is not None
        idle = rss_mb(master.process.pid)
        await load_objects(master, args.nodes, args.namespaces, args.pods)
        await asyncio.sleep(2)
        loaded = rss_mb(master.process.pid)
        print(
            f"== master RSS: idle {idle:.0f} MB; with {args.nodes} nodes, {args.namespaces} "
            f"namespaces, {args.pods} pods stored: {loaded:.0f} MB (goal < 250 MB)"
        )
    finally:
        master.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--watchers", type=int, default=200)
    parser.add_argument("--writes", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=30000)
    asyncio.run(main(parser.parse_args()))
