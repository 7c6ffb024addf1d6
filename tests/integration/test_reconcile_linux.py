"""The reconcile loop against the real linux data plane: nft really refuses one policy.

A NetworkPolicy with ``port: 90, endPort: 80`` is refused by the API's validation, but
the compiler does not check it again: it becomes the port range 90-80, and nft refuses
that set element ("Range has zero or negative size"), so the whole transaction fails.
That is the kind of compiler/renderer bug the loop must survive: PolicySync's loop
bisects, leaves out that one policy and applies the others in the node's namespace,
where ``nft list table`` then shows the good policies' ports and not the bad one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from podnet.agent.policies import PolicySync
from podnet.client import LISTED, WatchEvent
from podnet.model.kinds import NAMESPACE, NETWORK_POLICY, POD, Kind
from podnet.model.network import NETWORKPOLICY
from podnet.reconcile import PARTIAL, ReconcileMetrics
from podnet.testing.lab import built_lab, sh

pytestmark = [pytest.mark.root]  # root, nft and ip are required (tests/conftest.py)

Obj = dict[str, Any]


class Listings:
    """A watch source that lists fixed objects once and then stays quiet."""

    def __init__(self, objects: dict[str, list[Obj]]) -> None:
        self.objects = objects

    async def watch(self, kind: Kind) -> AsyncIterator[WatchEvent]:
        yield WatchEvent(LISTED, items=tuple(self.objects.get(kind.plural, [])))
        await asyncio.Event().wait()


def pod(name: str, ip: str, app: str) -> Obj:
    return {
        "metadata": {"namespace": "x", "name": name, "labels": {"app": app}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "podIP": ip},
    }


def ingress(name: str, app: str, *ports: Obj) -> Obj:
    spec = {"podSelector": {"matchLabels": {"app": app}}, "ingress": [{"ports": list(ports)}]}
    return {"metadata": {"namespace": "x", "name": name}, "spec": spec}


async def test_a_policy_nft_refuses_is_left_out_and_the_others_apply() -> None:
    objects = {
        POD.plural: [pod("web", "10.128.0.10", "web"), pod("db", "10.128.0.11", "db")],
        NAMESPACE.plural: [{"metadata": {"name": "x"}}],
        NETWORK_POLICY.plural: [
            ingress("a-web-8081", "web", {"port": 8081}),
            ingress("b-bad-range", "db", {"port": 90, "endPort": 80}),
            ingress("c-db-5432", "db", {"port": 5432, "endPort": 5439}),
        ],
    }
    async with built_lab("rcl", nodes=1) as lab:
        node = lab.network(1, isolation=True)
        plane = lab.plane(1)
        await plane.setup_node(node)
        metrics, records = ReconcileMetrics(), []
        sync = PolicySync(
            Listings(objects), plane, node, NETWORKPOLICY, resync_period=3600,
            metrics=metrics, report=records.append,
        )  # fmt: skip
        tasks = [asyncio.create_task(body(), name=name) for name, body in sync.tasks()]
        try:
            await asyncio.wait_for(sync.synced.wait(), 60)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        record = records[-1]
        assert record.result == PARTIAL and record.left_out == ("x/b-bad-range",)
        assert "Range has zero or negative size" in record.error
        refused = metrics.registry.get_sample_value(
            "podnet_reconcile_permanent_errors_total", {"loop": "policy"}
        )
        assert refused == 1
        table = sh(lab.node_ns(1), "nft", "list", "table", "inet", "podnet_policy")
        assert "8081" in table and "5432-5439" in table  # the good policies are in
        assert "90-80" not in table and " 80-90" not in table
