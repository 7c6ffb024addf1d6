"""The agent's start-up wait for its HostSubnet and ClusterNetwork: a list and watch of
that one object (``fieldSelector=metadata.name=<name>``) with the node's own token,
against an in-process API server (TLS, real auth), never a GET poll."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest

from podnet.agent.agent import NodeAgent
from podnet.agent.config import AgentConfig, hostsubnet_problem
from podnet.agent.objectwait import ObjectWait, wait_for_object
from podnet.api.registry import Registry
from podnet.client.aio import AsyncApiClient
from podnet.client.errors import StatusError
from podnet.client.objectapi import Listing
from podnet.client.watch import ResourceVersion, WatchEvent
from podnet.dataplane.fake import FakeDataPlane
from podnet.kubeconfig import ClientConfig
from podnet.model.kinds import CLUSTER_NETWORK, EVENT, HOST_SUBNET, NAMESPACE, Kind
from podnet.testing.api import node_api_server

Obj = dict[str, Any]
NODE = "node-a"
NODE_IP = IPv4Address("192.0.2.10")
OWN = f"metadata.name={NODE}"
WAIT = 20.0  # seconds: a bound on each signal, never a pause
CLUSTER_NETWORK_OBJ = {
    "metadata": {"name": "default"},
    "clusterNetworks": [{"CIDR": "10.128.0.0/14", "hostSubnetLength": 8}],
    "serviceNetwork": "172.30.0.0/16",
    "pluginName": "redhat/openshift-ovs-subnet",
    "mtu": 1450,
    "vxlanPort": 4789,
}


class RecordingClient(AsyncApiClient):
    """The node's client, noting each call and each watch event, with signals to wait on."""

    def __init__(self, config: ClientConfig) -> None:
        super().__init__(config)
        self.calls: list[tuple[str, str, str]] = []  # (call, plural, fieldSelector)
        self.events: list[WatchEvent] = []  # what the master's watches sent
        self.watching = asyncio.Event()  # a watch is open
        self.watch_closed = asyncio.Event()
        self.arrived = asyncio.Condition()  # notified on every watch event

    async def list(
        self, kind: Kind, namespace: str | None = None, field_selector: str = ""
    ) -> Listing:
        self.calls.append(("list", kind.plural, field_selector))
        return await super().list(kind, namespace, field_selector)

    async def watch(
        self,
        kind: Kind,
        since: ResourceVersion,
        namespace: str | None = None,
        field_selector: str = "",
    ) -> AsyncIterator[WatchEvent]:
        self.calls.append(("watch", kind.plural, field_selector))
        try:
            stream = super().watch(kind, since, namespace, field_selector)
            self.watching.set()
            async for event in stream:
                async with self.arrived:
                    self.events.append(event)
                    self.arrived.notify_all()
                yield event
        finally:
            self.watch_closed.set()

    async def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        self.calls.append(("get", kind.plural, name))
        return await super().get(kind, namespace, name)

    async def event_for(self, name: str, change: str) -> None:
        """Wait until a watch delivered ``change`` of the object ``name``."""

        def seen() -> bool:
            return any(
                e.type == change and e.object["metadata"].get("name") == name for e in self.events
            )

        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(seen), WAIT)


@dataclass
class Api:
    registry: Registry
    node_config: ClientConfig
    clients: list[RecordingClient] = field(default_factory=list)

    def client(self) -> RecordingClient:
        client = RecordingClient(self.node_config)
        self.clients.append(client)
        return client

    async def put_hostsubnet(self, name: str, subnet: str | None, ip: str = str(NODE_IP)) -> Obj:
        body: Obj = {"metadata": {"name": name}, "host": name, "hostIP": ip, "subnet": subnet}
        if subnet is None:
            body["metadata"]["annotations"] = {"pod.network.openshift.io/assign-subnet": "true"}
        return await self.registry.create(HOST_SUBNET, body)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with node_api_server(tmp_path, NODE) as (registry, _, config):
        api = Api(registry, config)
        try:
            yield api
        finally:
            for client in api.clients:
                await client.close()


def own_hostsubnet(obj: Obj | None) -> str | None:
    return hostsubnet_problem(obj, NODE_IP)


async def test_the_subnet_comes_through_the_watch_after_the_wait_started(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="podnet.agent")
    client = api.client()
    wait = ObjectWait(client, HOST_SUBNET, NODE, own_hostsubnet, NODE)
    task = asyncio.create_task(wait.run())
    await asyncio.wait_for(client.watching.wait(), WAIT)  # listed, found nothing, watching
    assert "waiting for HostSubnet for node node-a (not created yet)" in caplog.text
    await api.put_hostsubnet("node-b", "10.128.1.0/24", "192.0.2.11")  # another node's
    await api.put_hostsubnet(NODE, None)  # created, the subnet not allocated yet
    await client.event_for(NODE, "ADDED")
    assert not task.done()
    assert wait.why == "no subnet assigned yet"
    current = await api.registry.get(HOST_SUBNET, None, NODE)
    await api.registry.update(HOST_SUBNET, {**current, "subnet": "10.128.0.0/24"}, None, NODE)
    hostsubnet = await asyncio.wait_for(task, WAIT)
    assert hostsubnet["subnet"] == "10.128.0.0/24"
    # One listing and watches of this HostSubnet alone: the master sent nothing of node-b
    # (its ADDED came before node-a's two events on the same watch), and no GET was asked.
    assert client.calls[0] == ("list", "hostsubnets", OWN)
    assert set(client.calls[1:]) == {("watch", "hostsubnets", OWN)}
    objects = [e.object for e in client.events if e.type != "BOOKMARK"]  # a bookmark has none
    assert {o["metadata"]["name"] for o in objects} == {NODE}
    assert [e.type for e in client.events if e.type != "BOOKMARK"] == ["ADDED", "MODIFIED"]
    await asyncio.wait_for(client.watch_closed.wait(), WAIT)  # the watch ends with the wait


async def test_a_usable_object_is_one_listing_and_no_watch(api: Api) -> None:
    await api.put_hostsubnet(NODE, "10.128.0.0/24")
    client = api.client()
    hostsubnet = await wait_for_object(client, HOST_SUBNET, NODE, own_hostsubnet, NODE)
    assert hostsubnet["subnet"] == "10.128.0.0/24"
    assert client.calls == [("list", "hostsubnets", OWN)]


async def test_a_wrong_host_ip_keeps_waiting_with_the_reason(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="podnet.agent")
    await api.put_hostsubnet(NODE, "10.128.0.0/24", "192.0.2.99")
    client = api.client()
    wait = ObjectWait(client, HOST_SUBNET, NODE, own_hostsubnet, NODE)
    task = asyncio.create_task(wait.run())
    await asyncio.wait_for(client.watching.wait(), WAIT)
    assert "(its hostIP is 192.0.2.99, not 192.0.2.10)" in caplog.text
    await api.registry.delete(HOST_SUBNET, None, NODE)
    await client.event_for(NODE, "DELETED")
    assert wait.why == "not created yet"
    await api.put_hostsubnet(NODE, "10.128.0.0/24")
    assert (await asyncio.wait_for(task, WAIT))["hostIP"] == str(NODE_IP)


async def test_stopping_while_waiting_closes_the_watch(api: Api) -> None:
    client = api.client()
    task = asyncio.create_task(wait_for_object(client, HOST_SUBNET, NODE, own_hostsubnet, NODE))
    await asyncio.wait_for(client.watching.wait(), WAIT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.watch_closed.is_set()


async def test_a_permanent_error_ends_the_wait(api: Api) -> None:
    client = api.client()  # a node may not read events: 403, not retried
    with pytest.raises(StatusError) as denied:
        await asyncio.wait_for(wait_for_object(client, EVENT, "e", lambda _: "no", NODE), WAIT)
    assert (denied.value.code, denied.value.reason) == (403, "Forbidden")
    assert client.calls == [("list", "events", "metadata.name=e")]


async def test_the_agent_gets_its_subnet_through_the_watch(
    api: Api, tmp_path: Path, no_compiler: None
) -> None:
    await api.registry.create(NAMESPACE, {"metadata": {"name": "default"}})
    await api.registry.create(CLUSTER_NETWORK, json.loads(json.dumps(CLUSTER_NETWORK_OBJ)))
    config = AgentConfig(
        node_name=NODE,
        node_ip=NODE_IP,
        cni_bin_dir=tmp_path / "bin",
        cni_conf_dir=tmp_path / "conf",
        socket_path=tmp_path / "run" / "cni.sock",
        state_dir=tmp_path / "state",
        ipam_dir=tmp_path / "ipam",
    )
    client = api.client()
    agent = NodeAgent(config, FakeDataPlane(), client, NODE_IP)
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(client.watching.wait(), WAIT)  # registered, waiting
        assert not agent.serving.is_set()
        await api.put_hostsubnet(NODE, "10.128.0.0/24")
        await asyncio.wait_for(agent.serving.wait(), WAIT)
        assert agent.node is not None and str(agent.node.subnet) == "10.128.0.0/24"
    finally:
        stop.set()
        await asyncio.wait_for(running, WAIT)
    waits = [c for c in client.calls if c[2].startswith("metadata.name=")]
    assert waits[:2] == [("list", "hostsubnets", OWN), ("watch", "hostsubnets", OWN)]
    assert ("list", "clusternetworks", "metadata.name=default") in waits
    assert not [c for c in client.calls if c[0] == "get" and c[1] == "hostsubnets"]
