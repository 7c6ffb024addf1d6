"""The master's controllers against a real etcd: scale, racing masters, restarts, leases.

Each simulated master is a registry on its own etcd connection and the in-process object
API over it (with its own watch cache), as ``podnet master`` runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from functools import partial
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any, cast

import pytest

from podnet.api.registry import Registry
from podnet.controllers import manager as manager_module
from podnet.controllers.calls import ControllerApi
from podnet.controllers.clusternetwork import ensure_cluster_network
from podnet.controllers.config import NetworkConfig
from podnet.controllers.hostsubnets import HostSubnetController
from podnet.controllers.inprocess import InProcessApi
from podnet.controllers.leader import EtcdLeaderElector
from podnet.controllers.manager import ControllerManager
from podnet.controllers.namespaces import ensure_namespace
from podnet.controllers.nodelifecycle import NodeLifecycleController
from podnet.master import Master, MasterOptions
from podnet.model.errors import ApiError
from podnet.model.kinds import HOST_SUBNET, NODE
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess, pid_alive, start_etcd
from podnet.testing import tools
from podnet.testing.api import async_client_for
from podnet.testing.e2e import eventually

Obj = dict[str, Any]
NODES = 500


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One etcd for this module, on free loopback ports; removed even on failure."""
    tools.require("etcd")
    process = start_etcd(tmp_path_factory.mktemp("controllers-etcd"))
    pid = process.pid
    try:
        yield process
    finally:
        process.stop(remove_data=True)
        assert pid is None or not pid_alive(pid)


@pytest.fixture
def prefix() -> str:
    return f"/podnet-test-{uuid.uuid4().hex}/"


@pytest.fixture
async def connect(etcd_server: EtcdProcess) -> AsyncIterator[Callable[[], Awaitable[EtcdStore]]]:
    """Open EtcdStores (one per simulated master); all are closed after the test."""
    stores: list[EtcdStore] = []

    async def open_store() -> EtcdStore:
        store = EtcdStore(etcd_server.endpoint)
        await store.connect()
        stores.append(store)
        return store

    yield open_store
    for store in stores:
        await store.close()


@pytest.fixture
async def registry(connect: Callable[[], Awaitable[EtcdStore]], prefix: str) -> Registry:
    return Registry(await connect(), prefix=prefix)


@pytest.fixture
async def in_process() -> AsyncIterator[Callable[[Registry], Awaitable[InProcessApi]]]:
    """Open the in-process object API over a registry; every one is closed after the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def open_api(registry: Registry) -> InProcessApi:
            return await stack.enter_async_context(InProcessApi.standalone(registry))

        yield open_api


def node(name: str, index: int) -> Obj:
    ip = f"192.0.{2 + index // 250}.{1 + index % 250}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }


async def create_nodes(registry: Registry, names: list[str], first: int = 0) -> None:
    """Create Nodes with distinct InternalIPs (``first`` onwards): a Node IP is unique."""
    nodes = (node(n, i) for i, n in enumerate(names, start=first))
    await asyncio.gather(*(registry.create(NODE, body) for body in nodes))


async def subnets(registry: Registry) -> dict[str, Obj]:
    items, _ = await registry.list(HOST_SUBNET)
    return {h["metadata"]["name"]: h for h in items}


async def wait_for_subnets(registry: Registry, count: int, timeout: float = 60.0) -> dict[str, Obj]:
    deadline = time.monotonic() + timeout
    while True:
        current = await subnets(registry)
        if len(current) >= count:
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(current)} of {count} HostSubnets after {timeout}s")
        await asyncio.sleep(0.05)


def assert_distinct(hostsubnets: dict[str, Obj]) -> None:
    nets = sorted(IPv4Network(h["subnet"]) for h in hostsubnets.values())
    assert len(set(nets)) == len(nets)
    for left, right in itertools.pairwise(nets):
        assert not left.overlaps(right), f"{left} overlaps {right}"
    for name, h in hostsubnets.items():
        assert h["host"] == name
        assert IPv4Network(h["subnet"]).subnet_of(IPv4Network("10.128.0.0/14"))


async def start_controller(api: InProcessApi) -> HostSubnetController:
    cluster_network = await ensure_cluster_network(api, NetworkConfig.default())
    await ensure_namespace(api, "default")
    controller = HostSubnetController(api, cluster_network, resync_period=None)
    await controller.start()
    return controller


OpenApi = Callable[[Registry], Awaitable[InProcessApi]]


# ---- scale -------------------------------------------------------------------------------


async def test_500_nodes_registered_at_once_get_500_distinct_subnets(
    registry: Registry, in_process: OpenApi
) -> None:
    controller = await start_controller(await in_process(registry))
    try:
        names = [f"node-{i:03d}" for i in range(NODES)]
        started = time.monotonic()
        await create_nodes(registry, names)
        allocated = await wait_for_subnets(registry, NODES)
        elapsed = time.monotonic() - started
        print(f"\n500 nodes registered and allocated in {elapsed:.2f}s")
        assert set(allocated) == set(names)
        assert_distinct(allocated)
        assert controller.allocator.available == 512 - NODES
    finally:
        await controller.stop()


async def test_a_controller_cancelled_halfway_resumes_without_duplicates(
    connect: Callable[[], Awaitable[EtcdStore]], prefix: str, in_process: OpenApi
) -> None:
    first_registry = Registry(await connect(), prefix=prefix)
    first = await start_controller(await in_process(first_registry))
    names = [f"crash-{i:03d}" for i in range(NODES)]
    creating = asyncio.create_task(create_nodes(first_registry, names))
    await wait_for_subnets(first_registry, 100)
    await first.stop()  # cancels work in flight, mid-allocation
    await creating
    halfway = len(await subnets(first_registry))
    assert halfway < NODES
    second = await start_controller(await in_process(Registry(await connect(), prefix=prefix)))
    try:
        allocated = await wait_for_subnets(first_registry, NODES)
        assert set(allocated) == set(names)
        assert_distinct(allocated)
    finally:
        await second.stop()


# ---- racing masters ----------------------------------------------------------------------


async def test_two_controllers_without_election_never_share_a_subnet(
    connect: Callable[[], Awaitable[EtcdStore]], prefix: str, in_process: OpenApi
) -> None:
    registries = [Registry(await connect(), prefix=prefix) for _ in range(2)]
    controllers = [await start_controller(await in_process(r)) for r in registries]
    try:
        names = [f"race-{i:03d}" for i in range(NODES)]
        started = time.monotonic()
        await create_nodes(registries[0], names)
        allocated = await wait_for_subnets(registries[0], NODES)
        print(
            f"\n500 nodes allocated by two racing controllers in {time.monotonic() - started:.2f}s"
        )
        for controller in controllers:
            await controller.queue.wait_idle()
        allocated = await subnets(registries[0])
        assert set(allocated) == set(names)
        assert_distinct(allocated)
    finally:
        for controller in controllers:
            await controller.stop()


async def test_the_subnet_claim_alone_stops_a_duplicate(registry: Registry) -> None:
    def body(name: str) -> Obj:
        return {
            "apiVersion": "network.openshift.io/v1",
            "kind": "HostSubnet",
            "metadata": {"name": name},
            "host": name,
            "hostIP": "192.0.2.9",
            "subnet": "10.128.0.0/23",
        }

    results = await asyncio.gather(
        *(registry.create(HOST_SUBNET, body(f"claim-{i}")) for i in range(10)),
        return_exceptions=True,
    )
    winners = [r for r in results if isinstance(r, dict)]
    losers = [r for r in results if isinstance(r, ApiError)]
    assert len(winners) == 1 and len(losers) == 9
    assert all(e.code == 409 and e.reason == "AlreadyExists" for e in losers)


async def test_two_managers_with_election_take_turns(
    connect: Callable[[], Awaitable[EtcdStore]], prefix: str, in_process: OpenApi
) -> None:
    managers: list[ControllerManager] = []
    runs: list[asyncio.Task[None]] = []
    registry = Registry(await connect(), prefix=prefix)
    for identity in ("master-a", "master-b"):
        store = await connect()
        elector = EtcdLeaderElector(store, f"{prefix}leader", identity, ttl=3)
        api = await in_process(Registry(store, prefix=prefix))
        manager = ControllerManager(api, NetworkConfig.default(), elector, resync_period=None)
        managers.append(manager)
        runs.append(asyncio.create_task(manager.run()))
    try:
        leader = await eventually(lambda: next((m for m in managers if m.ready), None), 20)
        follower = next(m for m in managers if m is not leader)
        assert not follower.ready
        await create_nodes(registry, [f"ha-{i:03d}" for i in range(NODES)])
        allocated = await wait_for_subnets(registry, NODES)
        assert_distinct(allocated)
        await leader.stop()  # hand over: the follower must take the lease
        await eventually(lambda: follower.ready, timeout=15)
        await create_nodes(registry, [f"late-{i}" for i in range(5)], first=NODES)
        allocated = await wait_for_subnets(registry, NODES + 5)
        assert_distinct(allocated)
    finally:
        for manager in managers:
            await manager.stop()
        await asyncio.gather(*runs, return_exceptions=True)


# ---- leader election ---------------------------------------------------------------------


async def test_second_elector_waits_for_release(
    connect: Callable[[], Awaitable[EtcdStore]], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "podnet.controllers.leader")
    key = f"{prefix}leader"
    first = EtcdLeaderElector(await connect(), key, "first", ttl=3)
    # A 30 s ttl: the waiter's own re-check comes a ttl later, so only the watch can wake
    # it within the 10 s bound below.
    second = EtcdLeaderElector(await connect(), key, "second", ttl=30)
    await first.acquire()
    waiting = asyncio.create_task(second.acquire())
    await eventually(lambda: "second waits for leadership: first holds" in caplog.text)
    assert not waiting.done() and await second.holder() == "first"
    await first.release()
    await asyncio.wait_for(waiting, 10)  # woken by the watch, not by polling
    assert second.is_leader and await first.holder() == "second"
    await second.release()
    assert await first.holder() is None


async def test_a_dead_leaders_lease_expires(
    connect: Callable[[], Awaitable[EtcdStore]], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "podnet.controllers.leader")
    key = f"{prefix}leader"
    crashed = EtcdLeaderElector(await connect(), key, "crashed", ttl=2)
    await crashed.acquire()
    assert isinstance(crashed._keepalive, asyncio.Task)  # renewals on the event loop
    crashed._keepalive.cancel()  # the process "dies": no more renewals, no revoke
    crashed._lease_id = None
    heir = EtcdLeaderElector(await connect(), key, "heir", ttl=2)
    assert await heir.holder() == "crashed"  # its key outlives it until the lease expires
    await asyncio.wait_for(heir.acquire(), 10)
    assert "heir waits for leadership: crashed holds" in caplog.text  # it had to wait
    assert await heir.holder() == "heir"
    await heir.release()


async def test_a_leader_whose_key_is_taken_knows_it_lost(
    connect: Callable[[], Awaitable[EtcdStore]], prefix: str
) -> None:
    store = await connect()
    key = f"{prefix}leader"
    leader = EtcdLeaderElector(store, key, "leader", ttl=3)
    await leader.acquire()
    from podnet.store.base import Delete

    await store.commit([], [Delete(key)])  # an operator removes the key
    await asyncio.wait_for(leader.lost.wait(), 5)
    assert not leader.is_leader
    await leader.release()


async def test_a_leader_survives_one_renewal_that_times_out(
    connect: Callable[[], Awaitable[EtcdStore]], prefix: str
) -> None:
    store = await connect()
    leader = EtcdLeaderElector(store, f"{prefix}leader", "leader", ttl=10)
    await leader.acquire()
    client = store.client
    real = client.refresh_lease
    calls: list[str] = []

    async def refresh_once_hanging(lease_id: int) -> Any:
        calls.append("hang" if not calls else "ok")
        if len(calls) == 1:  # etcd (or the loop) too busy to answer this one in time
            await asyncio.Event().wait()
        return await real(lease_id)

    client.refresh_lease = refresh_once_hanging
    try:
        await eventually(lambda: len(calls) >= 2, 15, "a retry")
        await eventually(lambda: len(calls) >= 3, 15, "renewals after the retry")
        assert not leader.lost.is_set() and leader.is_leader
        assert await leader.holder() == "leader"
    finally:
        client.refresh_lease = real
        await leader.release()


async def test_renewals_off_the_event_loop_outlast_a_blocked_loop(
    connect: Callable[[], Awaitable[EtcdStore]], prefix: str, etcd_server: EtcdProcess
) -> None:
    store = await connect()
    own_connection = partial(EtcdStore, etcd_server.endpoint)
    leader = EtcdLeaderElector(store, f"{prefix}leader", "leader", 2, own_connection)
    await leader.acquire()
    try:
        time.sleep(4)  # the whole event loop stalls for twice the ttl (thousands of requests)
        assert await leader.holder() == "leader"  # the lease was renewed meanwhile
        await asyncio.sleep(0)  # a loss found during the stall would be delivered now
        assert not leader.lost.is_set() and leader.is_leader
    finally:
        await leader.release()
    assert await leader.holder() is None


# ---- supervision -------------------------------------------------------------------------


class EtcdTimingOut(NodeLifecycleController):
    """Node lifecycle with one more task: an etcd read that times out (as reads do under
    load) for the first ``timeouts`` instances once ``trigger`` is set."""

    timeouts = 0
    trigger = asyncio.Event()
    built: list[NodeLifecycleController] = []

    def __init__(self, api: ControllerApi) -> None:
        super().__init__(api)
        self.built.append(self)

    def background(self) -> list[tuple[Coroutine[Any, Any, Any], str]]:
        return [*super().background(), (self._read_etcd(), "etcd-reader")]

    async def _read_etcd(self) -> None:
        await self.trigger.wait()
        store = cast(InProcessApi, self.api).registry.store
        if type(self).timeouts > 0:
            type(self).timeouts -= 1
            async with asyncio.timeout(0):  # etcd does not answer in time
                await store.revision()
        await asyncio.Event().wait()


async def test_a_controller_failing_on_etcd_timeouts_restarts_alone_under_the_same_leader(
    etcd_server: EtcdProcess, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real master on real etcd: its node-lifecycle controller fails twice on an etcd
    timeout and restarts alone; the master keeps leadership, the other controllers keep
    their tasks and keep working, and /metrics counts the failures."""
    monkeypatch.setattr(EtcdTimingOut, "timeouts", 2)
    monkeypatch.setattr(EtcdTimingOut, "trigger", asyncio.Event())
    monkeypatch.setattr(EtcdTimingOut, "built", [])
    monkeypatch.setattr(manager_module, "NodeLifecycleController", EtcdTimingOut)
    options = MasterOptions(
        NetworkConfig.default(),
        etcd=etcd_server.endpoint,
        etcd_prefix=prefix,
        listen_port=0,
        state_dir=tmp_path / "master",
        identity="master-a",
    )
    master = Master(options)
    await master.start()
    try:
        manager = master.controllers
        assert manager is not None
        await eventually(lambda: manager.ready, 30)
        before = {c: c.tasks for c in manager.supervisor.controllers}
        del before[EtcdTimingOut.built[0]]
        EtcdTimingOut.trigger.set()
        await eventually(lambda: len(EtcdTimingOut.built) == 3 and manager.ready, 30)
        assert EtcdTimingOut.timeouts == 0
        assert {c: c.tasks for c in manager.supervisor.controllers if c in before} == before
        assert not any(task.done() for tasks in before.values() for task in tasks)
        assert await manager.elector.holder() == "master-a"  # type: ignore[attr-defined]
        async with async_client_for(options.kubeconfig_path) as client:
            metrics = (await client.get("/metrics")).text
            assert 'podnet_controller_errors_total{controller="node-lifecycle"} 2.0' in metrics
            created = await client.post("/api/v1/nodes", json=node("after-timeouts", 7))
            assert created.status_code == 201, created.text
        await eventually(lambda: subnets_include(master.registry, "after-timeouts"), 30)
    finally:
        await master.stop()


async def subnets_include(registry: Registry, name: str) -> bool:
    return name in await subnets(registry)
