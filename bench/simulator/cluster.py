"""A private etcd and a real master for one scale run, and bulk objects for it.

The 150,000 pods are written straight to etcd, 100 to a transaction: each is checked by
the API's own validation (``podnet.model.validation.validate``), given the metadata a
create gives it (uid, creationTimestamp, generation) and encoded by
``Registry.encode`` under ``Registry.key``: byte for byte what ``POST .../pods`` would
have stored (pods hold no unique-value claims), without 150,000 HTTPS round trips. The
master learns about them as about any write: through its etcd watch.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from podnet.api.claims import claims
from podnet.api.registry import Registry
from podnet.model.kinds import POD
from podnet.model.validation import validate
from podnet.store.base import Absent, Put
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess, start_etcd
from podnet.testing.api import kubeconfig_parts
from podnet.testing.processes import MasterProcess, launch_master
from simulator.fleet import node_names, write_node_tokens

BATCH = 100  # puts per etcd transaction (etcd's default limit is 128)
IN_FLIGHT = 8


@dataclass
class Cluster:
    etcd: EtcdProcess
    master: MasterProcess
    tokens: dict[str, str]  # node name -> its bearer token

    @property
    def pid(self) -> int:
        assert self.master.process is not None
        return self.master.process.pid

    def parts(self) -> tuple[str, bytes, str]:
        """(server URL, CA PEM, admin token)."""
        return kubeconfig_parts(self.master.kubeconfig)

    def stop(self) -> None:
        try:
            self.master.stop()
        finally:
            self.etcd.stop(remove_data=True)


def start_cluster(
    work: Path, nodes: int, *master_args: str, etcd_dir: Path | None = None
) -> Cluster:
    """etcd and a master whose token file already holds a token for each of ``nodes``.
    ``etcd_dir`` puts etcd's data elsewhere (a tmpfs: how much of a figure is the disk's)."""
    etcd = start_etcd(etcd_dir or work / "etcd")
    try:
        state = work / "master"
        tokens = write_node_tokens(state / "tokens.csv", node_names(nodes))
        # Every simulated node connects from 127.0.0.1: one source, thousands of clients.
        unbounded = ("--max-connections-per-source", "0")
        master = launch_master(etcd, state, "/scale/", *unbounded, *master_args)
    except BaseException:
        etcd.stop(remove_data=True)
        raise
    return Cluster(etcd, master, tokens)


def pod_object(name: str, namespace: str, node: str, index: int) -> dict[str, Any]:
    """A running pod of about 1 KB once stored, as a scheduler and an agent leave it."""
    ip = f"10.{128 + index // 65536 % 128}.{index // 256 % 256}.{index % 256}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": f"app-{index % 50}", "tier": "web", "pod-template-hash": "5d9c8"},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/app:1.0",
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        },
        "status": {
            "phase": "Running",
            "hostIP": "100.64.0.1",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def stored_pod(registry: Registry, obj: dict[str, Any]) -> Put:
    """``obj`` as ``POST .../pods`` would store it."""
    obj = validate(POD, obj, None)
    if claims(POD, obj):
        raise ValueError("pods with unique-value claims cannot be bulk-written")
    meta = obj["metadata"]
    meta.update(
        uid=str(uuid.uuid4()),
        creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        generation=1,
    )
    return Put(registry.key(POD, meta["namespace"], meta["name"]), registry.encode(obj))


async def write_pods(cluster: Cluster, namespaces: list[str], count: int, nodes: list[str]) -> None:
    """Write ``count`` pods spread over ``namespaces`` and ``nodes`` straight to etcd."""
    store = EtcdStore(cluster.etcd.endpoint)
    await store.connect()
    registry = Registry(store, prefix=cluster.master.prefix)
    queue: asyncio.Queue[range] = asyncio.Queue()
    for start in range(0, count, BATCH):
        queue.put_nowait(range(start, min(count, start + BATCH)))

    async def writer() -> None:
        while not queue.empty():
            batch = queue.get_nowait()
            puts = [
                stored_pod(
                    registry,
                    pod_object(
                        f"pod-{i:06d}", namespaces[i % len(namespaces)], nodes[i % len(nodes)], i
                    ),
                )
                for i in batch
            ]
            revision = await store.commit([Absent(p.key) for p in puts], puts)
            if revision is None:
                raise RuntimeError(f"pods {batch} exist already")

    try:
        await asyncio.gather(*(writer() for _ in range(IN_FLIGHT)))
    finally:
        await store.close()
