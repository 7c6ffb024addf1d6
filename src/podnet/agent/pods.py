"""Pods on this node: the CNI operations ADD, DEL, CHECK, GC and STATUS, and start-up
cleanup.

State lives only in the kernel (the data plane's attachments) and the host-local IPAM
files, so the agent can be killed at any point: ``reconcile`` on the next start matches
the two and cleans what is half done, never touching a healthy pod. Error codes are
listed in ``podnet.agent.cnierrors``; Pod status writes are ``podnet.agent.podstatus``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable
from ipaddress import IPv4Address, IPv4Network

from podnet.agent.cnierrors import ERR_CHECK, ERR_DATAPLANE, REQUEST_TIMEOUT, as_cni_error
from podnet.agent.containerlocks import ContainerLocks
from podnet.agent.ipamrepair import Report, repair_damaged
from podnet.agent.podcleanup import CleanupPlan, IpamEntry, plan_gc, plan_restart_cleanup
from podnet.agent.podrefs import Pair, PodRefs, Record
from podnet.agent.podstatus import PodRef, PodStatusWriter, pod_ref
from podnet.cni.dnsconfig import cluster_dns
from podnet.cni.result import DNS, CniResult, Interface, IPConfig, Route
from podnet.cni.types import (
    ERR_INVALID_NETWORK_CONFIG,
    ERR_NOT_AVAILABLE,
    ERR_NOT_AVAILABLE_LIMITED,
    CniError,
    CniRequest,
)
from podnet.dataplane.interface import (
    DataPlane,
    DataPlaneError,
    NodeNetwork,
    PodAttachment,
    PodNetwork,
)
from podnet.ipam.config import RangeSet, parse_range
from podnet.ipam.cooldown import Cooldown
from podnet.ipam.hostlocal import Allocation, HostLocalStore

log = logging.getLogger("podnet.agent.pods")

DEFAULT_ROUTE = IPv4Network("0.0.0.0/0")


def node_range_set(node: NodeNetwork) -> RangeSet:
    """The node subnet as host-local's one range set: gateway .1, never handed out."""
    return RangeSet((parse_range({"subnet": str(node.subnet)}, "node subnet"),))


def cni_result(
    attachment: PodAttachment, routes: Iterable[IPv4Network], dns: DNS | None = None
) -> CniResult:
    """The ADD result: host veth, pod interface (index 1) with its address, the pod's
    routes via the gateway (the default route, which every backend adds, and ``routes``)
    and ``dns``: the cluster DNS, served on the gateway address."""
    routes = (DEFAULT_ROUTE, *routes)
    host = Interface(attachment.host_ifname)
    pod = Interface(attachment.ifname, attachment.mac, attachment.mtu, attachment.sandbox)
    gateway = str(attachment.gateway)
    return CniResult(
        interfaces=(host, pod),
        ips=(IPConfig(str(attachment.address), gateway, 1),),
        routes=tuple(Route(str(dst), gateway) for dst in routes),
        dns=dns or DNS(),
    )


class PodManager:
    """Serves CNI requests for one node: IPAM + data plane + Pod status, all idempotent."""

    def __init__(
        self,
        dataplane: DataPlane,
        store: HostLocalStore,
        node: NodeNetwork,
        status_writer: PodStatusWriter | None = None,
        default_namespace: str = "default",
        report: Report | None = None,
        refs: PodRefs | None = None,
        cooldown: Cooldown | None = None,
    ) -> None:
        self.dataplane = dataplane
        self.store = store
        self.node = node
        self.status_writer = status_writer
        self.default_namespace = default_namespace
        self.report = report  # where repairs of damaged IPAM files are reported
        self.refs = refs  # who each attachment is, on disk, for a restarted agent
        # Released addresses rest before reuse, and so does any address a Pod object
        # still shows (``shown``, set by the pod lifecycle from its informer).
        self.cooldown = cooldown or Cooldown(None, 0.0)
        self.shown: Callable[[], Collection[IPv4Address]] = frozenset
        self.on_gone: Callable[[], None] = lambda: None  # a sandbox's network went
        self.locks = ContainerLocks()
        self._requests: dict[str, int] = {}  # container -> CNI requests in progress
        self.ready = False  # set once the data plane is in place and pods reconciled
        self._range_sets = [node_range_set(node)]
        self._attached: dict[Pair, PodAttachment] = {}
        self._pods: dict[Pair, PodRef] = {}  # who each pair is, for DEL's status update
        self._added_at: dict[Pair, float] = {}
        if status_writer is not None and refs is not None:
            status_writer.on_created = self._mirror_made

    async def handle(self, req: CniRequest) -> CniResult | None:
        """Run one CNI command, serial per container; raise ``CniError`` on failure."""
        handlers = {"ADD": self.add, "DEL": self.delete, "CHECK": self.check}
        handlers |= {"GC": self.gc, "STATUS": self.status}
        handler = handlers.get(req.command)
        if handler is None:
            raise CniError(ERR_INVALID_NETWORK_CONFIG, f"unsupported command {req.command}")
        cid = req.container_id
        self._requests[cid] = self._requests.get(cid, 0) + 1
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT), self.locks.hold(cid):
                return await handler(req)
        except Exception as exc:
            raise as_cni_error(exc) from exc
        finally:
            if (left := self._requests.pop(cid) - 1) > 0:
                self._requests[cid] = left

    async def add(self, req: CniRequest) -> CniResult:
        """Allocate, wire, answer; the Pod status is written in the background."""
        pair = (req.container_id, req.ifname)
        if pair in self._attached:
            raise CniError(ERR_DATAPLANE, "interface already exists", f"{pair[1]} of {pair[0]}")
        ref = pod_ref(req, self.default_namespace)
        uid = None
        if self.status_writer is not None:
            uid = await self.status_writer.check_api(ref)
        allocation = (await self._allocate(pair))[0]
        try:
            attachment = await self.dataplane.attach_pod(self._pod_network(req, ref, allocation))
        except BaseException:
            await self._undo_add(req)
            raise
        self._remember(pair, attachment, ref)
        if self.refs is not None:
            mirror = uid == ""  # no Pod: its mirror Pod is to be made
            await asyncio.to_thread(self.refs.record, pair, (ref.namespace, ref.name), mirror)
        if self.status_writer is not None:
            self.status_writer.running(ref, allocation.address.ip, req.container_id)
        dns = cluster_dns(str(attachment.gateway), req.args.get("K8S_POD_NAMESPACE"))
        return cni_result(attachment, self.node.cluster_networks, dns)

    async def delete(self, req: CniRequest) -> None:
        """Unwire and release; fine when already gone or when the netns is missing."""
        pair = (req.container_id, req.ifname)
        await self.dataplane.detach_pod(pair[0], pair[1], req.netns or None)
        ref = self._forget(pair) or pod_ref(req, self.default_namespace)
        released = await asyncio.to_thread(self.store.release, *pair)
        self._gone(pair, ref, released)

    def attachments(self) -> list[tuple[Pair, PodRef, float | None]]:
        """(pair, Pod, monotonic time of its ADD, None when made before this agent
        started) of every attachment whose Pod is known."""
        found = ((pair, self._pods.get(pair)) for pair in self._attached)
        return [(pair, ref, self._added_at.get(pair)) for pair, ref in found if ref is not None]

    async def teardown(self, pair: Pair, why: str) -> bool:
        """Detach ``pair`` and release its address (its Pod is gone, or its grace ran
        out): the sandbox may live on, without a network. A later DEL still succeeds.
        False when there was nothing to tear down (a DEL came first)."""
        async with self.locks.hold(pair[0]):
            attachment = self._attached.get(pair)
            if attachment is None:
                return False
            await self.dataplane.detach_pod(pair[0], pair[1], attachment.sandbox or None)
            ref = self._forget(pair)
            released = await asyncio.to_thread(self.store.release, *pair)
        log.warning("%s: detached %s/%s (%s) of pod %s", why, *pair, attachment.address, ref)
        if ref is not None:
            self._gone(pair, ref, released)
        return True

    def _gone(self, pair: Pair, ref: PodRef, released: list[IPv4Address]) -> None:
        """A sandbox's network is gone: its addresses rest, its Pod stops showing them,
        and its mirror Pod goes (unless another attachment of the same Pod remains)."""
        self.cooldown.released(released)
        if self.status_writer is not None:
            last = ref not in self._pods.values()
            ip = released[0] if released else None
            self.status_writer.released(ref, ip, pair[0], gone=last)
        self.on_gone()

    async def check(self, req: CniRequest) -> None:
        """Verify the attachment exists in the data plane and IPAM, as prevResult says."""
        pair = (req.container_id, req.ifname)
        prev = req.config.prev_result if req.config else None
        if prev is None:
            raise CniError(ERR_INVALID_NETWORK_CONFIG, "CHECK needs prevResult")
        found = {(a.container_id, a.ifname): a for a in await self.dataplane.attached_pods()}
        attachment = found.get(pair)
        if attachment is None:
            raise CniError(ERR_CHECK, "no such attachment", f"{pair[1]} of {pair[0]}")
        held = await asyncio.to_thread(self.store.find, *pair)
        if attachment.address.ip not in held:
            raise CniError(ERR_CHECK, "address not held in IPAM", str(attachment.address))
        if str(attachment.address) not in {ip.address for ip in prev.ips}:
            raise CniError(ERR_CHECK, "address differs from prevResult", str(attachment.address))
        macs = {i.mac.lower() for i in prev.interfaces if i.name == pair[1] and i.mac}
        if macs and attachment.mac.lower() not in macs:
            raise CniError(ERR_CHECK, "MAC differs from prevResult", attachment.mac)

    async def gc(self, req: CniRequest) -> None:
        """Remove every attachment and address not in ``cni.dev/valid-attachments``."""
        listed = req.config.valid_attachments if req.config else None
        if listed is None:
            raise CniError(ERR_INVALID_NETWORK_CONFIG, "GC needs cni.dev/valid-attachments")
        started = time.monotonic()
        valid_pairs = {(a.container_id, a.ifname) for a in listed}
        valid_ids = {cid for cid, _ in valid_pairs}

        def valid(cid: str, ifname: str) -> bool:
            in_list = (cid, ifname) in valid_pairs or (not ifname and cid in valid_ids)
            recent = self._added_at.get((cid, ifname), 0.0) >= started
            # a CNI request in progress (an ADD the runtime cannot list yet), not the
            # bookkeeping after an answered ADD (its mirror Pod's record): GC waits for
            # that one's lock in _undo instead of keeping the sandbox
            own = 1 if cid == req.container_id else 0  # the GC request itself
            return in_list or recent or self._requests.get(cid, 0) > own

        attachments = await self.dataplane.attached_pods()
        await repair_damaged(self.store, attachments, self.report, "GC")
        plan = plan_gc(attachments, await self._allocations(), valid)
        await self._undo(plan, "GC")

    async def status(self, req: CniRequest) -> None:
        """Ok when the data plane is set up and the node subnet has a free address."""
        if not self.ready:
            raise CniError(ERR_NOT_AVAILABLE_LIMITED, "podnet data plane is not set up")
        used = sum(1 for ip, _, _ in await self._allocations() if ip in self.node.subnet)
        if used >= self.node.subnet.num_addresses - 3:  # network, gateway, broadcast
            raise CniError(ERR_NOT_AVAILABLE, "no free pod addresses", str(self.node.subnet))

    async def reconcile(self) -> CleanupPlan:
        """At start: keep healthy pods untouched, undo half-done ones, index the rest."""
        attachments = await self.dataplane.attached_pods()
        await repair_damaged(self.store, attachments, self.report, "start-up")
        plan = plan_restart_cleanup(attachments, await self._allocations(), self.node.subnet)
        refs = await asyncio.to_thread(self.refs.load_records) if self.refs is not None else {}
        self._pods = {pair: PodRef(*r.ref) for pair, r in refs.items()}  # for _undo's releases
        await self._undo(plan, "start-up cleanup")
        self._attached = {(a.container_id, a.ifname): a for a in plan.healthy}
        self._pods = {}
        await self._republish(plan.healthy, refs)
        log.info(
            "%d pods attached and healthy; %d detached, %d addresses released",
            len(plan.healthy),
            len(plan.detach),
            len(plan.release),
        )
        return plan

    async def _republish(self, healthy: list[PodAttachment], refs: dict[Pair, Record]) -> None:
        """Write every healthy pod's status again: a killed agent may have answered an
        ADD without writing it. A Pod is never created again (one deleted meanwhile
        stays deleted, and its sandbox is an orphan), except the mirror Pod of an ADD
        that found no Pod, when the killed agent had not made it yet: that sandbox is
        as new as its ADD (the settling time of ``podnet.agent.orphans`` covers its
        mirror's way back through the informer). Records of pods no longer attached
        are dropped."""
        if self.refs is None:
            return
        for a in healthy:
            pair = (a.container_id, a.ifname)
            record = refs.pop(pair, None)
            if record is None:
                continue
            ref = self._pods[pair] = PodRef(*record.ref)
            if record.mirror:
                self._added_at[pair] = time.monotonic()
            if self.status_writer is not None:
                self.status_writer.running(ref, a.address.ip, a.container_id, record.mirror)
        for pair in refs:
            await asyncio.to_thread(self.refs.forget, pair)

    async def _mirror_made(self, ref: PodRef, container_id: str) -> None:
        """The mirror Pod of ``container_id``'s sandbox is made: its records say so, so
        that a restarted agent never makes it again."""
        if self.refs is None:
            return
        async with self.locks.hold(container_id):  # not while a DEL forgets the record
            pairs = [p for p, r in self._pods.items() if p[0] == container_id and r == ref]
            for pair in pairs:
                try:
                    await asyncio.to_thread(self.refs.record, pair, (ref.namespace, ref.name))
                except OSError as exc:
                    log.warning("recording pod %s's mirror as made: %s", ref, exc)

    async def _allocate(self, pair: Pair) -> list[Allocation]:
        avoid = self.cooldown.resting() | set(self.shown())
        return await asyncio.to_thread(self.store.allocate, *pair, self._range_sets, (), avoid)

    async def _allocations(self) -> list[IpamEntry]:
        return await asyncio.to_thread(self.store.allocations)

    def _pod_network(self, req: CniRequest, ref: PodRef, allocation: Allocation) -> PodNetwork:
        mtu = req.config.mtu if req.config and req.config.mtu else self.node.mtu
        return PodNetwork(
            container_id=req.container_id,
            netns=req.netns,
            ifname=req.ifname,
            address=allocation.address,
            gateway=allocation.gateway,
            mtu=min(mtu, self.node.mtu),
            routes=self.node.cluster_networks,
            namespace=ref.namespace,
            name=ref.name,
        )

    def _forget(self, pair: Pair) -> PodRef | None:
        if self.refs is not None:
            self.refs.forget(pair)
        self._attached.pop(pair, None)
        self._added_at.pop(pair, None)
        return self._pods.pop(pair, None)

    def _remember(self, pair: Pair, attachment: PodAttachment, ref: PodRef) -> None:
        self._attached[pair] = attachment
        self._pods[pair] = ref
        self._added_at[pair] = time.monotonic()

    async def _undo_add(self, req: CniRequest) -> None:
        """After a failed ADD: undo any partial wiring and free the address."""
        try:
            await self.dataplane.detach_pod(req.container_id, req.ifname, req.netns or None)
        except DataPlaneError as exc:
            log.warning("undoing the failed ADD of %s: %s", req.container_id, exc)
        await asyncio.to_thread(self.store.release, req.container_id, req.ifname)

    async def _undo(self, plan: CleanupPlan, why: str) -> None:
        """Detach and release per ``plan``; each released address is cleared from its
        Pod (when the agent knows whose it was) and rests (``podnet.ipam.cooldown``)."""
        owners: dict[Pair, tuple[PodRef, IPv4Address]] = {}
        for a in plan.detach:
            log.info("%s: detaching %s/%s (%s)", why, a.container_id, a.ifname, a.address)
            async with self.locks.hold(a.container_id):
                await self.dataplane.detach_pod(a.container_id, a.ifname, a.sandbox or None)
            if (ref := self._forget((a.container_id, a.ifname))) is not None:
                owners[(a.container_id, a.ifname)] = (ref, a.address.ip)
        for pair in plan.release:
            async with self.locks.hold(pair[0]):
                freed = await asyncio.to_thread(self.store.release, *pair)
            log.info("%s: released %s of %s/%s", why, [str(ip) for ip in freed], *pair)
            owner = owners.pop(pair, None)
            ref = self._pods.pop(pair, None) or (owner[0] if owner else None)
            if ref is None:
                self.cooldown.released(freed)  # whose it was is unknown: it rests all the same
            else:
                self._gone(pair, ref, freed)
        for pair, (ref, ip) in owners.items():
            # detached with nothing held in IPAM (a damaged store): its Pod still shows the
            # address the sandbox had, which must not pass to the address's next pod
            self._gone(pair, ref, [ip])
