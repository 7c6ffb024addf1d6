"""The node's side of a Pod's lifecycle: finalization, orphan teardown, and the
addresses that Pod objects still show.

From the agent's shared Pod informer (after its first listing: never on a partial
view), it keeps this node's Pods and every address a Pod shows inside this node's
subnet, and on each change, each sandbox that goes, and whenever a grace runs out:

- tears down the network of every sandbox whose Pod is gone or whose grace ran out
  (``PodManager.teardown``: detached, address released and resting; the runtime's later
  CNI DEL still succeeds);
- finalizes every terminating Pod of this node that has no sandbox network here (grace
  0, its uid as precondition);
- tells IPAM which addresses Pod objects still show, so none is handed out again while
  a Pod (and the rules compiled from it) names it.

Both are counted in ``/metrics`` (``podnet_agent_pod_teardowns_total{reason}``,
``podnet_agent_pod_finalizations_total``) and logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from podnet.agent.config import AgentConfig
from podnet.agent.events import NodeEvents
from podnet.agent.orphans import KnownPod, known_pod, local_ips, next_deadline, plan_lifecycle
from podnet.agent.orphans import ref_of as pod_ref_of
from podnet.agent.podrefs import PodRefs
from podnet.agent.pods import PodManager
from podnet.agent.podstatus import PodRef, PodStatusWriter, delete_pod
from podnet.client import ClientError
from podnet.client.aio import AsyncApiClient
from podnet.client.informers import Informers
from podnet.client.watch import DELETED, LISTED, WatchEvent
from podnet.dataplane.interface import DataPlane, NodeNetwork
from podnet.ipam.cooldown import Cooldown
from podnet.ipam.hostlocal import HostLocalStore
from podnet.model.kinds import POD

log = logging.getLogger("podnet.agent.podlifecycle")

Obj = dict[str, Any]
RECHECK_SECONDS = 5.0  # at least this often (recent ADDs settle, failed deletes retry)
RETRY_SECONDS = 5.0  # a finalization that failed is tried again after this
COOLDOWN_FILE = "ipam-cooldown"  # in the state dir: released addresses resting


class PodLifecycle:
    """Finalizes this node's terminating Pods and tears down orphaned sandboxes."""

    def __init__(
        self,
        informers: Informers,
        pods: PodManager,
        api: AsyncApiClient,
        registry: CollectorRegistry,
    ) -> None:
        self.informers = informers
        self.pods = pods
        self.api = api
        self.writer = pods.status_writer
        self.node_name = pods.node.node_name
        self.subnet: IPv4Network = pods.node.subnet
        self.listed = asyncio.Event()
        self._wake = asyncio.Event()
        self._mine: dict[PodRef, KnownPod] = {}  # this node's Pods
        self._shown: dict[PodRef, frozenset[IPv4Address]] = {}  # any Pod's local addresses
        self._tried: dict[str, float] = {}  # uid -> when its finalization was last tried
        self._seen: set[PodRef] = set()  # this node's Pods seen since start (pruned)
        self.teardowns = Counter(
            "podnet_agent_pod_teardowns", "Sandbox networks torn down by the node "
            "(their Pod gone, or its grace over)", ["reason"], registry=registry,
        )  # fmt: skip
        self.finalizations = Counter(
            "podnet_agent_pod_finalizations", "Terminating Pods the node deleted (grace 0, "
            "uid precondition) once their sandbox network was gone", registry=registry,
        )  # fmt: skip
        pods.shown = self.shown
        pods.on_gone = self._wake.set

    def tasks(self) -> list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]:
        """(name, coroutine function) to run supervised."""
        return [("pod-lifecycle-watch", self.watch), ("pod-lifecycle", self.run)]

    def shown(self) -> set[IPv4Address]:
        """Every address in this node's subnet that some Pod object shows."""
        return set().union(*self._shown.values()) if self._shown else set()

    async def watch(self) -> None:
        """Follow the Pods (the informer shared with the policy sync)."""
        async for event in self.informers.watch(POD):
            self.take(event)

    def take(self, event: WatchEvent) -> None:
        """One watch event: a listing replaces the view, a change updates it."""
        if event.type == LISTED:
            self._mine, self._shown = {}, {}
            for obj in event.items:
                self._put(obj)
            self.listed.set()
        elif event.type == DELETED:
            ref = pod_ref_of(event.object)
            self._mine.pop(ref, None)
            self._shown.pop(ref, None)
        else:
            self._put(event.object)
        self._wake.set()

    def _put(self, obj: Obj) -> None:
        ref = pod_ref_of(obj)
        if (obj.get("spec") or {}).get("nodeName") == self.node_name:
            self._mine[ref] = known_pod(obj)
            self._seen.add(ref)
        else:
            self._mine.pop(ref, None)
        ips = local_ips(obj, self.subnet)
        if ips:
            self._shown[ref] = ips
        else:
            self._shown.pop(ref, None)

    async def run(self) -> None:
        """After the first listing: a pass on every wake-up, at each grace's end, and at
        least every ``RECHECK_SECONDS``."""
        await self.listed.wait()
        while True:
            self._wake.clear()
            await self.step()
            await self._sleep()

    async def _sleep(self) -> None:
        delay, now = RECHECK_SECONDS, datetime.now(UTC)
        deadline = next_deadline(self._mine.values(), now)
        if deadline is not None:  # just after it: the deadline is to the second
            delay = min(delay, (deadline - now).total_seconds() + 0.05)
        try:
            async with asyncio.timeout(delay):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def step(self) -> None:
        """One pass: tear down, then finalize."""
        pending = self.writer.pending if self.writer is not None else (lambda ref: False)
        plan = plan_lifecycle(
            dict(self._mine),
            self.pods.attachments(),
            datetime.now(UTC),
            time.monotonic(),
            pending,
            self._seen.__contains__,
        )
        for pair, why in plan.teardown:
            if await self.pods.teardown(pair, why):
                self.teardowns.labels(why).inc()
        now = time.monotonic()
        for ref, uid in plan.finalize:
            if now - self._tried.get(uid, -RETRY_SECONDS) < RETRY_SECONDS:
                continue
            self._tried[uid] = now
            await self._finalize(ref, uid)
        live = {pod.uid for pod in self._mine.values()}
        self._tried = {uid: t for uid, t in self._tried.items() if uid in live}
        attached = {ref for _, ref, _ in self.pods.attachments()}
        self._seen &= attached | set(self._mine)

    async def _finalize(self, ref: PodRef, uid: str) -> None:
        stub = {"metadata": {"namespace": ref.namespace, "name": ref.name, "uid": uid}}
        try:
            await delete_pod(self.api, stub)
        except ClientError as exc:
            log.warning("finalizing pod %s: %s; trying again", ref, exc)
            return
        self.finalizations.inc()
        log.info("pod %s finalized: its sandbox network on this node is gone", ref)


def node_pods(
    config: AgentConfig,
    dataplane: DataPlane,
    store: HostLocalStore,
    node: NodeNetwork,
    writer: PodStatusWriter,
    events: NodeEvents,
) -> PodManager:
    """The agent's ``PodManager``: IPAM repairs reported as Node events, attachments'
    Pods recorded on disk, released addresses resting (``podnet.ipam.cooldown``)."""
    # the record's former JSON file (before it was appended to): its entries rest at most
    # 30 s, and a Pod still showing an address keeps it from reuse all the same
    (config.state_dir / "ipam-cooldown.json").unlink(missing_ok=True)
    return PodManager(
        dataplane,
        store,
        node,
        writer,
        config.pod_namespace,
        report=lambda message: events.warn("IPAMFileRepaired", message),
        refs=PodRefs(config.state_dir / "pods"),
        cooldown=Cooldown(config.state_dir / COOLDOWN_FILE),
    )
