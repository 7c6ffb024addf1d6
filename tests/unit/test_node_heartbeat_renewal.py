"""The node's Lease renewal, against a real API server (TLS, the node's own token): one PUT
over the Lease it wrote last, a read only at start and after a failed write (kubelet)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from podnet.agent.heartbeat import NodeHeartbeat, renewed
from podnet.api.registry import Registry
from podnet.client import ClientError, has_reason
from podnet.client.aio import AsyncApiClient
from podnet.client.watch import Obj
from podnet.client.wire import Call
from podnet.model.kinds import LEASE, NAMESPACE
from podnet.model.schemas_coordination import NODE_LEASE_NAMESPACE
from podnet.testing.api import namespace, node_api_client

NODE = "node-a"


class CountingClient(AsyncApiClient):
    """The node's client, noting the method and path of every request it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    async def request(self, call: Call) -> Obj:
        self.sent.append(call.method)
        return await super().request(call)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[Registry, CountingClient]]:
    async with node_api_client(tmp_path, NODE, CountingClient) as (registry, client):
        await registry.create(NAMESPACE, namespace(NODE_LEASE_NAMESPACE))
        yield registry, client


async def test_renewals_write_over_the_last_lease_without_reading_it(
    node: tuple[Registry, CountingClient],
) -> None:
    registry, client = node
    heartbeat = NodeHeartbeat(client, NODE, 40)
    first = await heartbeat.renew()
    assert client.sent == ["GET", "POST"]  # none yet: created
    client.sent.clear()
    second = await heartbeat.renew()
    third = await heartbeat.renew()
    assert client.sent == ["PUT", "PUT"]  # no read between renewals
    stored = await registry.get(LEASE, NODE_LEASE_NAMESPACE, NODE)
    assert first < second < third == stored["spec"]["renewTime"] == heartbeat.last_renewal
    assert stored["spec"]["holderIdentity"] == NODE


async def test_after_someone_else_wrote_the_lease_it_is_read_again(
    node: tuple[Registry, CountingClient],
) -> None:
    registry, client = node
    heartbeat = NodeHeartbeat(client, NODE, 40)
    await heartbeat.renew()
    stored = await registry.get(LEASE, NODE_LEASE_NAMESPACE, NODE)
    taken = renewed(stored, "intruder", 40, "2030-01-01T00:00:00.000000Z")
    await registry.update(LEASE, taken, NODE_LEASE_NAMESPACE, NODE)
    client.sent.clear()
    with pytest.raises(ClientError) as failed:
        await heartbeat.renew()  # over a stale resourceVersion
    assert has_reason(failed.value, "Conflict")
    renewed_at = await heartbeat.renew()  # as the run loop does at once after a conflict
    assert client.sent == ["PUT", "GET", "PUT"]
    stored = await registry.get(LEASE, NODE_LEASE_NAMESPACE, NODE)
    assert stored["spec"]["holderIdentity"] == NODE
    assert stored["spec"]["renewTime"] == renewed_at
    assert stored["spec"]["leaseTransitions"] == 2  # taken by the intruder, then back
