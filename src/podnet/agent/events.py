"""Events the agent records about its own Node (best effort, in the background)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from podnet.client import ClientError, with_retry
from podnet.client.aio import AsyncApiClient
from podnet.model.kinds import EVENT

log = logging.getLogger("podnet.agent.events")

EVENT_NAMESPACE = "default"  # where Kubernetes puts events about cluster-scoped Nodes
COMPONENT = "podnet-node"
DEADLINE = 60.0


def node_event(node: str, reason: str, message: str, kind: str = "Warning") -> dict[str, Any]:
    """A v1 Event about Node ``node``."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{node}.{uuid.uuid4().hex[:16]}", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class NodeEvents:
    """Records Events about this node without blocking the caller."""

    def __init__(self, api: AsyncApiClient, node: str) -> None:
        self.api = api
        self.node = node
        self._tasks: set[asyncio.Task[None]] = set()

    def warn(self, reason: str, message: str) -> None:
        """Record a Warning Event (retried for up to a minute, then given up)."""
        task = asyncio.get_running_loop().create_task(self._record(reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, reason: str, message: str) -> None:
        event = node_event(self.node, reason, message)
        try:
            await with_retry(
                lambda: self.api.create(EVENT, event, EVENT_NAMESPACE),
                "recording an event",
                DEADLINE,
            )
        except ClientError as exc:
            log.warning("event %s not recorded: %s", reason, exc)

    async def close(self) -> None:
        """Abandon the events still pending."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
