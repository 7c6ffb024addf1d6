"""The agent's reconcile loops end to end in one process: a remote node the data plane
refuses permanently is left out, the others are routed, and the refusal shows in the
Node's ``podnet.io/reconcile`` note (as ``podnet cluster status`` reads it) and in the
agent's ``/metrics``. In-process API server (TLS, node credentials), fake data plane."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import aiohttp
from test_agent_pods import (  # a sibling test module: its API server fixture and helpers
    NODE_IP,
    NODE_NAME,
    Api,
    RunningAgent,
    agent_config,
    api,  # noqa: F401 (a fixture)
    eventually,
)

from podnet.agent.nodestatus import RECONCILE_ANNOTATION, reconcile_problems
from podnet.client import NotFound
from podnet.cluster.health import reconcile_report
from podnet.dataplane.fake import FakeDataPlane


async def test_a_refused_remote_node_is_left_out_noted_and_counted(
    api: Api,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    await api.put_hostsubnet(NODE_NAME, "10.128.0.0/24", str(NODE_IP))
    await api.put_hostsubnet("near", "10.128.1.0/24", "192.0.2.11")
    await api.put_hostsubnet("far", "10.128.2.0/24", "192.0.2.12")
    dataplane = FakeDataPlane()
    dataplane.refuse.add("far")  # as a kernel refusing that node's entries
    config = dataclasses.replace(agent_config(tmp_path), metrics_address="127.0.0.1:0")
    running = RunningAgent(api, config, dataplane)
    try:
        await running.serving()

        async def noted() -> dict[str, Any]:
            node = await api.node() or {}
            text = (node["metadata"].get("annotations") or {}).get(RECONCILE_ANNOTATION)
            loops = {"remote-nodes", "policy", "services"}  # every loop has reported
            return node if text and loops <= set(json.loads(text)) else {}

        node = await eventually(noted)
        problems = reconcile_problems(node)
        assert len(problems) == 1
        assert problems[0].startswith("remote-nodes: partial, left out far (refused as the")
        note = json.loads(node["metadata"]["annotations"][RECONCILE_ANNOTATION])
        assert note["remote-nodes"]["left_out"] == ["far"]
        assert note["remote-nodes"]["what"] == "2 remote nodes"
        assert note["policy"]["result"] == "applied"
        assert note["services"]["result"] == "applied"
        assert sorted(dataplane.state.remotes) == ["near"]

        server = running.agent.metrics_server
        assert server is not None
        url = f"http://127.0.0.1:{server.port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            text = await resp.text()
        assert 'podnet_reconcile_permanent_errors_total{loop="remote-nodes"} 1.0' in text
        assert 'podnet_reconcile_left_out{loop="remote-nodes"} 1.0' in text
        assert 'podnet_reconcile_left_out{loop="policy"} 0.0' in text
    finally:
        await running.stop()


def test_cluster_status_reads_the_problems_of_each_node_from_its_note() -> None:
    note = {
        "policy": {"result": "partial", "left_out": ["shop/bad"], "at": "T1",
                   "error": "nft transaction failed: Error: Range has zero or negative size\nx"},
        "remote-nodes": {"result": "applied", "at": "T2"},
    }  # fmt: skip
    nodes = {
        "node1": {"metadata": {"annotations": {RECONCILE_ANNOTATION: json.dumps(note)}}},
        "node2": {"metadata": {}},
    }

    class Nodes:
        def get(self, kind: object, namespace: str | None, name: str) -> dict[str, Any]:
            if name not in nodes:
                raise NotFound(f"nodes {name!r} not found", 404, "NotFound")
            return nodes[name]

    assert reconcile_report(Nodes(), ["node1", "node2", "gone"]) == {
        "node1": [
            "policy: partial, left out shop/bad (nft transaction failed: Error: Range has "
            "zero or negative size) at T1"
        ],
        "node2": [],
        "gone": [],
    }
