"""300 watches from an old resourceVersion, with a node's identity, over 3,000 pods of
4 KiB (issue 19, finding 3: they took a real master from 0.8 to 7.8 GB RSS).

The attack as it was, on a real master and etcd: the pods are written after the master
started (their events are in the watch cache's ring), then 300 watches of them open from
the revision before the pods and do not read. Each replay is 12 MiB, three times a live
watcher's 4 MiB bound. The master's RSS may not grow by 300 MiB; watches over the node's
cap (``--max-watches-per-user``, 100) are 429 with Retry-After; the others, once read,
end with a 410 ERROR event after at most the bound, and the client relists.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podnet.api.auth import ensure_node_token
from podnet.api.registry import Registry
from podnet.model.kinds import NAMESPACE, POD
from podnet.store.base import Absent, Put
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import kubeconfig_parts, namespace, pod
from podnet.testing.processes import MasterProcess, launch_master

NODE = "node-a"
PODS = 3000
POD_PADDING = 4096  # bytes of annotation: 4 KiB pods
WATCHES = 300
PER_TXN = 50
RSS_GROWTH_LIMIT = 300 * 1024 * 1024
BOUND = 4 * 1024 * 1024  # the fan-out's backlog bound, which a replay may not exceed


def rss(pid: int) -> int:
    """Resident set size of ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def stored(registry: Registry, obj: dict[str, Any]) -> Put:
    meta = obj["metadata"]
    meta.update(
        uid=str(uuid.uuid4()),
        creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        generation=1,
    )
    return Put(registry.key(POD, meta["namespace"], meta["name"]), registry.encode(obj))


async def write_pods(etcd: EtcdProcess, master: MasterProcess) -> int:
    """``PODS`` pods of 4 KiB on ``NODE``, straight to etcd; the revision before them."""
    store = EtcdStore(etcd.endpoint)
    await store.connect()
    registry = Registry(store, prefix=master.prefix)
    try:
        await registry.create(NAMESPACE, namespace("herd"))
        before = await store.revision()
        for start in range(0, PODS, PER_TXN):
            puts = []
            for i in range(start, start + PER_TXN):
                obj = pod(f"p{i:05d}", "herd", node_name=NODE)
                obj["metadata"]["annotations"] = {"padding": "x" * POD_PADDING}
                puts.append(stored(registry, obj))
            assert await store.commit([Absent(p.key) for p in puts], puts) is not None
        return before
    finally:
        await store.close()


def node_session(master: MasterProcess, token: str) -> aiohttp.ClientSession:
    server, ca, _ = kubeconfig_parts(master.kubeconfig)
    context = ssl.create_default_context(cadata=ca.decode())
    context.check_hostname = False
    return aiohttp.ClientSession(
        base_url=server,
        headers={"Authorization": f"Bearer {token}"},
        connector=aiohttp.TCPConnector(ssl=context, limit=0),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
    )


async def read_to_the_end(resp: aiohttp.ClientResponse) -> tuple[int, dict[str, Any] | None]:
    """(bytes read, the last event) of a watch until the master ends it."""
    size, last = 0, None
    async with asyncio.timeout(120):
        async for line in resp.content:
            size += len(line)
            if line.strip():
                last = line
    return size, json.loads(last) if last else None


@pytest.mark.slow
async def test_old_revision_watches_replay_a_bounded_amount_then_410(
    etcd: EtcdProcess, tmp_path: Path, prefix: str
) -> None:
    state = tmp_path / "master"
    state.mkdir(mode=0o700)
    token = ensure_node_token(state / "tokens.csv", NODE)
    master = launch_master(etcd, state, prefix, "--no-controllers")
    try:
        assert master.process is not None
        before = await write_pods(etcd, master)
        admin = kubeconfig_parts(master.kubeconfig)[2]
        async with node_session(master, admin) as api:
            # A consistent list: the master's cache has had every pod once it answers.
            listed = await api.get("/api/v1/namespaces/herd/pods", params={"limit": "1"})
            assert listed.status == 200, await listed.text()
        async with node_session(master, token) as api:
            baseline = rss(master.process.pid)
            query = {
                "watch": "1",
                "resourceVersion": str(before),
                "fieldSelector": f"spec.nodeName={NODE}",
            }
            url = "/api/v1/pods"
            opened = await asyncio.gather(*(api.get(url, params=query) for _ in range(WATCHES)))
            try:
                peak = baseline
                for _ in range(10):  # the replays under way, unread, for 5 s
                    await asyncio.sleep(0.5)
                    peak = max(peak, rss(master.process.pid))
                growth = peak - baseline
                assert growth < RSS_GROWTH_LIMIT, f"master RSS grew by {growth >> 20} MiB"
                statuses = [r.status for r in opened]
                odd = [await r.text() for r in opened if r.status not in (200, 429)]
                assert not odd, (statuses, odd[:3])
                refused = [r for r in opened if r.status == 429]
                assert refused and all(r.headers.get("Retry-After") for r in refused)
                served = [r for r in opened if r.status == 200]
                assert served
                ends = await asyncio.gather(*(read_to_the_end(r) for r in served))
            finally:
                for resp in opened:
                    resp.close()
        for size, last in ends:
            assert size <= BOUND + 64 * 1024, size  # the bound, and the ERROR line
            assert last is not None and last["type"] == "ERROR", last
            assert last["object"]["code"] == 410, last
    finally:
        master.stop()
