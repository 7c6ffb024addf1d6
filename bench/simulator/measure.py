"""Figures of a scale run: lists, subnet checks, fan-out analysis, CPU and RSS samples.

The analysis is pure (worker reports in, figures out) so the smoke test checks the same
numbers the benchmark prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from ipaddress import IPv4Network
from typing import Any

import aiohttp

from simulator.fleet import cpu_seconds, rss_mb


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def subnet_problems(hostsubnets: list[dict[str, Any]], nodes: list[str]) -> list[str]:
    """What is wrong with the allocation: a node without exactly one HostSubnet, a subnet
    given twice or overlapping another."""
    problems: list[str] = []
    names = [h["metadata"]["name"] for h in hostsubnets]
    missing = sorted(set(nodes) - set(names))
    if missing:
        problems.append(f"{len(missing)} nodes without a HostSubnet, e.g. {missing[:3]}")
    if len(names) != len(set(names)):
        problems.append("a node has two HostSubnets")
    networks = sorted(IPv4Network(h["subnet"]) for h in hostsubnets)
    for before, after in itertools.pairwise(networks):
        if before.overlaps(after):
            problems.append(f"subnets {before} and {after} overlap")
    return problems


@dataclass
class FanOut:
    """Who saw which pod event, from the workers' reports."""

    watchers: int  # pod watchers (one per agent)
    writes: dict[int, float]  # resourceVersion -> when its write was sent
    reports: list[dict[str, Any]]
    # rv -> [n, first, last, the node that was last]
    per_version: dict[int, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for report in self.reports:
            for version, count, first, last, node in report["per_version"]:
                entry = self.per_version.setdefault(int(version), [0, first, last, node])
                if entry[0]:
                    entry[1] = min(entry[1], first)
                    if last > entry[2]:
                        entry[2], entry[3] = last, node
                entry[0] += count

    def counts(self, kind: str = "pods") -> list[int]:
        return [c for r in self.reports for c in r["counts"].get(kind, [])]

    def missed(self) -> int:
        """Deliveries of the written events that did not happen (watchers x writes)."""
        return sum(self.watchers - int(self.per_version.get(v, [0])[0]) for v in self.writes)

    def unexpected(self) -> int:
        """Pod events seen that no write of the run made (0 unless a stray write)."""
        return sum(int(e[0]) for v, e in self.per_version.items() if v not in self.writes)

    def complete(self) -> bool:
        return self.missed() == 0

    def latencies_ms(self) -> list[float]:
        """Write sent -> its last watcher saw it, for each event every watcher saw."""
        return [
            (self.per_version[v][2] - sent) * 1000
            for v, sent in self.writes.items()
            if self.per_version.get(v, [0])[0] >= self.watchers
        ]

    def timeline(self, window: float = 30.0) -> list[tuple[float, int, float, float, float, float]]:
        """Per ``window`` seconds of writes: (start s, events, p50, p99, max ms of the
        write -> last watcher latency, p50 ms of write -> first watcher): a tail spread
        over the run or one burst, and whether the master had the change late (the
        first watcher late too) or some watchers had it late."""
        if not self.writes:
            return []
        origin = min(self.writes.values())
        buckets: dict[int, list[tuple[float, float]]] = {}
        for version, sent in self.writes.items():
            entry = self.per_version.get(version)
            if entry and entry[0] >= self.watchers:
                buckets.setdefault(int((sent - origin) // window), []).append(
                    ((entry[2] - sent) * 1000, (entry[1] - sent) * 1000)
                )
        rows = []
        for b, pairs in sorted(buckets.items()):
            last = [p[0] for p in pairs]
            first = [p[1] for p in pairs]
            rows.append(
                (
                    b * window,
                    len(pairs),
                    percentile(last, 50),
                    percentile(last, 99),
                    max(last),
                    percentile(first, 50),
                )
            )
        return rows

    def slowest_nodes(self, over_ms: float = 1000.0, top: int = 5) -> list[tuple[str, int]]:
        """The nodes that were most often the last watcher of an event later than
        ``over_ms``: a few slow watchers, or everyone now and then."""
        late: dict[str, int] = {}
        for version, sent in self.writes.items():
            entry = self.per_version.get(version)
            if entry and entry[0] >= self.watchers and (entry[2] - sent) * 1000 > over_ms:
                late[entry[3]] = late.get(entry[3], 0) + 1
        return sorted(late.items(), key=lambda kv: -kv[1])[:top]

    def opened(self, node: str) -> dict[str, list[float]]:
        """When each of ``node``'s watches opened (time.monotonic), by kind."""
        for report in self.reports:
            if node in report.get("opened", {}):
                return dict(report["opened"][node])
        return {}

    def first_ms(self) -> list[float]:
        return [
            (e[1] - self.writes[v]) * 1000 for v, e in self.per_version.items() if v in self.writes
        ]

    def total(self, key: str) -> int:
        return sum(int(r[key]) for r in self.reports)

    def errors(self) -> dict[str, int]:
        merged: dict[str, int] = {}
        for report in self.reports:
            for what, n in report["errors"].items():
                merged[what] = merged.get(what, 0) + n
        return merged


@dataclass
class Usage:
    """CPU and RSS of the master and the simulator's workers, sampled every second."""

    master: int
    workers: list[int]
    api: aiohttp.ClientSession | None = None  # for the /healthz probe
    rss: list[float] = field(default_factory=list)
    probe_ms: list[float] = field(default_factory=list)  # /healthz round trips
    _start: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def _cpu(self) -> tuple[float, float, float]:
        workers = sum(cpu_seconds(p) for p in self.workers)
        return time.monotonic(), cpu_seconds(self.master), workers

    def begin(self) -> None:
        self._start = self._cpu()
        self.rss.clear()
        self.probe_ms.clear()

    async def sample_forever(self) -> None:
        """RSS every second, and the round trip of ``GET /healthz``: a cheap request
        whose latency is mostly the time the master's event loop takes to get to it."""
        while True:
            self.rss.append(rss_mb(self.master))
            if self.api is not None:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, RuntimeError):
                    self.probe_ms.append((await timed_get(self.api, "/healthz"))[0] * 1000)
            await asyncio.sleep(1.0)

    def summary(self) -> str:
        now, master, workers = self._cpu()
        wall = max(now - self._start[0], 1e-9)
        master_pct = (master - self._start[1]) / wall * 100
        workers_pct = (workers - self._start[2]) / wall * 100
        peak = max(self.rss, default=rss_mb(self.master))
        probe = self.probe_ms
        load = os.getloadavg()[0]
        return (
            f"CPU master {master_pct:.0f}% ({master - self._start[1]:.1f} CPU-s: the work, "
            f"whatever the machine's load), simulator {workers_pct:.0f}% (of one core, "
            f"2 cores in all); load average {load:.1f}; master RSS peak {peak:.0f} MB; "
            f"/healthz p50 "
            f"{percentile(probe, 50):.0f} ms, max {max(probe, default=float('nan')):.0f} ms"
        )


async def timed_get(
    api: aiohttp.ClientSession, path: str, params: dict[str, str] | None = None
) -> tuple[float, bytes]:
    started = time.perf_counter()
    async with api.get(path, params=params) as answer:
        body = await answer.read()
        if answer.status != 200:
            raise RuntimeError(f"GET {path}: {answer.status} {body[:200]!r}")
    return time.perf_counter() - started, body


async def lists_per_second(api: aiohttp.ClientSession, path: str, seconds: float) -> float:
    """Sequential full lists of ``path`` for ``seconds``: lists per second."""
    started = time.perf_counter()
    count = 0
    while time.perf_counter() - started < seconds:
        await timed_get(api, path)
        count += 1
    return count / (time.perf_counter() - started)


async def paged_list_seconds(
    api: aiohttp.ClientSession, path: str, limit: int, total: int, bound: float = 30.0
) -> tuple[float, bool]:
    """Seconds to read a collection of ``total`` items in pages of ``limit``
    (``continue`` tokens), and whether that was measured to the end: after ``bound``
    seconds the walk stops and the time is extrapolated from the items read so far."""
    started = time.perf_counter()
    token, read = "", 0
    while True:
        params = {"limit": str(limit)} | ({"continue": token} if token else {})
        _, body = await timed_get(api, path, params)
        page = json.loads(body)
        read += len(page["items"])
        token = page["metadata"].get("continue") or ""
        elapsed = time.perf_counter() - started
        if not token:
            return elapsed, True
        if elapsed > bound:
            return elapsed * total / max(read, 1), False


def median_of(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
