"""The agent's CNI counters and IPAM usage (podnet.agent.cnimetrics, .ipammetrics), read
from the agent's registry after real commands through its CNI server and a real
host-local IPAM store, then through its /metrics listener."""

from __future__ import annotations

import json
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import aiohttp

from podnet.agent.cniserver import CniServer
from podnet.agent.metrics import MetricsServer, agent_metrics
from podnet.agent.pods import PodManager
from podnet.dataplane.fake import FakeDataPlane
from podnet.dataplane.interface import NodeNetwork
from podnet.ipam.hostlocal import HostLocalStore
from podnet.testing.metricstext import sample

NODE = NodeNetwork(
    "node-a",
    IPv4Address("192.0.2.10"),
    IPv4Network("10.128.0.0/24"),
    (IPv4Network("10.128.0.0/14"),),
    IPv4Network("172.30.0.0/16"),
    1450,
)


def body(command: str, cid: str, **env: str) -> bytes:
    full = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/ns/x"}
    config = json.dumps({"cniVersion": "1.0.0", "name": "podnet", "type": "podnet"})
    return json.dumps({"env": {**full, "CNI_IFNAME": "eth0", **env}, "config": config}).encode()


async def post(server: CniServer, payload: bytes) -> tuple[int, Any]:
    connector = aiohttp.UnixConnector(path=str(server.socket_path))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post("http://agent/cni", data=payload) as resp,
    ):
        text = await resp.text()
        return resp.status, json.loads(text) if text else None


async def test_cni_commands_and_ipam_usage_are_counted(tmp_path: Path) -> None:
    store = HostLocalStore(tmp_path / "ipam", "podnet")
    reconcile, cni, ipam = agent_metrics(store)
    dataplane = FakeDataPlane()
    await dataplane.setup_node(NODE)
    pods = PodManager(dataplane, store, NODE)
    server = CniServer(tmp_path / "run" / "cni.sock", pods, cni)
    listener = MetricsServer(reconcile, "127.0.0.1:0", ipam.refresh)
    await server.start()
    await listener.start()
    try:
        before = reconcile.render()
        assert sample(before, "podnet_ipam_addresses_allocated") is None  # subnet unknown
        ipam.subnet = NODE.subnet
        for cid in ("c1", "c2", "c3"):
            status, _ = await post(server, body("ADD", cid=cid, K8S_POD_NAME=f"secret-{cid}"))
            assert status == 200
        assert (await post(server, body("DEL", cid="c2")))[0] == 200
        assert (await post(server, body("ADD", cid="bad id!")))[0] != 200  # refused
        assert (await post(server, b"{not json"))[0] != 200
        url = f"http://127.0.0.1:{listener.port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            text = await resp.text()
    finally:
        await listener.stop()
        await server.stop()
    requests = "podnet_cni_requests_total"
    assert sample(text, requests, command="ADD", result="ok") == 3.0
    assert sample(text, requests, command="DEL", result="ok") == 1.0
    assert sample(text, requests, command="DEL", result="error") == 0.0
    refused = sample(text, requests, command="ADD", result="error") or 0
    other = sample(text, requests, command="other", result="error") or 0
    assert refused + other == 2.0  # the bad ID and the unparsable body
    seconds = "podnet_cni_request_duration_seconds_count"
    assert sample(text, seconds, command="ADD") == (3.0 + refused)
    added = sample(text, "podnet_cni_request_duration_seconds_sum", command="ADD")
    assert added is not None and 0 < added < 10
    assert sample(text, "podnet_ipam_addresses_allocated") == 2.0  # c1 and c3
    assert sample(text, "podnet_ipam_addresses_capacity") == 253.0  # a /24 less 3
    assert "secret-" not in text and "c1" not in text  # no pod or container as a label


async def test_ipam_usage_follows_allocations_at_scrape_time(tmp_path: Path) -> None:
    store = HostLocalStore(tmp_path / "ipam", "podnet")
    reconcile, _, ipam = agent_metrics(store)
    ipam.subnet = NODE.subnet
    pods = PodManager(FakeDataPlane(), store, NODE)
    for i in range(5):
        await pods._allocate((f"c{i}", "eth0"))
    await ipam.refresh()
    assert sample(reconcile.render(), "podnet_ipam_addresses_allocated") == 5.0
    store.release("c0", "eth0")
    assert sample(reconcile.render(), "podnet_ipam_addresses_allocated") == 5.0  # last read
    await ipam.refresh()
    assert sample(reconcile.render(), "podnet_ipam_addresses_allocated") == 4.0
