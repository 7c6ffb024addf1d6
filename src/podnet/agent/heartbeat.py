"""The node's heartbeat: renew the Lease ``kube-node-lease/<node>`` every few seconds.

As the kubelet does (coordination.k8s.io/v1): ``holderIdentity`` is the node name,
``leaseDurationSeconds`` the promise (40 by default, ``$PODNET_NODE_LEASE_SECONDS`` for
tests) and ``renewTime`` is written every quarter of it. The master's node lifecycle
controller marks the Node's Ready condition Unknown when renewals stop. A master outage
only delays renewals: failures are retried about once a second and never end the task.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from podnet.client import ClientError, has_reason
from podnet.client.aio import AsyncApiClient
from podnet.envsettings import seconds_from_env
from podnet.model.kinds import LEASE

# podnet.model.schemas_coordination's constant, not imported from there: that module
# pulls in pydantic, ~0.2 s of the agent's start, which no other part of the agent needs.
NODE_LEASE_NAMESPACE = "kube-node-lease"

log = logging.getLogger("podnet.agent.heartbeat")

Obj = dict[str, Any]
DEFAULT_LEASE_SECONDS = 40
LEASE_ENV = "PODNET_NODE_LEASE_SECONDS"
RETRY_SECONDS = 1.0


def lease_seconds_from_env() -> int:
    """``$PODNET_NODE_LEASE_SECONDS`` if it is a positive whole number, else 40."""
    value = seconds_from_env(LEASE_ENV, DEFAULT_LEASE_SECONDS)
    return int(value) if value == int(value) else DEFAULT_LEASE_SECONDS


def micro_time(when: datetime | None = None) -> str:
    """Kubernetes' MicroTime: RFC 3339 with microseconds, UTC."""
    return (when or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_object(node: str, seconds: int, now: str) -> Obj:
    """A fresh Lease for ``node``, held by it and renewed ``now``."""
    return {
        "apiVersion": LEASE.api_version,
        "kind": LEASE.kind,
        "metadata": {"name": node, "namespace": NODE_LEASE_NAMESPACE},
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": seconds,
            "acquireTime": now,
            "renewTime": now,
        },
    }


def renewed(lease: Obj, node: str, seconds: int, now: str) -> Obj:
    """``lease`` renewed ``now`` by ``node`` (other spec fields kept)."""
    spec = dict(lease.get("spec") or {})
    if spec.get("holderIdentity") != node:
        spec["acquireTime"] = now
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
    spec |= {"holderIdentity": node, "leaseDurationSeconds": seconds, "renewTime": now}
    return {**lease, "spec": spec}


class NodeHeartbeat:
    """Keeps this node's Lease renewed while the agent runs."""

    def __init__(self, api: AsyncApiClient, node: str, seconds: int | None = None) -> None:
        self.api = api
        self.node = node
        self.seconds = seconds or lease_seconds_from_env()
        self.interval = self.seconds / 4
        self.last_renewal = ""  # renewTime last written
        self._lease: Obj | None = None  # the Lease as last written (None: read it first)

    async def renew(self) -> str:
        """Create or renew the Lease once; the renewTime written.

        As the kubelet's lease controller: the renewal is written over the Lease this
        node wrote last (one PUT, whose resourceVersion is the precondition); the Lease is
        read first only at start and after a failed write (a conflict: someone else wrote
        it). 5,000 nodes then send 500 requests a second, not 1,000."""
        now = micro_time()
        lease = self._lease
        self._lease = None  # until this renewal is known to be written
        if lease is None:
            lease = await self.api.get_or_none(LEASE, NODE_LEASE_NAMESPACE, self.node)
        if lease is None:
            written = await self.api.create(
                LEASE, lease_object(self.node, self.seconds, now), NODE_LEASE_NAMESPACE
            )
        else:
            written = await self.api.update(LEASE, renewed(lease, self.node, self.seconds, now))
        self._lease = written
        self.last_renewal = now
        return now

    async def run(self) -> None:
        """Renew every ``interval`` seconds, for ever; failures are logged once per
        outage and retried after ``RETRY_SECONDS`` (a conflict or a race at once)."""
        failing = False
        while True:
            try:
                await self.renew()
            except ClientError as exc:
                if not failing:
                    log.warning("renewing the Lease of node %s failed: %s", self.node, exc)
                failing = True
                retry = 0.0 if has_reason(exc, "Conflict", "AlreadyExists") else RETRY_SECONDS
                await asyncio.sleep(retry)
                continue
            if failing:
                log.info("Lease of node %s renewed again", self.node)
            failing = False
            await asyncio.sleep(self.interval)
