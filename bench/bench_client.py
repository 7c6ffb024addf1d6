"""The API client's watch path: CPU per event of ``podnet.client`` (aio client + reflector)
against a floor of raw aiohttp line reading + ``json.loads``, in the same run.

Run: .venv/bin/python bench/bench_client.py [--events 30000] [--runs 7]

A loopback aiohttp server (same process) streams ``--events`` MODIFIED pod events; the
figures are process CPU time per event (less disturbed by a busy machine than wall
time), median of ``--runs`` interleaved runs. The ratio says what the client adds over
just reading and decoding the lines (event types, resourceVersion bookkeeping for the
reflector's relists, generator hops). Issue 9 measured it against the agent's old
client (``agent/apiclient.py``): 0.98x (CPU per event, same run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from podnet.client.aio import AsyncApiClient
from podnet.client.reflector import reflect
from podnet.kubeconfig import ClientConfig
from podnet.model.kinds import POD


def pod(i: int) -> dict[str, Any]:
    meta = {"name": f"p{i % 500}", "namespace": "default", "resourceVersion": str(100 + i)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**meta, "uid": f"uid-{i}", "labels": {"app": "web", "n": str(i % 7)}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "podIP": f"10.128.{i % 250}.{i % 200}"},
    }


async def serve(events: int) -> tuple[web.AppRunner, asyncio.Event]:
    lines = b"".join(
        json.dumps({"type": "MODIFIED", "object": pod(i)}).encode() + b"\n" for i in range(events)
    )
    done = asyncio.Event()

    async def pods(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "100"}, "items": []})
        response = web.StreamResponse()
        await response.prepare(request)
        for start in range(0, len(lines), 1 << 16):
            await response.write(lines[start : start + (1 << 16)])
        await done.wait()
        return response

    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, done


async def raw(url: str, events: int) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/api/v1/pods?watch=true") as resp,
    ):
        count = 0
        async for line in resp.content:
            json.loads(line)
            count += 1
            if count == events:
                return


async def client(url: str, events: int) -> None:
    api = AsyncApiClient(ClientConfig(url))
    stream = reflect(api, POD)
    count = 0
    async for _ in stream:
        count += 1
        if count == events + 1:  # the LISTED, then every change
            break
    await stream.aclose()
    await api.close()


async def main(events: int, runs: int) -> None:
    runner, done = await serve(events)
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    cpu: dict[str, list[float]] = {"raw": [], "client": []}
    ways: dict[str, Callable[[str, int], Awaitable[None]]] = {"raw": raw, "client": client}
    for _ in range(runs):
        for name, way in ways.items():
            start = time.process_time()
            await way(url, events)
            cpu[name].append((time.process_time() - start) * 1e6 / events)
    done.set()
    await runner.cleanup()
    floor, ours = statistics.median(cpu["raw"]), statistics.median(cpu["client"])
    print(f"raw aiohttp + json.loads: {floor:.2f} us CPU per event (median of {runs})")
    print(f"podnet.client reflector:  {ours:.2f} us CPU per event")
    print(f"ratio client/raw:         {ours / floor:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=30000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.runs))
