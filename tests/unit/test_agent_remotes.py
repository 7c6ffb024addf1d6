"""Remote nodes: HostSubnets -> RemoteNode, the sync loop and the fake data plane's checks.
(The API client's list+watch is tested in test_client_aio.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import Any

import pytest

from podnet.agent.clusterwatch import apply_event
from podnet.agent.remotes import RemoteNodeSync, remote_nodes
from podnet.client import LISTED, WatchEvent
from podnet.dataplane.fake import FakeDataPlane
from podnet.dataplane.interface import (
    DataPlaneError,
    NodeNetwork,
    NodeSetupRefused,
    PodNetwork,
    RemoteNode,
)
from podnet.testing.e2e import eventually

Obj = dict[str, Any]
LOCAL = NodeNetwork(
    "node-a",
    IPv4Address("192.0.2.10"),
    IPv4Network("10.128.0.0/24"),
    (IPv4Network("10.128.0.0/14"),),
    IPv4Network("172.30.0.0/16"),
    1450,
)


def hostsubnet(name: str, subnet: str | None, ip: str, rv: int = 1) -> Obj:
    obj: Obj = {"metadata": {"name": name, "resourceVersion": str(rv)}, "host": name, "hostIP": ip}
    if subnet:
        obj["subnet"] = subnet
    return obj


def remote(name: str, ip: str, subnet: str) -> RemoteNode:
    return RemoteNode(name, IPv4Address(ip), IPv4Network(subnet))


# ---- the pure function ---------------------------------------------------------------------


def test_remote_nodes_skip_this_node_and_subnetless_hostsubnets() -> None:
    subnets = [
        hostsubnet("node-c", "10.128.2.0/24", "192.0.2.12"),
        hostsubnet("node-a", "10.128.0.0/24", "192.0.2.10"),
        hostsubnet("node-b", "10.128.1.0/24", "192.0.2.11"),
        hostsubnet("pending", None, "192.0.2.13"),
        hostsubnet("broken", "not-a-cidr", "192.0.2.14"),
    ]
    assert remote_nodes(subnets, "node-a") == [
        remote("node-b", "192.0.2.11", "10.128.1.0/24"),
        remote("node-c", "192.0.2.12", "10.128.2.0/24"),
    ]


def test_apply_event_folds_listings_and_changes() -> None:
    objects: dict[str, Obj] = {"stale": {}}
    apply_event(objects, WatchEvent(LISTED, items=(hostsubnet("a", "10.0.0.0/24", "1.1.1.1"),)))
    assert list(objects) == ["a"]
    apply_event(objects, WatchEvent("ADDED", hostsubnet("b", "10.0.1.0/24", "1.1.1.2")))
    apply_event(objects, WatchEvent("DELETED", hostsubnet("a", "10.0.0.0/24", "1.1.1.1")))
    assert list(objects) == ["b"]


# ---- the sync loop -------------------------------------------------------------------------


@pytest.fixture
async def dataplane() -> FakeDataPlane:
    fake = FakeDataPlane()
    await fake.setup_node(LOCAL)
    return fake


async def settle(sync: RemoteNodeSync, calls: int, dataplane: FakeDataPlane) -> None:
    def done() -> bool:
        return dataplane.calls.count("sync_remote_nodes") >= calls and sync.synced.is_set()

    await eventually(done, what=f"{calls} syncs")


async def test_a_burst_of_changes_is_one_sync(dataplane: FakeDataPlane) -> None:
    sync = RemoteNodeSync(dataplane, LOCAL, resync_period=60, coalesce=0.05)
    task = asyncio.create_task(sync.run())
    subnets: dict[str, Obj] = {}
    for i in range(1, 11):
        subnets[f"n{i}"] = hostsubnet(f"n{i}", f"10.128.{i}.0/24", f"192.0.2.{20 + i}")
        sync.replace(subnets)
    await settle(sync, 1, dataplane)
    await asyncio.sleep(0.1)  # kept: a negative check's window (two coalescing periods)
    assert dataplane.calls.count("sync_remote_nodes") == 1
    assert sorted(dataplane.state.remotes) == sorted(subnets)
    assert dataplane.vtep_peers() == {IPv4Address(f"192.0.2.{20 + i}") for i in range(1, 11)}
    task.cancel()


async def test_failed_sync_is_retried_and_drift_is_repaired(dataplane: FakeDataPlane) -> None:
    sync = RemoteNodeSync(dataplane, LOCAL, resync_period=0.2, coalesce=0.01)
    dataplane.fail_next["sync_remote_nodes"] = DataPlaneError("netlink busy")
    sync.replace({"b": hostsubnet("b", "10.128.1.0/24", "192.0.2.11")})
    task = asyncio.create_task(sync.run())
    await settle(sync, 2, dataplane)
    assert list(dataplane.state.remotes) == ["b"]
    dataplane.drift_remove_remote("b")
    before = dataplane.calls.count("sync_remote_nodes")
    await settle(sync, before + 1, dataplane)
    assert list(dataplane.state.remotes) == ["b"]
    assert dataplane.remote_changes == ["add b", "add b"]
    task.cancel()


# ---- the fake data plane refuses what a kernel would ----------------------------------------


async def test_fake_refuses_overlapping_or_duplicate_remotes(dataplane: FakeDataPlane) -> None:
    bad = [
        [remote("b", "192.0.2.11", "10.128.0.128/25")],  # inside the local subnet
        [remote("b", "192.0.2.11", "10.128.1.0/24"), remote("c", "192.0.2.12", "10.128.1.0/25")],
        [remote("b", "192.0.2.10", "10.128.1.0/24")],  # this node's IP
        [remote("node-a", "192.0.2.11", "10.128.1.0/24")],
    ]
    for remotes in bad:
        with pytest.raises(DataPlaneError):
            await dataplane.sync_remote_nodes(LOCAL, remotes)
    assert dataplane.state.remotes == {}


def pod(cid: str, address: str, **changes: Any) -> PodNetwork:
    gateway = IPv4Address("10.128.0.1")
    base = PodNetwork(cid, "/var/run/netns/x", "eth0", IPv4Interface(address), gateway, 1450)
    return dataclasses.replace(base, **changes)


async def test_fake_refuses_bad_pods(dataplane: FakeDataPlane) -> None:
    await dataplane.attach_pod(pod("c1", "10.128.0.2/24"))
    refused = [
        pod("c1", "10.128.0.3/24"),  # same container and ifname
        pod("c2", "10.128.0.2/24"),  # address in use
        pod("c2", "10.128.1.2/24"),  # outside the node subnet
        pod("c2", "10.128.0.1/24"),  # the gateway
        pod("c2", "10.128.0.3/24", mtu=9000),
        pod("c2", "10.128.0.3/24", netns=""),
        pod("c2", "10.128.0.3/24", ifname="a-name-too-long-x"),
        pod("c2", "10.128.0.3/24", gateway=IPv4Address("10.128.0.254")),
    ]
    for bad in refused:
        with pytest.raises(DataPlaneError):
            await dataplane.attach_pod(bad)
    await dataplane.detach_pod("c1", "eth0", None)
    await dataplane.detach_pod("c1", "eth0", None)  # already gone: fine
    assert await dataplane.attached_pods() == []


async def test_fake_refuses_work_before_set_up_and_bad_nodes() -> None:
    fresh = FakeDataPlane()
    assert not (await fresh.check_node(LOCAL)).ok
    with pytest.raises(DataPlaneError):
        await fresh.attach_pod(pod("c1", "10.128.0.2/24"))
    too_big = dataclasses.replace(LOCAL, mtu=1480)
    outside = dataclasses.replace(LOCAL, subnet=IPv4Network("10.200.0.0/24"))
    for bad in (too_big, outside):
        with pytest.raises(NodeSetupRefused):
            await fresh.setup_node(bad)
    await fresh.setup_node(LOCAL)
    assert (await fresh.check_node(LOCAL)).ok
