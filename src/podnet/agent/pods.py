"""Pods on this node: the CNI operations (ADD, DEL, CHECK, GC, STATUS), the Pod status
writes, and start-up cleanup.

State lives only in the kernel (the data plane's attachments) and the host-local IPAM
files, so the agent can be killed at any point: ``reconcile`` on the next start matches
the two and cleans what is half done, never touching a healthy pod. Error codes are
listed in ``podnet.agent.cniserver``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from podnet.agent.apiclient import (
    AsyncApiClient,
    PermanentApiError,
    TransientApiError,
    has_reason,
    is_transient,
    with_retry,
)
from podnet.agent.cniserver import (
    ERR_CHECK,
    ERR_DATAPLANE,
    REQUEST_TIMEOUT,
    ContainerLocks,
    as_cni_error,
    cni_result,
)
from podnet.agent.ipamrepair import Report, repair_damaged
from podnet.agent.podrefs import PodRefs
from podnet.cni.types import (
    ERR_INVALID_NETWORK_CONFIG,
    ERR_NOT_AVAILABLE,
    ERR_NOT_AVAILABLE_LIMITED,
    ERR_TRY_AGAIN_LATER,
    CniError,
    CniRequest,
    CniResult,
)
from podnet.dataplane.interface import (
    DataPlane,
    DataPlaneError,
    NodeNetwork,
    PodAttachment,
    PodNetwork,
)
from podnet.ipam.config import RangeSet, parse_range
from podnet.ipam.hostlocal import Allocation, HostLocalStore
from podnet.model.kinds import POD

log = logging.getLogger("podnet.agent.pods")

Pair = tuple[str, str]  # (container ID, ifname); ifname "" for legacy IPAM files
IpamEntry = tuple[IPv4Address, str, str]
Obj = dict[str, Any]
_NOT_DNS = re.compile(r"[^a-z0-9.-]+")
CONTAINER_ANNOTATION = "podnet.io/container-id"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
WRITES_IN_FLIGHT = 4
API_CHECK_TIMEOUT = 5.0  # an ADD's read of its Pod; etcd without quorum answers in ~7 s


@dataclass(frozen=True)
class PodRef:
    """A Pod object's namespace and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PodWish:
    """What the Pod status should say: ``ip`` running, or ``ip`` released."""

    ip: IPv4Address
    running: bool
    container_id: str = ""


class PodStatusWriter:
    """Writes pod IPs to Pod objects in the background, so ADD never waits on the master.

    Latest wish per pod, applied serially per pod, retried with backoff until a deadline.
    A pod the runtime did not create is created, bound to this node. A release clears
    ``podIP`` only if the Pod still shows the released address.
    """

    def __init__(
        self, api: AsyncApiClient, node_name: str, node_ip: IPv4Address, deadline: float = 300.0
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.node_ip = node_ip
        self.deadline = deadline
        # Few writes at a time: CNI requests share the event loop and must stay fast.
        self._slots = asyncio.Semaphore(WRITES_IN_FLIGHT)
        self._wishes: dict[PodRef, PodWish] = {}
        self._tasks: dict[PodRef, asyncio.Task[None]] = {}

    async def check_api(self, ref: PodRef, timeout: float = API_CHECK_TIMEOUT) -> None:
        """Raise CNI error 11 ("try again later") unless the API answers a read of the
        Pod within ``timeout``. A pod wired while the master or etcd (e.g. without quorum)
        cannot record it would run unknown to the API; the runtime retries the ADD."""
        try:
            async with asyncio.timeout(timeout):
                await self.api.get_or_none(POD, ref.name, ref.namespace)
        except PermanentApiError:
            return  # e.g. not allowed to read it: the API is up, the writer will tell
        except (TimeoutError, TransientApiError) as exc:
            why = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise CniError(
                ERR_TRY_AGAIN_LATER,
                "the API server is unavailable; try again later",
                f"reading pod {ref}: {why}",
            ) from exc

    def running(self, ref: PodRef, ip: IPv4Address, container_id: str) -> None:
        """Record that ``ref`` runs with ``ip``."""
        self._wish(ref, PodWish(ip, True, container_id))

    def released(self, ref: PodRef, ip: IPv4Address) -> None:
        """Record that ``ip`` of ``ref`` was released (a newer IP wish wins)."""
        pending = self._wishes.get(ref)
        if pending is None or not pending.running or pending.ip == ip:
            self._wish(ref, PodWish(ip, False))

    async def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the pending writes."""
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    async def close(self) -> None:
        """Abandon the writes still pending."""
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _wish(self, ref: PodRef, wish: PodWish) -> None:
        self._wishes[ref] = wish
        if ref not in self._tasks:
            self._tasks[ref] = asyncio.create_task(self._drain(ref), name=f"pod-status {ref}")

    async def _drain(self, ref: PodRef) -> None:
        try:
            while (wish := self._wishes.pop(ref, None)) is not None:
                await self._apply(ref, wish)
        finally:
            self._tasks.pop(ref, None)

    async def _apply(self, ref: PodRef, wish: PodWish) -> None:
        def retry(exc: BaseException) -> bool:
            return is_transient(exc) or has_reason(exc, "Conflict", "AlreadyExists")

        try:
            await with_retry(
                lambda: self._write(ref, wish), f"pod {ref}", self.deadline, retry_if=retry
            )
        except PermanentApiError as exc:
            log.warning("pod %s: status not recorded: %s", ref, exc)
        except Exception as exc:
            log.warning("pod %s: status not recorded (gave up): %s", ref, exc)

    async def _write(self, ref: PodRef, wish: PodWish) -> None:
        async with self._slots:
            await self._write_now(ref, wish)

    async def _write_now(self, ref: PodRef, wish: PodWish) -> None:
        pod = await self.api.get_or_none(POD, ref.name, ref.namespace)
        if pod is not None and (pod.get("spec") or {}).get("nodeName") != self.node_name:
            log.warning("pod %s is not bound to this node; its IP is not recorded", ref)
        elif wish.running:
            await self._write_running(ref, wish, pod)
        elif pod is not None and (pod.get("status") or {}).get("podIP") == str(wish.ip):
            meta = {"resourceVersion": pod["metadata"]["resourceVersion"]}
            clear = {"metadata": meta, "status": {"podIP": None, "podIPs": None}}
            await self.api.patch(POD, ref.name, clear, ref.namespace, "status")

    async def _write_running(self, ref: PodRef, wish: PodWish, pod: Obj | None) -> None:
        ip = str(wish.ip)
        status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        status["hostIP"] = str(self.node_ip)
        if pod is None:
            await self.api.create(POD, self._new_pod(ref, wish, status), ref.namespace)
        elif any((pod.get("status") or {}).get(k) != v for k, v in status.items()):
            await self.api.patch(POD, ref.name, {"status": status}, ref.namespace, "status")

    def _new_pod(self, ref: PodRef, wish: PodWish, status: Obj) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": ref.name,
                "namespace": ref.namespace,
                # A node may create only mirror pods (NodeRestriction): this one mirrors
                # a sandbox the runtime made without the API.
                "annotations": {
                    CONTAINER_ANNOTATION: wish.container_id,
                    MIRROR_ANNOTATION: wish.container_id,
                },
            },
            "spec": {"nodeName": self.node_name, "containers": [{"name": "sandbox"}]},
            "status": status,
        }


def pod_ref(req: CniRequest, default_namespace: str) -> PodRef:
    """The Pod a request is for: K8S_POD_NAMESPACE/K8S_POD_NAME, else the config's
    ``namespace`` (or ``default_namespace``) and the container ID made a DNS name."""
    config_ns = req.config.namespace if req.config else None
    namespace = req.args.get("K8S_POD_NAMESPACE") or config_ns or default_namespace
    name = req.args.get("K8S_POD_NAME") or _dns_name(req.container_id)
    return PodRef(namespace, name)


def _dns_name(text: str) -> str:
    return _NOT_DNS.sub("-", text.lower()).strip(".-")[:253] or "pod"


def node_range_set(node: NodeNetwork) -> RangeSet:
    """The node subnet as host-local's one range set: gateway .1, never handed out."""
    return RangeSet((parse_range({"subnet": str(node.subnet)}, "node subnet"),))


@dataclass(frozen=True)
class CleanupPlan:
    """What to undo: attachments to detach and IPAM pairs to release."""

    healthy: list[PodAttachment]
    detach: list[PodAttachment]
    release: list[Pair]


def _held(allocations: Iterable[IpamEntry]) -> dict[Pair, set[IPv4Address]]:
    held: dict[Pair, set[IPv4Address]] = {}
    for ip, cid, ifname in allocations:
        held.setdefault((cid, ifname), set()).add(ip)
    return held


def plan_restart_cleanup(
    attachments: Iterable[PodAttachment], allocations: Iterable[IpamEntry], subnet: IPv4Network
) -> CleanupPlan:
    """Healthy = attached, inside ``subnet``, and its address is held by its pair in IPAM.
    Everything else is undone: unhealthy attachments, and IPAM pairs with no healthy pod."""
    held = _held(allocations)

    def healthy(a: PodAttachment) -> bool:
        ips = held.get((a.container_id, a.ifname), set()) | held.get((a.container_id, ""), set())
        return a.address.network == subnet and a.address.ip in ips

    good = [a for a in attachments if healthy(a)]
    keys = {(a.container_id, a.ifname) for a in good} | {(a.container_id, "") for a in good}
    release = sorted(pair for pair in held if pair not in keys)
    return CleanupPlan(good, [a for a in attachments if not healthy(a)], release)


def plan_gc(
    attachments: Iterable[PodAttachment],
    allocations: Iterable[IpamEntry],
    valid: Callable[[str, str], bool],
) -> CleanupPlan:
    """GC: detach and release everything ``valid`` (the runtime's list) does not name."""
    attachments = list(attachments)
    stale = [a for a in attachments if not valid(a.container_id, a.ifname)]
    release = sorted(pair for pair in _held(allocations) if not valid(*pair))
    return CleanupPlan([a for a in attachments if a not in stale], stale, release)


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
    ) -> None:
        self.dataplane = dataplane
        self.store = store
        self.node = node
        self.status_writer = status_writer
        self.default_namespace = default_namespace
        self.report = report  # where repairs of damaged IPAM files are reported
        self.refs = refs  # who each attachment is, on disk, for a restarted agent
        self.locks = ContainerLocks()
        self.ready = False  # set once the data plane is in place and pods reconciled
        self._range_sets = [node_range_set(node)]
        self._attached: dict[Pair, PodAttachment] = {}
        self._pods: dict[Pair, PodRef] = {}  # who each pair is, for DEL's status update
        self._added_at: dict[Pair, float] = {}

    async def handle(self, req: CniRequest) -> CniResult | None:
        """Run one CNI command, serial per container; raise ``CniError`` on failure."""
        handlers = {"ADD": self.add, "DEL": self.delete, "CHECK": self.check}
        handlers |= {"GC": self.gc, "STATUS": self.status}
        handler = handlers.get(req.command)
        if handler is None:
            raise CniError(ERR_INVALID_NETWORK_CONFIG, f"unsupported command {req.command}")
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT), self.locks.hold(req.container_id):
                return await handler(req)
        except Exception as exc:
            raise as_cni_error(exc) from exc

    async def add(self, req: CniRequest) -> CniResult:
        """Allocate, wire, answer; the Pod status is written in the background."""
        pair = (req.container_id, req.ifname)
        if pair in self._attached:
            raise CniError(ERR_DATAPLANE, "interface already exists", f"{pair[1]} of {pair[0]}")
        ref = pod_ref(req, self.default_namespace)
        if self.status_writer is not None:
            await self.status_writer.check_api(ref)
        allocation = (await self._allocate(pair))[0]
        try:
            attachment = await self.dataplane.attach_pod(self._pod_network(req, ref, allocation))
        except BaseException:
            await self._undo_add(req)
            raise
        self._remember(pair, attachment, ref)
        if self.refs is not None:
            await asyncio.to_thread(self.refs.record, pair, (ref.namespace, ref.name))
        if self.status_writer is not None:
            self.status_writer.running(ref, allocation.address.ip, req.container_id)
        return cni_result(attachment, self.node.cluster_networks)

    async def delete(self, req: CniRequest) -> None:
        """Unwire and release; fine when already gone or when the netns is missing."""
        pair = (req.container_id, req.ifname)
        await self.dataplane.detach_pod(pair[0], pair[1], req.netns or None)
        ref = self._forget(pair) or pod_ref(req, self.default_namespace)
        released = await asyncio.to_thread(self.store.release, *pair)
        if self.status_writer is not None:
            for ip in released:
                self.status_writer.released(ref, ip)

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
            return in_list or recent or self.locks.busy(cid)

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
        await self._undo(plan, "start-up cleanup")
        self._attached = {(a.container_id, a.ifname): a for a in plan.healthy}
        await self._republish(plan.healthy)
        log.info(
            "%d pods attached and healthy; %d detached, %d addresses released",
            len(plan.healthy),
            len(plan.detach),
            len(plan.release),
        )
        return plan

    async def _republish(self, healthy: list[PodAttachment]) -> None:
        """Write every healthy pod's status again: a killed agent may have answered an
        ADD without writing it. Records of pods no longer attached are dropped."""
        if self.refs is None:
            return
        refs = await asyncio.to_thread(self.refs.load)
        for a in healthy:
            pair = (a.container_id, a.ifname)
            ref = refs.pop(pair, None)
            if ref is None:
                continue
            self._pods[pair] = PodRef(*ref)
            if self.status_writer is not None:
                self.status_writer.running(PodRef(*ref), a.address.ip, a.container_id)
        for pair in refs:
            await asyncio.to_thread(self.refs.forget, pair)

    async def _allocate(self, pair: Pair) -> list[Allocation]:
        return await asyncio.to_thread(self.store.allocate, *pair, self._range_sets)

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
        for a in plan.detach:
            log.info("%s: detaching %s/%s (%s)", why, a.container_id, a.ifname, a.address)
            async with self.locks.hold(a.container_id):
                await self.dataplane.detach_pod(a.container_id, a.ifname, a.sandbox or None)
            self._forget((a.container_id, a.ifname))
        for cid, ifname in plan.release:
            async with self.locks.hold(cid):
                freed = await asyncio.to_thread(self.store.release, cid, ifname)
            log.info("%s: released %s of %s/%s", why, [str(ip) for ip in freed], cid, ifname)
