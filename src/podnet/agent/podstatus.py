"""Pod status writes: which Pod a CNI request is for, and the background writer that
records a pod's IP on its Pod object (and clears it on release).

ADD never waits on the master: the writer keeps the latest wish per pod and applies it
serially per pod, with backoff, until a deadline. Only ``check_api`` runs inside ADD, so a
pod is not wired while the API cannot record it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Any

from podnet.client import ClientError, has_reason, is_transient, with_retry
from podnet.client.aio import AsyncApiClient
from podnet.cni.types import ERR_TRY_AGAIN_LATER, CniError, CniRequest
from podnet.model.kinds import POD

log = logging.getLogger("podnet.agent.pods")

Obj = dict[str, Any]
_NOT_DNS = re.compile(r"[^a-z0-9.-]+")
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
                await self.api.get_or_none(POD, ref.namespace, ref.name)
        except (TimeoutError, ClientError) as exc:
            if not is_transient(exc):
                return  # e.g. not allowed to read it: the API is up, the writer will tell
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
        pod = await self.api.get_or_none(POD, ref.namespace, ref.name)
        if pod is not None and (pod.get("spec") or {}).get("nodeName") != self.node_name:
            log.warning("pod %s is not bound to this node; its IP is not recorded", ref)
        elif wish.running:
            await self._write_running(ref, wish, pod)
        elif pod is not None and (pod.get("status") or {}).get("podIP") == str(wish.ip):
            meta = {"resourceVersion": pod["metadata"]["resourceVersion"]}
            clear = {"metadata": meta, "status": {"podIP": None, "podIPs": None}}
            await self.api.patch(POD, ref.namespace, ref.name, clear, subresource="status")

    async def _write_running(self, ref: PodRef, wish: PodWish, pod: Obj | None) -> None:
        ip = str(wish.ip)
        status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        status["hostIP"] = str(self.node_ip)
        if ((pod or {}).get("status") or {}).get("phase") in FINISHED:
            del status["phase"]  # its process ended (the runtime wrote it): it stays ended
        if pod is None:
            await self.api.create(POD, self._new_pod(ref, wish, status), ref.namespace)
        elif any((pod.get("status") or {}).get(k) != v for k, v in status.items()):
            patch = {"status": status}
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


def pod_ref(req: CniRequest, default_namespace: str) -> PodRef:
    """The Pod a request is for: K8S_POD_NAMESPACE/K8S_POD_NAME, else the config's
    ``namespace`` (or ``default_namespace``) and the container ID made a DNS name."""
    config_ns = req.config.namespace if req.config else None
    namespace = req.args.get("K8S_POD_NAMESPACE") or config_ns or default_namespace
    name = req.args.get("K8S_POD_NAME") or _dns_name(req.container_id)
    return PodRef(namespace, name)


def _dns_name(text: str) -> str:
    return _NOT_DNS.sub("-", text.lower()).strip(".-")[:253] or "pod"
