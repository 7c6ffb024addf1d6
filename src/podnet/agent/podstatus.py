"""Pod status writes: which Pod a CNI request is for, and the background writer that
records a pod's IP on its Pod object (and clears it on release).

Preconditions keep a write on the Pod it was meant for: the writer remembers the uid of
the Pod it first wrote for an ADD, and every later write for it carries that uid (409 if
the Pod was replaced; the write is dropped). It creates a (mirror) Pod only for an ADD
(or, after a restart, for an ADD that found no Pod and whose mirror the killed agent had
not made: ``podnet.agent.podrefs``), and only while it has seen no Pod of that name
since: a retry never re-creates a Pod that was deleted meanwhile. When a sandbox is gone
(DEL, GC, start-up cleanup, orphan teardown), the mirror Pod made for it is deleted
(grace 0, its uid as precondition).

ADD never waits on the master: the writer keeps the latest wish per pod and applies it
serially per pod, with backoff, until a deadline. Only ``check_api`` runs inside ADD, so a
pod is not wired while the API cannot record it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Any

from podnet.client import ClientError, NotFound, has_reason, is_transient, with_retry
from podnet.client.aio import AsyncApiClient
from podnet.client.paths import resource_path
from podnet.client.wire import Call
from podnet.cni.types import ERR_TRY_AGAIN_LATER, CniError, CniRequest
from podnet.model.kinds import POD
from podnet.model.schemas_names import dns_subdomain_problem

log = logging.getLogger("podnet.agent.pods")

Obj = dict[str, Any]
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
CONTAINER_ANNOTATION = "podnet.io/container-id"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
WRITES_IN_FLIGHT = 4
FINISHED = ("Succeeded", "Failed")  # phases the agent never overwrites with Running
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
    """What the Pod status should say: ``ip`` running, or ``ip`` released (None: none
    was held); ``gone``: the sandbox of ``container_id`` is gone (its mirror Pod goes);
    ``create``: an ADD's, which may create a mirror Pod."""

    ip: IPv4Address | None
    running: bool
    container_id: str = ""
    gone: bool = False
    create: bool = False


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
        self._uids: dict[PodRef, str] = {}  # the Pod each ADD's writes are for
        # Told (Pod, container ID) once a mirror Pod is made for an ADD's sandbox.
        self.on_created: Callable[[PodRef, str], Awaitable[None]] | None = None

    async def check_api(self, ref: PodRef, timeout: float = API_CHECK_TIMEOUT) -> str | None:
        """The uid of the Pod ``ref`` ("" when there is none, None when it may not be
        read). Raise CNI error 11 ("try again later") unless the API answers the read
        within ``timeout``: a pod wired while the master or etcd (e.g. without quorum)
        cannot record it would run unknown to the API; the runtime retries the ADD."""
        try:
            async with asyncio.timeout(timeout):
                pod = await self.api.get_or_none(POD, ref.namespace, ref.name)
        except (TimeoutError, ClientError) as exc:
            if not is_transient(exc):
                return None  # e.g. not allowed to read it: the API is up, the writer tells
            why = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise CniError(
                ERR_TRY_AGAIN_LATER,
                "the API server is unavailable; try again later",
                f"reading pod {ref}: {why}",
            ) from exc
        return str(pod["metadata"].get("uid") or "") if pod is not None else ""

    def running(self, ref: PodRef, ip: IPv4Address, container_id: str, create: bool = True) -> None:
        """Record that ``ref`` runs with ``ip``: a new ADD's (``create``: it may make a
        mirror Pod), or a known pod's status written again (at start-up)."""
        if create:
            self._uids.pop(ref, None)  # a new sandbox: whichever Pod it finds is its own
        self._wish(ref, PodWish(ip, True, container_id, create=create))

    def released(
        self, ref: PodRef, ip: IPv4Address | None, container_id: str = "", gone: bool = False
    ) -> None:
        """Record that ``ip`` of ``ref`` was released, and (``gone``) that the sandbox of
        ``container_id`` is gone. A newer IP wish wins."""
        pending = self._wishes.get(ref)
        if pending is None or not pending.running or pending.ip == ip:
            self._wish(ref, PodWish(ip, False, container_id, gone=gone))

    def pending(self, ref: PodRef) -> bool:
        """Whether a write for ``ref`` is waiting or in progress."""
        return ref in self._tasks

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
        except ClientError as exc:
            if is_transient(exc):
                log.warning("pod %s: status not recorded (gave up): %s", ref, exc)
            else:
                log.warning("pod %s: status not recorded: %s", ref, exc)
        except Exception as exc:
            log.warning("pod %s: status not recorded (gave up): %s", ref, exc)

    async def _write(self, ref: PodRef, wish: PodWish) -> None:
        async with self._slots:
            await self._write_now(ref, wish)

    async def _write_now(self, ref: PodRef, wish: PodWish) -> None:
        if ref in self._wishes:
            return  # a newer wish came meanwhile: it is applied next, this one is stale
        pod = await self.api.get_or_none(POD, ref.namespace, ref.name)
        seen = self._uids.get(ref)
        if pod is not None and seen is not None and pod["metadata"].get("uid") != seen:
            log.warning("pod %s was replaced (uid %s); its status is not written", ref, seen)
        elif pod is not None and (pod.get("spec") or {}).get("nodeName") != self.node_name:
            log.warning("pod %s is not bound to this node; its IP is not recorded", ref)
        elif wish.running:
            await self._write_running(ref, wish, pod)
        elif pod is not None and wish.gone and _mirror_of(pod, wish.container_id):
            await delete_pod(self.api, pod)
            log.info("mirror pod %s deleted: its sandbox %s is gone", ref, wish.container_id)
        elif pod is not None and (pod.get("status") or {}).get("podIP") == str(wish.ip):
            meta = {"resourceVersion": pod["metadata"]["resourceVersion"]}
            meta["uid"] = pod["metadata"]["uid"]
            clear = {"metadata": meta, "status": {"podIP": None, "podIPs": None}}
            await self.api.patch(POD, ref.namespace, ref.name, clear, subresource="status")

    async def _write_running(self, ref: PodRef, wish: PodWish, pod: Obj | None) -> None:
        ip = str(wish.ip)
        status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        status["hostIP"] = str(self.node_ip)
        if ((pod or {}).get("status") or {}).get("phase") in FINISHED:
            del status["phase"]  # its process ended (the runtime wrote it): it stays ended
        if pod is None:
            if not wish.create or ref in self._uids:
                log.warning("pod %s is gone; its status is not written", ref)
                return  # deleted since: only a new ADD may create it
            created = await self.api.create(POD, self._new_pod(ref, wish, status), ref.namespace)
            self._uids[ref] = created["metadata"]["uid"]
            if self.on_created is not None:
                await self.on_created(ref, wish.container_id)
            return
        uid = self._uids.setdefault(ref, pod["metadata"]["uid"])
        if any((pod.get("status") or {}).get(k) != v for k, v in status.items()):
            patch = {"metadata": {"uid": uid}, "status": status}
            await self.api.patch(POD, ref.namespace, ref.name, patch, subresource="status")

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


def _mirror_of(pod: Obj, container_id: str) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return bool(container_id) and annotations.get(MIRROR_ANNOTATION) == container_id


async def delete_pod(api: AsyncApiClient, pod: Obj) -> None:
    """Delete ``pod`` at once (grace 0), only if it is still that Pod (its uid): what a
    node does when the pod's sandbox is gone. Fine when it is already gone."""
    meta = pod["metadata"]
    path = resource_path(POD, meta["namespace"], meta["name"])
    options = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
    with contextlib.suppress(NotFound):
        await api.request(Call("DELETE", path, options))


def pod_ref(req: CniRequest, default_namespace: str) -> PodRef:
    """The Pod a request is for: K8S_POD_NAMESPACE/K8S_POD_NAME, else the config's
    ``namespace`` (or ``default_namespace``) and the container ID. The name is made a
    valid Pod name when it is not one (podman passes its container's name, and its random
    names hold "_"): see ``valid_pod_name``."""
    config_ns = req.config.namespace if req.config else None
    namespace = req.args.get("K8S_POD_NAMESPACE") or config_ns or default_namespace
    name = req.args.get("K8S_POD_NAME") or req.container_id
    return PodRef(namespace, valid_pod_name(name))


def valid_pod_name(text: str) -> str:
    """``text`` if it is a valid Pod name (a DNS-1123 subdomain), else a valid name made
    from it: lower case, other characters "-", at most 240 of them, and 8 hex digits of
    its SHA-256, so two names that differ only where they were invalid stay apart."""
    if dns_subdomain_problem(text) is None:
        return text
    base = _NOT_DNS.sub("-", text.lower()).strip("-")[:240].strip("-") or "pod"
    return f"{base}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
