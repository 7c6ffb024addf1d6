"""HostSubnet allocation through a real master: scale, crash-restart, exhaustion, changes."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from podnet.api.registry import Registry
from podnet.model.kinds import HOST_SUBNET
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import async_client_for, client_for, node
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess, launch_master

HS = "/apis/network.openshift.io/v1/hostsubnets"
NODES = "/api/v1/nodes"
MERGE = {"Content-Type": "application/merge-patch+json"}


def subnets(api: httpx.Client) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in api.get(HS).json()["items"]}


def assert_disjoint(items: list[dict[str, Any]]) -> None:
    nets = sorted(ipaddress.IPv4Network(h["subnet"]) for h in items)
    for left, right in itertools.pairwise(nets):
        assert not left.overlaps(right), f"{left} overlaps {right}"


async def register(master: MasterProcess, names: list[str]) -> None:
    limits = httpx.Limits(max_connections=50)
    async with async_client_for(master.kubeconfig, limits=limits) as api:
        answers = await asyncio.gather(
            *(
                api.post(NODES, json=node(n, f"192.0.{2 + i // 250}.{1 + i % 250}"))
                for i, n in enumerate(names)
            )
        )
    assert all(a.status_code == 201 for a in answers), [
        a.text for a in answers if a.status_code != 201
    ][:3]


@pytest.fixture
def manual_master(
    etcd: EtcdProcess, tmp_path: Path, prefix: str
) -> Iterator[Callable[..., MasterProcess]]:
    started: list[MasterProcess] = []

    def start(*args: str) -> MasterProcess:
        process = launch_master(etcd, tmp_path / "master", prefix, *args)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def test_500_nodes_get_500_distinct_subnets(master: MasterProcess) -> None:
    names = [f"node-{i:03d}" for i in range(500)]
    asyncio.run(register(master, names))
    with client_for(master.kubeconfig) as api:
        allocated = wait_for(lambda: (s := subnets(api)) and len(s) == 500 and s, 60, "500 subnets")
        assert set(allocated) == set(names)
        assert len({h["subnet"] for h in allocated.values()}) == 500
        assert_disjoint(list(allocated.values()))
        for h in allocated.values():
            net = ipaddress.IPv4Network(h["subnet"])
            assert net.prefixlen == 23 and net.subnet_of(ipaddress.IPv4Network("10.128.0.0/14"))


def test_master_killed_halfway_resumes_without_duplicates(
    manual_master: Callable[..., MasterProcess],
) -> None:
    first = manual_master()
    names = [f"crash-{i:03d}" for i in range(500)]
    asyncio.run(register(first, names))
    with client_for(first.kubeconfig) as api:
        wait_for(lambda: len(subnets(api)) >= 100, 60, "some subnets")
    first.kill()
    second = manual_master()
    with client_for(second.kubeconfig) as api:
        allocated = wait_for(lambda: (s := subnets(api)) and len(s) == 500 and s, 90, "all subnets")
        assert len({h["subnet"] for h in allocated.values()}) == 500
        assert_disjoint(list(allocated.values()))


def test_exhaustion_is_reported_and_recovers(manual_master: Callable[..., MasterProcess]) -> None:
    process = manual_master("--cluster-network", "10.200.0.0/24:6")  # four /26 subnets
    with client_for(process.kubeconfig) as api:
        for i in range(5):
            assert api.post(NODES, json=node(f"ex-{i}", f"192.0.2.{i + 1}")).status_code == 201
        wait_for(lambda: len(subnets(api)) == 4, 30, "4 subnets")

        def starved() -> str | None:
            for n in api.get(NODES).json()["items"]:
                for cond in (n.get("status") or {}).get("conditions") or []:
                    if cond.get("type") == "NetworkUnavailable" and cond.get("status") == "True":
                        return str(n["metadata"]["name"])
            return None

        victim = wait_for(starved, 30, "a NetworkUnavailable condition")
        assert victim not in subnets(api)
        condition = next(
            c
            for c in api.get(f"{NODES}/{victim}").json()["status"]["conditions"]
            if c["type"] == "NetworkUnavailable"
        )
        assert "no subnets available" in condition["message"]
        assert "no subnets available" in process.log()
        donor = next(iter(subnets(api)))
        api.delete(f"{NODES}/{donor}")
        wait_for(lambda: victim in subnets(api), 30, "the starved node to get a subnet")
        assert donor not in subnets(api)


def test_node_ip_change_keeps_the_subnet(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        api.post(NODES, json=node("mover", "192.0.2.10"))
        before = wait_for(lambda: subnets(api).get("mover"), 30, "a subnet")
        patch = {"status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.99"}]}}
        assert api.patch(f"{NODES}/mover/status", json=patch, headers=MERGE).status_code == 200
        after = wait_for(
            lambda: (h := subnets(api).get("mover")) and h["hostIP"] == "192.0.2.99" and h,
            30,
            "hostIP update",
        )
        assert after["subnet"] == before["subnet"]
        assert after["metadata"]["uid"] == before["metadata"]["uid"]


def test_node_delete_releases_and_readd_allocates(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        api.post(NODES, json=node("gone", "192.0.2.20"))
        wait_for(lambda: "gone" in subnets(api), 30, "a subnet")
        api.delete(f"{NODES}/gone")
        wait_for(lambda: "gone" not in subnets(api), 30, "the HostSubnet to go")
        api.post(NODES, json=node("gone", "192.0.2.20"))
        again = wait_for(lambda: subnets(api).get("gone"), 30, "a new subnet")
        assert ipaddress.IPv4Network(again["subnet"]).prefixlen == 23


def test_orphans_are_removed_and_assigned_hosts_kept(
    manual_master: Callable[..., MasterProcess], etcd: EtcdProcess, prefix: str
) -> None:
    process = manual_master()
    with client_for(process.kubeconfig) as api:
        api.post(NODES, json=node("real", "192.0.2.30"))
        wait_for(lambda: "real" in subnets(api), 30, "a subnet")
        f5 = {
            "apiVersion": "network.openshift.io/v1",
            "kind": "HostSubnet",
            "metadata": {
                "name": "f5-1",
                "annotations": {"pod.network.openshift.io/assign-subnet": "true"},
            },
            "host": "f5-1",
            "hostIP": "192.0.2.200",
        }
        created = api.post(HS, json=f5)
        assert created.status_code == 201, created.text
        assigned = wait_for(
            lambda: (h := subnets(api).get("f5-1")) and h.get("subnet"), 30, "f5 subnet"
        )
        assert ipaddress.IPv4Network(assigned).prefixlen == 23
    process.stop()

    async def plant_orphan() -> None:
        store = EtcdStore(etcd.endpoint)
        await store.connect()
        try:
            registry = Registry(store, prefix=prefix)
            await registry.create(
                HOST_SUBNET,
                {
                    "apiVersion": "network.openshift.io/v1",
                    "kind": "HostSubnet",
                    "metadata": {"name": "ghost"},
                    "host": "ghost",
                    "hostIP": "192.0.2.250",
                    "subnet": "10.131.254.0/23",
                },
            )
        finally:
            await store.close()

    asyncio.run(plant_orphan())
    restarted = manual_master()
    with client_for(restarted.kubeconfig) as api:
        wait_for(lambda: "ghost" not in subnets(api), 30, "the orphan to be removed")
        left = subnets(api)
        assert "real" in left and "f5-1" in left
