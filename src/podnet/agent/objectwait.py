"""Waiting at start for one named object (this node's HostSubnet, ClusterNetwork
``default``) until it is usable: a list and watch of that object alone, through the
client's reflector, instead of a GET every half second.

The list and the watch carry ``fieldSelector=metadata.name=<name>``, so the master
sends this object's changes only (kubelet watches its own Node the same way): 5,000
nodes registering at once keep 5,000 quiet watches open instead of asking 10,000 GETs a
second. A node may list and watch every kind it may read, so nothing changes for the
authorizer.

Otherwise the wait is what it was: no deadline (it ends when the object is usable, or is
cancelled when the agent stops), transient errors retried for ever (the reflector), a
permanent one (403) raised, and the reason logged ("waiting for HostSubnet for node X
(not created yet)") when first seen and every ``WAIT_LOG_SECONDS`` while it lasts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from podnet.agent.clusterwatch import apply_event
from podnet.client.aio import AsyncApiClient
from podnet.client.objectapi import Listing
from podnet.client.reflector import reflect
from podnet.client.watch import ResourceVersion, WatchEvent
from podnet.model.kinds import Kind

log = logging.getLogger("podnet.agent")

Obj = dict[str, Any]
Problem = Callable[[Obj | None], str | None]  # why the object is not usable, or None
WAIT_LOG_SECONDS = 5.0


@dataclass(frozen=True)
class NamedObject:
    """The list and watch of ``api`` narrowed to the objects named ``name`` (the master
    filters them): what the reflector is given."""

    api: AsyncApiClient
    name: str

    @property
    def selector(self) -> str:
        return f"metadata.name={self.name}"

    async def list(self, kind: Kind, namespace: str | None = None) -> Listing:
        return await self.api.list(kind, namespace, field_selector=self.selector)

    def watch(
        self, kind: Kind, since: ResourceVersion, namespace: str | None = None
    ) -> AsyncIterator[WatchEvent]:
        return self.api.watch(kind, since, namespace, field_selector=self.selector)


class ObjectWait:
    """One wait: ``run`` returns the object once ``problem`` finds nothing wrong."""

    def __init__(
        self, api: AsyncApiClient, kind: Kind, name: str, problem: Problem, node: str
    ) -> None:
        self.api = NamedObject(api, name)
        self.kind = kind
        self.name = name
        self.problem = problem
        self.node = node
        self.why: str | None = None  # the latest reason to wait (None before the listing)
        self._logged_at: float | None = None  # loop time of the last log

    async def run(self) -> Obj:
        """Watch until the object is usable; log why it is not, now and then."""
        watching = asyncio.create_task(self._watch(), name=f"wait-{self.kind.plural}")
        loop = asyncio.get_running_loop()
        try:
            while True:
                # The first log comes from the watch (the listing); then every few seconds.
                pause = None
                if self._logged_at is not None:
                    pause = max(0.0, self._logged_at + WAIT_LOG_SECONDS - loop.time())
                done, _ = await asyncio.wait({watching}, timeout=pause)
                if done:
                    return watching.result()
                self._log_if_due()
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)

    async def _watch(self) -> Obj:
        objects: dict[str, Obj] = {}
        events = reflect(self.api, self.kind)
        try:
            async for event in events:
                apply_event(objects, event)
                obj = objects.get(self.name)
                self.why = self.problem(obj)
                if self.why is None:
                    assert obj is not None
                    return obj
                self._log_if_due()
        finally:
            close = getattr(events, "aclose", None)  # the watch's connection goes with it
            if close is not None:
                await close()
        raise AssertionError("a reflector's events never end")

    def _log_if_due(self) -> None:
        now = asyncio.get_running_loop().time()
        if self.why is None:
            return
        if self._logged_at is None or now - self._logged_at >= WAIT_LOG_SECONDS:
            log.info("waiting for %s for node %s (%s)", self.kind.kind, self.node, self.why)
            self._logged_at = now


async def wait_for_object(
    api: AsyncApiClient, kind: Kind, name: str, problem: Problem, node: str
) -> Obj:
    """``kind/name`` once ``problem`` finds nothing wrong with it (see the module doc)."""
    return await ObjectWait(api, kind, name, problem, node).run()
