"""The node agent's pods: PodManager over FakeDataPlane + real host-local IPAM, the Pod
status writer and the agent's start order against an in-process API server (TLS)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from pathlib import Path
from typing import Any

import pytest

from podnet.agent import cnierrors, cniserver
from podnet.agent.agent import NodeAgent
from podnet.agent.config import AgentConfig
from podnet.agent.podcleanup import plan_gc, plan_restart_cleanup
from podnet.agent.pods import PodManager
from podnet.agent.podstatus import MIRROR_ANNOTATION, PodRef, PodStatusWriter, pod_ref
from podnet.api.params import DeleteOptions
from podnet.api.registry import Registry
from podnet.api.server import ApiServer
from podnet.client.aio import AsyncApiClient
from podnet.client.errors import error_from_status
from podnet.cni.types import CniError, CniRequest, parse_request
from podnet.dataplane.fake import FakeDataPlane
from podnet.dataplane.interface import (
    DataPlaneError,
    NodeNetwork,
    NodeSetupRefused,
    PodAttachment,
    RemoteNode,
)
from podnet.ipam.hostlocal import HostLocalStore
from podnet.kubeconfig import ClientConfig
from podnet.model.errors import ApiError
from podnet.model.kinds import CLUSTER_NETWORK, HOST_SUBNET, NAMESPACE, NODE, POD
from podnet.model.schemas_names import dns_subdomain_problem
from podnet.testing.api import node_api_server
from podnet.testing.e2e import eventually

Obj = dict[str, Any]
NODE_NAME = "node-a"
NODE_IP = IPv4Address("192.0.2.10")
CLUSTER = IPv4Network("10.128.0.0/14")


def node_network(subnet: str = "10.128.0.0/24") -> NodeNetwork:
    return NodeNetwork(
        NODE_NAME, NODE_IP, IPv4Network(subnet), (CLUSTER,), IPv4Network("172.30.0.0/16"), 1450
    )


def cni(
    command: str,
    cid: str = "c1",
    ifname: str = "eth0",
    netns: str | None = "/var/run/netns/p",
    args: str = "",
    version: str = "1.0.0",
    **config: Any,
) -> CniRequest:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": ifname}
    env |= {"CNI_ARGS": args} | ({"CNI_NETNS": netns} if netns is not None else {})
    text = json.dumps({"cniVersion": version, "name": "podnet", "type": "podnet", **config})
    return parse_request(json.dumps({"env": env, "config": text}))


async def make_manager(tmp_path: Path, subnet: str = "10.128.0.0/24") -> PodManager:
    node = node_network(subnet)
    dataplane = FakeDataPlane()
    await dataplane.setup_node(node)
    manager = PodManager(dataplane, HostLocalStore(tmp_path / "ipam", "podnet"), node)
    manager.ready = True
    return manager


def fake(manager: PodManager) -> FakeDataPlane:
    assert isinstance(manager.dataplane, FakeDataPlane)
    return manager.dataplane


def ip_files(manager: PodManager) -> list[str]:
    return sorted(p.name for p in manager.store.path.iterdir() if p.name[0].isdigit())


async def code_of(call: Awaitable[object]) -> int:
    with pytest.raises(CniError) as info:
        await call
    return info.value.code


@pytest.fixture
async def manager(tmp_path: Path) -> PodManager:
    return await make_manager(tmp_path)


# ---- pure parts ------------------------------------------------------------------------


def test_pod_ref_from_args_config_or_container_id() -> None:
    args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=front"
    assert pod_ref(cni("ADD", args=args), "default") == PodRef("web", "front")
    assert pod_ref(cni("ADD", cid="abc-1.2"), "dflt") == PodRef("dflt", "abc-1.2")
    assert pod_ref(cni("ADD", namespace="team"), "dflt") == PodRef("team", "c1")


@pytest.mark.parametrize(
    "given",
    ["elegant_turing", "Web", "a..b", "-x-", "x" * 300, "ümlaut", "a.-b", "_", "web_1"],
)
def test_an_invalid_pod_name_from_a_runtime_is_made_valid_and_kept_apart(given: str) -> None:
    """podman passes its container's name as K8S_POD_NAME; its random names hold "_"."""
    made = pod_ref(cni("ADD", args=f"K8S_POD_NAME={given}"), "default").name
    assert dns_subdomain_problem(made) is None, made
    other = given.replace("_", "-") if "_" in given else given + "_"
    assert pod_ref(cni("ADD", args=f"K8S_POD_NAME={other}"), "default").name != made
    assert pod_ref(cni("ADD", args=f"K8S_POD_NAME={given}"), "default").name == made  # stable


def attachment(cid: str, ip: str, ifname: str = "eth0") -> PodAttachment:
    address = IPv4Interface(ip)
    return PodAttachment(cid, f"v{cid}", ifname, "", "/ns", address, IPv4Address("10.128.0.1"), 1)


def test_restart_cleanup_keeps_healthy_pods_only() -> None:
    subnet = IPv4Network("10.128.0.0/24")
    attachments = [
        attachment("ok", "10.128.0.2/24"),
        attachment("legacy", "10.128.0.3/24"),
        attachment("no-ip-file", "10.128.0.4/24"),
        attachment("other-subnet", "10.129.0.5/24"),
        attachment("wrong-ip", "10.128.0.6/24"),
    ]
    ip = IPv4Address
    allocations = [
        (ip("10.128.0.2"), "ok", "eth0"),
        (ip("10.128.0.3"), "legacy", ""),
        (ip("10.129.0.5"), "other-subnet", "eth0"),
        (ip("10.128.0.7"), "wrong-ip", "eth0"),
        (ip("10.128.0.8"), "orphan", "eth0"),
    ]
    plan = plan_restart_cleanup(attachments, allocations, subnet)
    assert [a.container_id for a in plan.healthy] == ["ok", "legacy"]
    assert [a.container_id for a in plan.detach] == ["no-ip-file", "other-subnet", "wrong-ip"]
    assert plan.release == [("orphan", "eth0"), ("other-subnet", "eth0"), ("wrong-ip", "eth0")]


def test_gc_plan_removes_what_is_not_valid() -> None:
    attachments = [attachment("a", "10.128.0.2/24"), attachment("b", "10.128.0.3/24")]
    allocations = [(IPv4Address("10.128.0.2"), "a", "eth0"), (IPv4Address("10.128.0.9"), "c", "")]
    plan = plan_gc(attachments, allocations, lambda cid, ifname: cid == "a")
    assert [a.container_id for a in plan.detach] == ["b"]
    assert plan.release == [("c", "")]


# ---- ADD / DEL / CHECK / GC / STATUS ------------------------------------------------------


async def test_add_allocates_wires_and_answers(manager: PodManager) -> None:
    result = await manager.handle(cni("ADD", args="K8S_POD_NAMESPACE=a;K8S_POD_NAME=b"))
    assert result is not None
    assert [ip.address for ip in result.ips] == ["10.128.0.2/24"]
    assert result.ips[0].gateway == "10.128.0.1" and result.ips[0].interface == 1
    gw = "10.128.0.1"
    assert [(r.dst, r.gw) for r in result.routes] == [("0.0.0.0/0", gw), ("10.128.0.0/14", gw)]
    pod_side = result.interfaces[1]
    assert (pod_side.name, pod_side.mac, pod_side.sandbox) == (
        "eth0",
        "0a:58:0a:80:00:02",
        "/var/run/netns/p",
    )
    assert ip_files(manager) == ["10.128.0.2"]
    assert list(fake(manager).state.pods) == [("c1", "eth0")]


async def test_add_of_an_existing_interface_fails_and_keeps_the_pod(manager: PodManager) -> None:
    await manager.handle(cni("ADD"))
    assert await code_of(manager.handle(cni("ADD"))) == cnierrors.ERR_DATAPLANE
    assert ip_files(manager) == ["10.128.0.2"]
    assert list(fake(manager).state.pods) == [("c1", "eth0")]


async def test_failed_attach_releases_the_address(manager: PodManager) -> None:
    fake(manager).fail_next["attach_pod"] = DataPlaneError("veth creation failed")
    assert await code_of(manager.handle(cni("ADD"))) == cnierrors.ERR_DATAPLANE
    assert ip_files(manager) == []
    assert fake(manager).calls[-1] == "detach_pod"  # partial wiring undone too
    assert (await manager.handle(cni("ADD"))) is not None  # and the address is free again


async def test_exhaustion_is_code_102_with_the_ipam_message(tmp_path: Path) -> None:
    manager = await make_manager(tmp_path, "10.128.0.0/29")
    for i in range(5):
        await manager.handle(cni("ADD", cid=f"c{i}"))
    with pytest.raises(CniError) as info:
        await manager.handle(cni("ADD", cid="c5"))
    assert info.value.code == 102
    assert info.value.msg == "no IP addresses available in range set: 10.128.0.1-10.128.0.6"
    assert await code_of(manager.handle(cni("STATUS", version="1.1.0"))) == 50
    await manager.handle(cni("DEL", cid="c0"))
    assert await manager.handle(cni("STATUS", version="1.1.0")) is None


async def test_status_before_set_up_is_51(manager: PodManager) -> None:
    manager.ready = False
    assert await code_of(manager.handle(cni("STATUS", version="1.1.0"))) == 51


async def test_del_is_idempotent_and_needs_no_netns(manager: PodManager) -> None:
    await manager.handle(cni("ADD"))
    assert await manager.handle(cni("DEL", netns=None)) is None
    assert await manager.handle(cni("DEL", netns="")) is None
    assert await manager.handle(cni("DEL", cid="never-added")) is None
    assert ip_files(manager) == [] and fake(manager).state.pods == {}


async def test_check_compares_with_prev_result(manager: PodManager) -> None:
    result = await manager.handle(cni("ADD"))
    assert result is not None
    prev = {"ips": [{"address": result.ips[0].address}], "interfaces": [{"name": "eth0"}]}
    assert await manager.handle(cni("CHECK", prevResult=prev)) is None
    wrong = {"ips": [{"address": "10.128.0.9/24"}]}
    assert await code_of(manager.handle(cni("CHECK", prevResult=wrong))) == cnierrors.ERR_CHECK
    assert await code_of(manager.handle(cni("CHECK"))) == 7
    missing = cni("CHECK", cid="other", prevResult=prev)
    assert await code_of(manager.handle(missing)) == cnierrors.ERR_CHECK


async def test_gc_removes_every_unlisted_attachment(manager: PodManager) -> None:
    for cid in ("keep", "drop"):
        await manager.handle(cni("ADD", cid=cid))
    (manager.store.path / "10.128.0.50").write_text("legacy-orphan")  # ID-only file
    valid = [{"containerID": "keep", "ifname": "eth0"}]
    gc = cni("GC", version="1.1.0", **{"cni.dev/valid-attachments": valid})
    assert await manager.handle(gc) is None
    assert list(fake(manager).state.pods) == [("keep", "eth0")]
    assert ip_files(manager) == ["10.128.0.2"]


async def test_gc_spares_a_container_being_added(manager: PodManager) -> None:
    gate, wiring = asyncio.Event(), asyncio.Event()
    attach = fake(manager).attach_pod

    async def slow_attach(pod: Any) -> Any:
        wiring.set()
        await gate.wait()  # the ADD is in progress: the runtime cannot list it yet
        return await attach(pod)

    fake(manager).attach_pod = slow_attach  # type: ignore[method-assign]
    adding = asyncio.create_task(manager.handle(cni("ADD", cid="in-flight")))
    await asyncio.wait_for(wiring.wait(), 10)
    gc = cni("GC", version="1.1.0", **{"cni.dev/valid-attachments": []})
    await manager.handle(gc)
    assert ip_files(manager) == ["10.128.0.2"]
    gate.set()
    await asyncio.wait_for(adding, 10)
    assert list(fake(manager).state.pods) == [("in-flight", "eth0")]


async def test_gc_removes_an_answered_add_whose_bookkeeping_holds_its_lock(
    manager: PodManager,
) -> None:
    """The lock an answered ADD's background work holds (its mirror Pod's record) makes GC
    wait for it, not keep the sandbox (it was kept until the next GC before)."""
    await manager.handle(cni("ADD", cid="answered"))
    release = asyncio.Event()

    async def bookkeeping() -> None:
        async with manager.locks.hold("answered"):
            await release.wait()

    held = asyncio.create_task(bookkeeping())
    await asyncio.sleep(0)
    gc = asyncio.create_task(
        manager.handle(cni("GC", version="1.1.0", **{"cni.dev/valid-attachments": []}))
    )
    await asyncio.sleep(0.05)
    release.set()
    await asyncio.wait_for(asyncio.gather(held, gc), 10)
    assert list(fake(manager).state.pods) == [] and ip_files(manager) == []


async def test_reconcile_cleans_half_done_pods_and_keeps_healthy_ones(tmp_path: Path) -> None:
    first = await make_manager(tmp_path)
    for cid in ("healthy", "no-ip-file"):
        await first.handle(cni("ADD", cid=cid))
    first.store.release("no-ip-file", "eth0")  # e.g. killed between the two steps
    await asyncio.to_thread(first.store.allocate, "orphan", "eth0", first._range_sets)
    restarted = PodManager(fake(first), HostLocalStore(tmp_path / "ipam", "podnet"), first.node)
    fake(first).calls.clear()
    plan = await restarted.reconcile()
    assert [a.container_id for a in plan.healthy] == ["healthy"]
    assert fake(first).calls == ["attached_pods", "detach_pod"]  # only the broken one
    assert list(fake(first).state.pods) == [("healthy", "eth0")]
    assert ip_files(restarted) == ["10.128.0.2"]
    assert await code_of(restarted.handle(cni("ADD", cid="healthy"))) == cnierrors.ERR_DATAPLANE


async def test_many_adds_and_dels_leave_nothing(manager: PodManager) -> None:
    """200 pods in and out through the server's answer path; their latency is measured in
    bench/bench_latencies.py (--only cni), not asserted here."""
    server = cniserver.CniServer(Path("/nonexistent.sock"), manager)
    for i in range(200):
        status, _ = await server.answer(cni("ADD", cid=f"c{i}", args=f"K8S_POD_NAME=p{i}"))
        assert status == 200
    assert len(ip_files(manager)) == 200 and len(fake(manager).state.pods) == 200
    for i in range(200):
        assert (await server.answer(cni("DEL", cid=f"c{i}")))[0] == 200
    assert ip_files(manager) == [] and fake(manager).state.pods == {}


# ---- against an in-process API server ------------------------------------------------------


@dataclass
class Api:
    """An in-process API server (memory store, TLS, real auth) and the node's client."""

    registry: Registry
    server: ApiServer
    node_config: ClientConfig

    def client(self) -> AsyncApiClient:
        return AsyncApiClient(self.node_config)

    async def put_hostsubnet(self, name: str, subnet: str | None, ip: str) -> None:
        body: Obj = {"metadata": {"name": name}, "host": name, "hostIP": ip, "subnet": subnet}
        if subnet is None:
            body["metadata"]["annotations"] = {"pod.network.openshift.io/assign-subnet": "true"}
        await self.registry.create(HOST_SUBNET, body)

    async def node(self) -> Obj | None:
        try:
            return await self.registry.get(NODE, None, NODE_NAME)
        except ApiError:
            return None

    async def pod(self, name: str) -> Obj | None:
        try:
            return await self.registry.get(POD, "default", name)
        except ApiError:
            return None


CLUSTER_NETWORK_OBJ = {
    "metadata": {"name": "default"},
    "clusterNetworks": [{"CIDR": "10.128.0.0/14", "hostSubnetLength": 8}],
    "serviceNetwork": "172.30.0.0/16",
    "pluginName": "redhat/openshift-ovs-subnet",
    "mtu": 1450,
    "vxlanPort": 4789,
}


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with node_api_server(tmp_path, NODE_NAME) as (registry, server, config):
        await registry.create(NAMESPACE, {"metadata": {"name": "default"}})
        await registry.create(CLUSTER_NETWORK, json.loads(json.dumps(CLUSTER_NETWORK_OBJ)))
        yield Api(registry, server, config)


async def test_status_writer_creates_the_pod_then_clears_its_ip(api: Api) -> None:
    # A node may only give its pods addresses from its own HostSubnet (admission).
    await api.put_hostsubnet(NODE_NAME, "10.128.0.0/24", str(NODE_IP))
    client = api.client()
    writer = PodStatusWriter(client, NODE_NAME, NODE_IP)
    ref = PodRef("default", "web-1")
    writer.running(ref, IPv4Address("10.128.0.2"), "cid-1")
    await writer.flush(10)
    pod = await api.pod("web-1")
    assert pod is not None and pod["spec"]["nodeName"] == NODE_NAME
    assert pod["status"] == {
        "phase": "Running",
        "podIP": "10.128.0.2",
        "podIPs": [{"ip": "10.128.0.2"}],
        "hostIP": str(NODE_IP),
    }
    writer.released(ref, IPv4Address("10.128.0.99"))  # not its IP: nothing to clear
    writer.released(ref, IPv4Address("10.128.0.2"))
    await writer.flush(10)
    pod = await api.pod("web-1")
    assert pod is not None and "podIP" not in pod["status"]
    await client.close()


async def test_status_writer_respects_the_binding_and_the_newest_ip(api: Api) -> None:
    # A node may only give its pods addresses from its own HostSubnet (admission).
    await api.put_hostsubnet(NODE_NAME, "10.128.0.0/24", str(NODE_IP))
    client = api.client()
    writer = PodStatusWriter(client, NODE_NAME, NODE_IP)
    spec = {"containers": [{"name": "c"}]}
    await api.registry.create(
        POD, {"metadata": {"name": "elsewhere"}, "spec": {**spec, "nodeName": "b"}}, "default"
    )
    await api.registry.create(
        POD, {"metadata": {"name": "mine"}, "spec": {**spec, "nodeName": NODE_NAME}}, "default"
    )
    writer.running(PodRef("default", "elsewhere"), IPv4Address("10.128.0.5"), "x")
    writer.running(PodRef("default", "mine"), IPv4Address("10.128.0.6"), "old")
    writer.running(PodRef("default", "mine"), IPv4Address("10.128.0.7"), "new")
    writer.released(PodRef("default", "mine"), IPv4Address("10.128.0.6"))  # the old sandbox
    await writer.flush(10)
    elsewhere, mine = await api.pod("elsewhere"), await api.pod("mine")
    assert elsewhere is not None and "status" not in elsewhere
    assert mine is not None and mine["status"]["podIP"] == "10.128.0.7"
    await client.close()


async def test_add_with_an_unreachable_master_is_try_again_later(tmp_path: Path) -> None:
    """Issue 8: without the API (master down, etcd without quorum) an ADD answers CNI
    code 11 and wires nothing; the runtime retries it later."""
    manager = await make_manager(tmp_path)
    client = AsyncApiClient(ClientConfig("https://127.0.0.1:9"), timeout=1.0)
    manager.status_writer = PodStatusWriter(client, NODE_NAME, NODE_IP, deadline=1.0)
    with pytest.raises(CniError) as caught:
        await manager.handle(cni("ADD", args="K8S_POD_NAME=p"))
    assert caught.value.code == 11
    assert "API server is unavailable" in caught.value.msg
    assert not await manager.dataplane.attached_pods()
    await client.close()


def agent_config(tmp_path: Path, resync: float = 30.0) -> AgentConfig:
    return AgentConfig(
        node_name=NODE_NAME,
        node_ip=NODE_IP,
        cni_bin_dir=tmp_path / "bin",
        cni_conf_dir=tmp_path / "conf",
        socket_path=tmp_path / "run" / "cni.sock",
        state_dir=tmp_path / "state",
        ipam_dir=tmp_path / "ipam",
        resync_period=resync,
    )


@pytest.fixture(autouse=True)
def stand_in_plugin(no_compiler: None) -> None:
    """Every test here runs with the stand-in CNI plugin (tests/unit/conftest.py)."""


class RunningAgent:
    """A NodeAgent running in this loop until ``stop``."""

    def __init__(self, api: Api, config: AgentConfig, dataplane: FakeDataPlane) -> None:
        self.agent = NodeAgent(config, dataplane, api.client(), NODE_IP)
        self.stopped = asyncio.Event()
        self.task = asyncio.create_task(self.agent.run(self.stopped))

    async def serving(self) -> None:
        await asyncio.wait_for(self.agent.serving.wait(), 20)

    async def stop(self) -> None:
        self.stopped.set()
        await asyncio.wait_for(self.task, 20)


async def ready_condition(api: Api) -> str | None:
    node = await api.node() or {}
    conditions = (node.get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), None)


async def test_agent_start_order_and_a_restart_that_touches_nothing(
    api: Api, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="podnet.agent")
    config = agent_config(tmp_path)
    state = tmp_path / "state" / "fake.json"
    first = RunningAgent(api, config, FakeDataPlane(state))
    node = await eventually(api.node)
    assert {"type": "InternalIP", "address": str(NODE_IP)} in node["status"]["addresses"]
    await eventually(lambda: "waiting for HostSubnet for node node-a" in caplog.text)
    assert not first.agent.serving.is_set()
    await api.put_hostsubnet(NODE_NAME, "10.128.0.0/24", str(NODE_IP))
    await first.serving()
    assert await eventually(lambda: ready_condition(api)) == "True"
    assert (config.socket_path.stat().st_mode & 0o777) == 0o600
    assert (config.socket_path.parent.stat().st_mode & 0o777) == 0o700
    conflist = json.loads(config.conflist_path.read_text())
    assert conflist["plugins"][0] == {
        "type": "podnet",
        "socketPath": str(config.socket_path),
        "mtu": 1450,
    }
    assert conflist["plugins"][1]["type"] == "portmap"
    assert first.agent.pods is not None
    await first.agent.pods.handle(cni("ADD", args="K8S_POD_NAME=kept"))
    await first.stop()
    assert not config.socket_path.exists()
    conflist_mtime = config.conflist_path.stat().st_mtime_ns

    dataplane = FakeDataPlane(state)
    second = RunningAgent(api, config, dataplane)
    await second.serving()
    await second.stop()
    assert dataplane.count("setup_node") == 1
    assert "detach_pod" not in dataplane.calls and "attach_pod" not in dataplane.calls
    assert list(dataplane.state.pods) == [("c1", "eth0")]
    assert config.conflist_path.stat().st_mtime_ns == conflist_mtime
    log = caplog.text
    assert log.count("data plane in place; not touching it") == 1
    for earlier, later in [
        ("registered node node-a", "waiting for HostSubnet"),
        ("waiting for HostSubnet", "data plane needs set-up"),
        ("data plane set up", "pods attached and healthy"),
        ("pods attached and healthy", "CNI plugin installed"),
        ("CNI config", "node node-a ready"),
    ]:
        assert log.index(earlier) < log.index(later)
    pod = await api.pod("kept")
    assert pod is not None and pod["status"]["podIP"] == "10.128.0.2"


async def test_agent_stops_while_waiting_for_its_subnet(api: Api, tmp_path: Path) -> None:
    dataplane = FakeDataPlane()
    running = RunningAgent(api, agent_config(tmp_path), dataplane)
    await eventually(api.node)
    await running.stop()
    assert dataplane.calls == ["close"]


async def test_agent_syncs_remote_nodes_and_repairs_drift(
    api: Api, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await api.put_hostsubnet(NODE_NAME, "10.128.0.0/24", str(NODE_IP))
    await api.put_hostsubnet("node-b", "10.128.1.0/24", "192.0.2.11")
    dataplane = FakeDataPlane()
    running = RunningAgent(api, agent_config(tmp_path, resync=0.3), dataplane)
    await running.serving()

    def remotes_are(*names: str) -> Callable[[], bool]:
        return lambda: sorted(dataplane.state.remotes) == list(names)

    await eventually(remotes_are("node-b"))
    await api.put_hostsubnet("node-c", "10.128.2.0/24", "192.0.2.12")
    await api.put_hostsubnet("pending", None, "192.0.2.13")  # no subnet yet: skipped
    await eventually(remotes_are("node-b", "node-c"))
    await api.registry.delete(HOST_SUBNET, None, "node-b")
    await eventually(remotes_are("node-c"))
    dataplane.drift_remove_remote("node-c")  # "a route deleted by hand"
    await eventually(lambda: "node-c" in dataplane.state.remotes)
    dataplane.drift_version_note()  # the node set-up itself drifted
    await eventually(lambda: dataplane.calls.count("setup_node") == 2)
    with caplog.at_level(logging.WARNING):
        changed = {**CLUSTER_NETWORK_OBJ, "mtu": 1400}
        current = await api.registry.get(CLUSTER_NETWORK, None, "default")
        await api.registry.update(
            CLUSTER_NETWORK, {**changed, "metadata": current["metadata"]}, None, "default"
        )
        await eventually(lambda: "ClusterNetwork changed (mtu: 1450 -> 1400)" in caplog.text)
    await running.stop()
    assert "remove node-b" in dataplane.remote_changes


class RefusingDataPlane(FakeDataPlane):
    """A backend that, like host-gw with a node on another L2 segment, refuses remotes."""

    async def sync_remote_nodes(self, node: NodeNetwork, remotes: list[RemoteNode]) -> None:
        if remotes:
            raise NodeSetupRefused(f"host-gw: node {remotes[0].name} is not on this L2 segment")
        await super().sync_remote_nodes(node, remotes)


async def test_agent_refuses_to_start_when_remote_nodes_are_refused(
    api: Api, tmp_path: Path
) -> None:
    config = agent_config(tmp_path)
    await api.put_hostsubnet(NODE_NAME, "10.128.0.0/24", str(NODE_IP))
    await api.put_hostsubnet("far-away", "10.128.1.0/24", "203.0.113.9")
    running = RunningAgent(api, config, RefusingDataPlane())
    with pytest.raises(NodeSetupRefused, match="far-away"):
        await asyncio.wait_for(running.task, 20)
    assert not running.agent.serving.is_set()
    assert not config.socket_path.exists()


class RecordingWriter:
    """Stands in for PodStatusWriter: the status wishes a manager makes."""

    def __init__(self) -> None:
        self.running_calls: list[tuple[PodRef, str, str]] = []

    def running(self, ref: PodRef, ip: IPv4Address, container_id: str, create: bool = True) -> None:
        self.running_calls.append((ref, str(ip), container_id))

    def released(
        self, ref: PodRef, ip: IPv4Address | None, container_id: str = "", gone: bool = False
    ) -> None:
        pass

    async def check_api(self, ref: PodRef) -> None:
        pass


async def test_a_restarted_agent_writes_the_status_a_killed_one_left_pending(
    tmp_path: Path,
) -> None:
    """Found by the chaos test: the agent answers ADD, then writes the Pod's IP in the
    background; killed in between, the restarted agent must write it again."""
    from podnet.agent.podrefs import PodRefs

    first = await make_manager(tmp_path)
    first.refs = PodRefs(tmp_path / "pods")
    await first.handle(cni("ADD", cid="web", args="K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1"))
    await first.handle(cni("ADD", cid="gone"))
    await first.handle(cni("DEL", cid="gone"))  # its record goes with it
    writer = RecordingWriter()
    restarted = PodManager(
        fake(first),
        HostLocalStore(tmp_path / "ipam", "podnet"),
        first.node,
        writer,  # type: ignore[arg-type]
        refs=PodRefs(tmp_path / "pods"),
    )
    await restarted.reconcile()
    assert writer.running_calls == [(PodRef("shop", "web-1"), "10.128.0.2", "web")]
    await restarted.handle(cni("DEL", cid="web"))
    assert list((tmp_path / "pods").iterdir()) == []


def test_pod_records_survive_only_whole(tmp_path: Path) -> None:
    from podnet.agent.podrefs import PodRefs

    refs = PodRefs(tmp_path / "pods")
    refs.record(("c1", "eth0"), ("ns", "p1"))
    refs.record(("c2", "net1"), ("ns", "p2"))
    (tmp_path / "pods" / "torn.json").write_text('{"containerID": "c3", "ifn')
    (tmp_path / "pods" / ".x.json.tmp").write_text("{}")  # killed mid-write
    assert refs.load() == {("c1", "eth0"): ("ns", "p1"), ("c2", "net1"): ("ns", "p2")}
    assert len(list((tmp_path / "pods").iterdir())) == 2  # damaged ones removed
    refs.forget(("c1", "eth0"))
    refs.forget(("c1", "eth0"))
    assert refs.load() == {("c2", "net1"): ("ns", "p2")}


async def test_status_writer_never_writes_running_over_a_finished_pod(api: Api) -> None:
    """The runtime wrote the pod Failed (its process ended): a later running write of the
    agent (a resync, an ADD retried) keeps the phase and only fixes the addresses."""
    await api.put_hostsubnet(NODE_NAME, "10.128.0.0/24", str(NODE_IP))
    spec = {"containers": [{"name": "c"}], "nodeName": NODE_NAME}
    await api.registry.create(POD, {"metadata": {"name": "ended"}, "spec": spec}, "default")
    current = await api.registry.get(POD, "default", "ended")
    current["status"] = {"phase": "Failed", "podIP": "10.128.0.8", "podIPs": [{"ip": "10.128.0.8"}]}
    await api.registry.update(POD, current, "default", "ended", "status")
    client = api.client()
    writer = PodStatusWriter(client, NODE_NAME, NODE_IP)
    writer.running(PodRef("default", "ended"), IPv4Address("10.128.0.9"), "cid")
    await writer.flush(10)
    pod = await api.pod("ended")
    assert pod is not None and pod["status"]["phase"] == "Failed"
    assert pod["status"]["podIP"] == "10.128.0.9" and pod["status"]["hostIP"] == str(NODE_IP)
    await client.close()


async def test_a_retried_status_write_never_recreates_a_deleted_pod(api: Api) -> None:
    """Finding 10: a status write retried after ``podnet pod delete`` removed the Pod
    re-created it (as a mirror Pod). The writer remembers the uid it saw; with the Pod
    gone, a retry writes nothing, and a Pod re-created under the name is not written."""
    await api.put_hostsubnet(NODE_NAME, "10.128.0.0/24", str(NODE_IP))
    spec = {"containers": [{"name": "c"}], "nodeName": NODE_NAME}
    await api.registry.create(POD, {"metadata": {"name": "web"}, "spec": spec}, "default")
    client = api.client()
    real_patch = client.patch
    calls = 0

    async def patch_after_delete(*args: Any, **kwargs: Any) -> Obj:
        nonlocal calls
        calls += 1
        if calls == 1:  # the Pod is deleted while the write is on its way: it conflicts
            await api.registry.delete(POD, "default", "web", options=DeleteOptions(None, None, 0))
            raise error_from_status("the object has been modified", 409, "Conflict")
        return await real_patch(*args, **kwargs)

    client.patch = patch_after_delete  # type: ignore[method-assign]
    writer = PodStatusWriter(client, NODE_NAME, NODE_IP)
    writer.running(PodRef("default", "web"), IPv4Address("10.128.0.2"), "cid-1")
    await writer.flush(10)
    assert calls == 1 and await api.pod("web") is None  # the retry created nothing
    await api.registry.create(POD, {"metadata": {"name": "web"}, "spec": spec}, "default")
    writer.running(PodRef("default", "web"), IPv4Address("10.128.0.2"), "cid-1", create=False)
    await writer.flush(10)
    again = await api.pod("web")
    assert again is not None and "status" not in again  # another uid: not this ADD's Pod
    await client.close()


async def test_a_mirror_pod_goes_when_its_sandbox_goes(tmp_path: Path, api: Api) -> None:
    await api.put_hostsubnet(NODE_NAME, "10.128.0.0/24", str(NODE_IP))
    manager = await make_manager(tmp_path)
    client = api.client()
    manager.status_writer = PodStatusWriter(client, NODE_NAME, NODE_IP)
    await manager.handle(cni("ADD", cid="cid-m", args="K8S_POD_NAME=mirror"))
    await manager.status_writer.flush(10)
    made = await api.pod("mirror")
    assert made is not None and made["metadata"]["annotations"][MIRROR_ANNOTATION] == "cid-m"
    await manager.handle(cni("DEL", cid="cid-m", args="K8S_POD_NAME=mirror"))
    await manager.status_writer.flush(10)
    assert await api.pod("mirror") is None
    await client.close()
