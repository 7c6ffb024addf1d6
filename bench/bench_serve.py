"""The API server's read and write paths at scale: lists, fan-out to thousands of watchers, RSS.

Run: .venv/bin/python bench/bench_serve.py [--runs 3] [--pods 150000] [--watchers 5000]

Everything runs on loopback: a private etcd and a real `podnet master` child process.

- create/get: API create and get against raw etcd put and get through the same client, in
  the same run (``bench_api``'s measurement); ratios of medians.
- list: GET of ~2,000 namespaces, back to back on one connection (body read, not parsed).
- scale: ``--pods`` pods are written straight into etcd in the master's stored form (as
  fast as etcd takes them), then a master starts and loads them into its watch cache.
  Measured: one list of every pod (time to the last byte, and the client's JSON parse on
  top), then ``--watchers`` pod watches held by ``--procs`` client processes, while
  ``--rate`` pods per second are created for ``--seconds``: every watcher must see every
  event; the latency is from a create's start to the last watcher receiving it. Master
  RSS is read with everything loaded and every watcher connected.

``--profile FILE`` runs the master of the create/get phase under cProfile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import ssl
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from bench_api import (
    CONCURRENCY,
    api_throughput,
    etcd_baseline,
    percentile,
    rss_mb,
)
from podnet.api import storedform
from podnet.api.objects import now_rfc3339
from podnet.store.base import Put
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess, start_etcd
from podnet.testing.api import aiohttp_session_for, kubeconfig_parts, namespace, pod
from podnet.testing.processes import MasterProcess

NAMESPACES = 100
NODES = 5000


class ProfiledMaster(MasterProcess):
    """A master under cProfile (the stats are written when it stops)."""

    profile: str = ""

    def command(self) -> list[str]:
        cmd = super().command()
        return [cmd[0], "-m", "cProfile", "-o", self.profile, *cmd[1:]]


def start_master(etcd: EtcdProcess, state: Path, prefix: str, profile: str = "") -> MasterProcess:
    args = ["--network-plugin", "subnet"]
    if profile:
        master: MasterProcess = ProfiledMaster(etcd.endpoint, state, prefix, args=args)
        master.profile = profile  # type: ignore[attr-defined]
    else:
        master = MasterProcess(etcd.endpoint, state, prefix, args=args)
    return master.start(timeout=600)


async def list_rate(master: MasterProcess, seconds: float = 3.0) -> tuple[float, int]:
    """Lists of every namespace per second, one connection, body read but not parsed."""
    async with aiohttp_session_for(master.kubeconfig, 2) as api:
        async with api.get("/api/v1/namespaces") as answer:
            items = len((await answer.json())["items"])
        lists, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            async with api.get("/api/v1/namespaces") as answer:
                await answer.read()
            lists += 1
        return lists / (time.perf_counter() - started), items


# ---- scale ------------------------------------------------------------------------------


def stored_pod(i: int) -> tuple[str, bytes]:
    ns = f"ns{i % NAMESPACES}"
    obj = pod(f"p{i}", ns, f"node-{i % NODES}", {"app": f"a{i % 50}"})
    meta = obj["metadata"]
    meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
    obj["status"] = {"phase": "Running", "podIP": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"}
    return f"core/pods/{ns}/p{i}", storedform.encode(obj)


async def seed(etcd: EtcdProcess, prefix: str, pods: int) -> float:
    """Write namespaces and ``pods`` pods straight into etcd; pods per second."""
    store = EtcdStore(etcd.endpoint)
    await store.connect()
    started = time.perf_counter()
    try:
        nss = []
        for n in range(NAMESPACES):
            obj = namespace(f"ns{n}")
            obj["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
            nss.append(Put(f"{prefix}core/namespaces/ns{n}", storedform.encode(obj)))
        await store.commit([], nss)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for start in range(0, pods, 100):
            queue.put_nowait(start)

        async def worker() -> None:
            while not queue.empty():
                start = queue.get_nowait()
                ops = []
                for i in range(start, min(pods, start + 100)):
                    key, value = stored_pod(i)
                    ops.append(Put(prefix + key, value))
                await store.commit([], ops)

        await asyncio.gather(*(worker() for _ in range(8)))
    finally:
        await store.close()
    return pods / (time.perf_counter() - started)


async def list_all_pods(master: MasterProcess) -> tuple[float, float, int, int]:
    """(seconds to the last byte, seconds to parse, items, bytes) of one list of all pods."""
    async with aiohttp_session_for(master.kubeconfig, 2) as api:
        started = time.perf_counter()
        async with api.get("/api/v1/pods", timeout=aiohttp.ClientTimeout(total=600)) as answer:
            body = await answer.read()
        read = time.perf_counter() - started
        started = time.perf_counter()
        items = len(json.loads(body)["items"])
        return read, time.perf_counter() - started, items, len(body)


def watcher_process(kubeconfig: str, count: int, rv: str, conn: Any) -> None:
    """Hold ``count`` pod watches; report per pod name how many saw it and when the last did.

    Niced: on a 2-core machine the clients compete with the master they measure."""
    os.nice(5)
    asyncio.run(_watchers(Path(kubeconfig), count, rv, conn))


class WatchStream(asyncio.Protocol):
    """A bare watch connection: sends the GET, then only looks for the changed pods'
    names in what arrives (no HTTP or JSON parsing: the client must stay lighter than the
    server it measures)."""

    MARKER = b'"name":"chg-'

    def __init__(self, request: bytes, seen: dict[bytes, list[float]], ready: Any) -> None:
        self.request, self.seen, self.ready = request, seen, ready
        self.tail = b""
        self.errors = 0

    def connection_made(self, transport: Any) -> None:
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if not self.ready.done() and b" 200 " in data[:20]:
            self.ready.set_result(None)
        data = self.tail + data
        now, at = time.time(), data.find(self.MARKER)
        while at >= 0:
            end = data.find(b'"', at + 12)
            if end < 0:
                break
            name = data[at + 8 : end]
            entry = self.seen.get(name)
            if entry is None:
                self.seen[name] = [1, now]
            else:
                entry[0] += 1
                entry[1] = now
            at = data.find(self.MARKER, end)
        self.tail = data[-64:] if at < 0 else data[at:]
        if b'"type":"ERROR"' in data:
            self.errors += 1


async def _watchers(kubeconfig: Path, count: int, rv: str, conn: Any) -> None:
    server, ca, token = kubeconfig_parts(kubeconfig)
    host, port = server.removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context(cadata=ca.decode())
    path = f"/api/v1/pods?watch=1&resourceVersion={rv}&timeoutSeconds=3000"
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n"
    ).encode()
    seen: dict[bytes, list[float]] = {}
    loop = asyncio.get_running_loop()
    streams, transports = [], []
    for _ in range(count):
        ready = loop.create_future()
        stream = WatchStream(request, seen, ready)
        transport, _ = await loop.create_connection(
            lambda stream=stream: stream, host, int(port), ssl=context
        )
        await ready
        streams.append(stream)
        transports.append(transport)
    conn.send("ready")
    while not conn.poll(0.05):  # the writer is done
        await asyncio.sleep(0.05)
    conn.recv()
    await asyncio.sleep(2.0)  # let the last events arrive
    errors = sum(s.errors for s in streams)
    conn.send({"errors": [errors, 0.0], **{k.decode(): v for k, v in seen.items()}})
    for transport in transports:
        transport.close()


async def fanout_under_load(
    master: MasterProcess, watchers: int, procs: int, rate: float, seconds: float
) -> dict[str, Any]:
    async with aiohttp_session_for(master.kubeconfig, 8) as api:
        async with api.get("/api/v1/namespaces/ns0/pods", params={"limit": "1"}) as answer:
            rv = (await answer.json())["metadata"]["resourceVersion"]
        ctx = multiprocessing.get_context("spawn")
        pipes, children = [], []
        per = [watchers // procs + (1 if i < watchers % procs else 0) for i in range(procs)]
        for n in per:
            mine, theirs = ctx.Pipe()
            config = str(master.kubeconfig)
            child = ctx.Process(target=watcher_process, args=(config, n, rv, theirs))
            child.start()
            pipes.append(mine)
            children.append(child)
        for pipe in pipes:
            while not pipe.poll(1):
                await asyncio.sleep(0)
            assert pipe.recv() == "ready"
        assert master.process is not None
        rss_watching = rss_mb(master.process.pid)
        cpu_before = cpu_seconds(master.process.pid)
        started: dict[str, float] = {}
        total = int(rate * seconds)
        begin = time.perf_counter()
        for i in range(total):
            await asyncio.sleep(max(0.0, begin + i / rate - time.perf_counter()))
            name = f"chg-{i}"
            started[name] = time.time()
            body = pod(name, f"ns{i % NAMESPACES}", f"node-{i % NODES}")
            async with api.post(f"/api/v1/namespaces/ns{i % NAMESPACES}/pods", json=body) as a:
                assert a.status == 201, await a.text()
        rss_end = rss_mb(master.process.pid)
        cpu = (cpu_seconds(master.process.pid) - cpu_before) / (time.perf_counter() - begin)
        for pipe in pipes:
            pipe.send("done")
        reports = [pipe.recv() for pipe in pipes]
        watch_errors = sum(r.pop("errors")[0] for r in reports)
        for child in children:
            child.join(30)
        async with api.get("/metrics") as answer:
            dispatch = dispatch_quantiles(await answer.text())
    latencies, missing = [], 0
    for name, at in started.items():
        counts = [r.get(name, [0, 0.0]) for r in reports]
        if sum(c[0] for c in counts) != watchers:
            missing += 1
            continue
        latencies.append(max(c[1] for c in counts) - at)
    return {
        "events": total,
        "events not seen by every watcher": missing,
        "watchers ended with an ERROR": watch_errors,
        "p50 ms": percentile(latencies, 50) * 1000 if latencies else float("nan"),
        "p99 ms": percentile(latencies, 99) * 1000 if latencies else float("nan"),
        "rss watching MB": rss_watching,
        "rss end MB": rss_end,
        "master CPU while writing, %": cpu * 100,
        "server dispatch p50 ms (bucket bound)": dispatch[0] * 1000,
        "server dispatch p99 ms (bucket bound)": dispatch[1] * 1000,
    }


def dispatch_quantiles(metrics: str) -> tuple[float, float]:
    """Upper bucket bounds of p50 and p99 of the master's watch dispatch histogram."""
    buckets = []
    for line in metrics.splitlines():
        if line.startswith("podnet_apiserver_watch_dispatch_seconds_bucket"):
            bound = line.split('le="')[1].split('"')[0]
            buckets.append((float(bound), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1] if buckets else 0
    if not total:
        return float("nan"), float("nan")
    return tuple(  # type: ignore[return-value]
        next(b for b, n in buckets if n >= q * total) for q in (0.5, 0.99)
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- main -------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="podnet-bench-serve-") as tmp:
        etcd = start_etcd(Path(tmp) / "etcd")
        try:
            if args.runs:
                await crud_and_lists(etcd, Path(tmp), args)
            if args.pods:
                await scale(etcd, Path(tmp), args)
        finally:
            etcd.stop(remove_data=True)


async def crud_and_lists(etcd: EtcdProcess, tmp: Path, args: argparse.Namespace) -> None:
    results: dict[str, list[float]] = {}
    for run in range(args.runs):
        profile = args.profile if run == 0 else ""
        master = start_master(etcd, tmp / f"m{run}", f"/bench-{run}/", profile)
        try:
            raw_puts, raw_gets = await etcd_baseline(etcd, args.ops)
            api = await api_throughput(master, args.ops)
            lists, items = await list_rate(master)
            row = {"raw etcd put/s": raw_puts, "raw etcd get/s": raw_gets, **api}
            row[f"list/s ({items} items, body read)"] = lists
            row["create / put"] = api["create/s"] / raw_puts
            row["get / get"] = api["get/s"] / raw_gets
            for key, value in row.items():
                if not key.startswith("list/s (") or "body" in key:
                    results.setdefault(key, []).append(value)
        finally:
            master.stop()
    print(f"== throughput (median of {args.runs} runs, {CONCURRENCY} in flight)")
    for key, values in results.items():
        shown = " ".join(f"{v:.2f}" if v < 10 else f"{v:.0f}" for v in values)
        median = statistics.median(values)
        print(f"  {key:<36} {median:9.2f}   runs: {shown}")


async def scale(etcd: EtcdProcess, tmp: Path, args: argparse.Namespace) -> None:
    prefix = "/bench-scale/"
    rate = await seed(etcd, prefix, args.pods)
    print(f"== scale: {args.pods} pods written to etcd at {rate:.0f}/s")
    started = time.perf_counter()
    master = start_master(etcd, tmp / "scale", prefix)
    print(f"  master ready in {time.perf_counter() - started:.1f} s")
    try:
        assert master.process is not None
        print(f"  master RSS with {args.pods} pods cached: {rss_mb(master.process.pid):.0f} MB")
        for _ in range(args.runs or 1):
            read, parse, items, size = await list_all_pods(master)
            print(
                f"  list of {items} pods ({size / 1e6:.0f} MB): {read:.2f} s to the last byte, "
                f"+{parse:.2f} s client JSON parse"
            )
        if args.watchers:
            result = await fanout_under_load(
                master, args.watchers, args.procs, args.rate, args.seconds
            )
            print(f"== fan-out: {args.watchers} watchers, {args.rate}/s pod creates")
            for key, value in result.items():
                print(f"  {key:<36} {value:9.1f}")
    finally:
        master.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=150000)
    parser.add_argument("--watchers", type=int, default=5000)
    parser.add_argument("--procs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--profile", default="")
    asyncio.run(main(parser.parse_args()))
