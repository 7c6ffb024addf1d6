"""``ServiceSync`` with the node's own token against an in-process API server (TLS, real
authorization, the stored objects' real shapes): what the API holds reaches the data
plane, and follows endpoint and service changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest

from podnet.agent.services import ServiceSync, pacing
from podnet.api.registry import Registry
from podnet.client.aio import AsyncApiClient
from podnet.client.reflector import Reflectors
from podnet.dataplane.fake import FakeDataPlane
from podnet.model.kinds import ENDPOINT_SLICE, HOST_SUBNET, NAMESPACE, SERVICE
from podnet.services.model import Endpoint
from podnet.testing.api import node_api_client
from podnet.testing.e2e import eventually
from podnet.testing.nodenetwork import node_network

Obj = dict[str, Any]
NODE = node_network("node-a", "192.0.2.10", "10.128.0.0/23")


def service() -> Obj:
    spec = {
        "type": "NodePort",
        "clusterIP": "172.30.0.10",
        "selector": {"app": "web"},
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}],
    }
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": spec}


def endpoint_slice(*ips: str) -> Obj:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": [ip], "conditions": {"ready": True}, "nodeName": "node-a"} for ip in ips
        ],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[Registry, AsyncApiClient]]:
    async with node_api_client(tmp_path, NODE.node_name, AsyncApiClient) as (registry, client):
        yield registry, client


async def test_services_and_slices_from_the_api_reach_the_data_plane(
    api: tuple[Registry, AsyncApiClient],
) -> None:
    registry, client = api
    await registry.create(NAMESPACE, {"metadata": {"name": "default"}})
    hostsubnet = {"metadata": {"name": "node-a"}, "host": "node-a", "hostIP": "192.0.2.10"}
    await registry.create(HOST_SUBNET, {**hostsubnet, "subnet": "10.128.0.0/23"})
    await registry.create(SERVICE, service(), "default")
    await registry.create(ENDPOINT_SLICE, endpoint_slice("10.128.0.5"), "default")
    plane = FakeDataPlane()
    await plane.setup_node(NODE)
    sync = ServiceSync(Reflectors(client), plane, NODE, pacing(3600))
    tasks = [asyncio.create_task(body()) for _, body in sync.tasks()]
    try:

        def endpoints() -> tuple[Endpoint, ...] | None:
            table = plane.state.services
            return table.ports[0].endpoints if table and table.ports else None

        await eventually(lambda: endpoints() is not None, what="the service in the plane")
        table = plane.state.services
        assert table is not None and table.node_ips == (IPv4Address("192.0.2.10"),)
        (port,) = table.ports
        assert (port.key, port.cluster_ip, port.node_port) == (
            "default/web/tcp/http",
            IPv4Address("172.30.0.10"),
            30080,
        )
        assert endpoints() == (Endpoint(IPv4Address("10.128.0.5"), 8080, local=True),)
        stored = await registry.get(ENDPOINT_SLICE, "default", "web-1")
        changed = {**stored, **endpoint_slice("10.128.0.6", "10.128.0.7")}
        changed["metadata"] = stored["metadata"]
        await registry.update(ENDPOINT_SLICE, changed, "default", "web-1")
        await eventually(lambda: len(endpoints() or ()) == 2, what="the endpoint change")
        await registry.delete(SERVICE, "default", "web")
        await eventually(lambda: endpoints() is None, what="the service gone")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
