"""The endpoints controller at scale: first sync, and pod readiness → EndpointSlice.

Run: .venv/bin/python bench/bench_endpoints.py [--services 5000] [--pods-per-service 10]
     [--flips 100]

In one process, as the master runs it: a registry over the in-memory store, the
in-process object API with its watch cache, and ``EndpointsController``. The store gets
``--services`` Services, each selecting ``--pods-per-service`` ready pods. Printed:

- first sync: from ``start()`` until it returns (every Endpoints and slice written), and
  the objects written per second;
- a readiness flip (the pod's status written as a node writes it) → the slice holding the
  pod written with the new condition, p50/p99 over ``--flips`` flips of pods of different
  Services; interleaved with the same-run floor, one status write → its event at a plain
  watcher of the same watch cache; and the ratio of the two medians;
- memory: the controller's cache per pod (tracemalloc over the pods it holds).

Nothing here touches the network.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

from podnet.api.registry import Registry
from podnet.client.watch import MODIFIED, WatchEvent
from podnet.controllers.endpoints import EndpointsController
from podnet.controllers.endpointspods import PodShrinker
from podnet.controllers.inprocess import InProcessApi
from podnet.model.kinds import NAMESPACE, POD, SERVICE
from podnet.store.memory import MemoryStore

NS = "bench"
Obj = dict[str, Any]


def service(i: int) -> Obj:
    spec = {"selector": {"app": f"s{i}"}, "ports": [{"port": 80, "targetPort": 8080}]}
    return {"metadata": {"name": f"s{i}"}, "spec": spec}


def pod(i: int, j: int, per: int) -> Obj:
    n = i * per + j + 1
    condition = {"type": "Ready", "status": "True"}
    return {
        "metadata": {"name": f"p{i}-{j}", "labels": {"app": f"s{i}"}},
        "spec": {"nodeName": f"node-{n % 100}", "containers": [{"name": "c"}]},
        "status": {
            "phase": "Running",
            "podIP": f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}",
            "conditions": [condition],
        },
    }


async def load(registry: Registry, services: int, per: int) -> None:
    await registry.create(NAMESPACE, {"metadata": {"name": NS}})
    for i in range(services):
        await registry.create(SERVICE, service(i), NS)
        for j in range(per):
            await registry.create(POD, pod(i, j, per), NS)


async def flip(registry: Registry, name: str) -> bool:
    """Toggle a pod's Ready condition through pods/status; the new value."""
    current = await registry.get(POD, NS, name)
    condition = current["status"]["conditions"][0]
    condition["status"] = "False" if condition["status"] == "True" else "True"
    await registry.update(POD, current, NS, name, "status")
    return bool(condition["status"] == "True")


def slice_ready(controller: EndpointsController, service_key: str, name: str) -> bool | None:
    for key in controller._slices_of.get(service_key, ()):
        cached = controller.slices.get(key) or {}
        for endpoint in cached.get("endpoints") or []:
            if endpoint["targetRef"]["name"] == name:
                return bool(endpoint["conditions"]["ready"])
    return None


async def controller_flip(registry: Registry, controller: EndpointsController, i: int) -> float:
    """Flip pod 0 of Service ``i``; ms until the controller has written its slice."""
    started = time.perf_counter()
    want = await flip(registry, f"p{i}-0")
    while slice_ready(controller, f"{NS}/s{i}", f"p{i}-0") is not want:
        await asyncio.sleep(0.0002)
    return (time.perf_counter() - started) * 1000


async def floor_flip(registry: Registry, events: AsyncIterator[WatchEvent]) -> float:
    """Flip pod 1 of Service 0; ms until its MODIFIED event reaches a plain watcher."""
    started = time.perf_counter()
    await flip(registry, "p0-1")
    async for event in events:
        if event.type == MODIFIED and event.object["metadata"]["name"] == "p0-1":
            break
    return (time.perf_counter() - started) * 1000


async def flips(
    registry: Registry, api: InProcessApi, controller: EndpointsController, args: Any
) -> tuple[list[float], list[float]]:
    """Interleaved: a controller flip, then a floor flip, ``--flips`` times."""
    listing = await api.list(POD, NS)
    events = api.watch(POD, listing.resource_version, NS)
    ours, floor = [], []
    try:
        for k in range(args.flips):
            i = k * max(1, args.services // args.flips) % args.services
            ours.append(await controller_flip(registry, controller, i))
            floor.append(await floor_flip(registry, events))
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return ours, floor


def per_pod_bytes(registry_pods: list[Obj]) -> float:
    """What the controller's form of each pod retains (decoded afresh, as from a watch)."""
    shrink = PodShrinker()
    texts = [json.dumps(p) for p in registry_pods]
    tracemalloc.start()
    kept = [shrink(json.loads(t)) for t in texts]
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return used / max(1, len(kept))


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def main(args: argparse.Namespace) -> None:
    registry = Registry(MemoryStore(), prefix="/bench/")
    await load(registry, args.services, args.pods_per_service)
    async with InProcessApi.standalone(registry) as api:
        controller = EndpointsController(api, resync_period=None)
        started = time.perf_counter()
        await controller.start()
        took = time.perf_counter() - started
        written = 2 * args.services
        print(
            f"== {args.services} services x {args.pods_per_service} pods: first sync "
            f"{took:.1f} s ({written / took:.0f} Endpoints+slices written/s)"
        )
        try:
            ours, floor = await flips(registry, api, controller, args)
        finally:
            await controller.stop()
        mine, base = statistics.median(ours), statistics.median(floor)
        print(
            f"== readiness flip -> slice written: p50 {mine:.1f} ms, p99 {p99(ours):.1f} ms; "
            f"floor (write -> watcher) p50 {base:.1f} ms; ratio {mine / base:.1f}"
        )
        pods, _ = await registry.list(POD, NS)
        print(f"== controller cache: {per_pod_bytes(pods):.0f} bytes per pod")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=5000)
    parser.add_argument("--pods-per-service", type=int, default=10)
    parser.add_argument("--flips", type=int, default=100)
    asyncio.run(main(parser.parse_args()))
