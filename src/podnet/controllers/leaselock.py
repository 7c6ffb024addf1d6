"""Leader election through the API: a coordination.k8s.io Lease, as client-go's LeaseLock.

For controllers that run as their own process (``podnet controllers``) and reach the API
only over HTTPS. The holder writes its identity and ``renewTime`` into the Lease
``kube-system/podnet-controllers`` every ``renew_every`` seconds, each write pinned to the
resourceVersion it read, so two candidates never both win one write.

A candidate judges expiry by its own clock (other clocks may be off): it notes when it
last saw the Lease's record change and takes over only once ``duration`` seconds passed
without a change. The holder declares itself no longer leader (``lost``) when it has not
renewed for ``renew_deadline`` seconds, which is shorter than ``duration``: it stops
acting before anyone may take over. ``release`` empties ``holderIdentity``, so that a
waiting candidate takes over at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from podnet.agent.heartbeat import micro_time, renewed
from podnet.client.errors import ClientError, has_reason, is_transient, one_line
from podnet.controllers.calls import ControllerApi, call, get_or_none
from podnet.controllers.workqueue import cancel_all
from podnet.model.kinds import LEASE, NAMESPACE
from podnet.model.schemas_coordination import CONTROLLERS_LEASE_NAME, CONTROLLERS_LEASE_NAMESPACE

log = logging.getLogger("podnet.controllers.leaselock")

Obj = dict[str, Any]
LEASE_NAMESPACE = CONTROLLERS_LEASE_NAMESPACE
LEASE_NAME = CONTROLLERS_LEASE_NAME
DEFAULT_DURATION = 15  # seconds, client-go's default lease duration


@dataclass(eq=False)
class ApiLeaseElector:
    """Leadership as a Lease object written through the object API."""

    api: ControllerApi
    identity: str
    duration: int = DEFAULT_DURATION  # the Lease's leaseDurationSeconds
    name: str = LEASE_NAME
    namespace: str = LEASE_NAMESPACE
    clock: Callable[[], float] = time.monotonic
    lost: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _observed: tuple[str, str] | None = field(default=None, init=False)  # (holder, renewTime)
    _observed_at: float = field(default=0.0, init=False)  # when it last changed
    _renewed_at: float = field(default=0.0, init=False)
    _leading: bool = field(default=False, init=False)
    _keepalive: list[asyncio.Task[None]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.duration < 2:
            raise ValueError("the lease duration must be at least 2 seconds")

    @property
    def renew_every(self) -> float:
        return self.duration / 5

    @property
    def renew_deadline(self) -> float:
        """How long the holder may go without a renewal before it stops leading."""
        return self.duration * 2 / 3

    async def acquire(self) -> None:
        """Block until this process holds the Lease; then keep renewing it."""
        await self.release()
        self.lost = asyncio.Event()
        while not await self._attempt():  # an unreachable API is retried for ever
            await asyncio.sleep(self.renew_every * random.uniform(0.5, 1.0))
        self._leading, self._renewed_at = True, self.clock()
        self._keepalive.append(asyncio.create_task(self._keep_renewing(), name="lease-renew"))
        log.info("%s is now the leader (Lease %s/%s)", self.identity, self.namespace, self.name)

    async def release(self) -> None:
        """Stop renewing and hand the Lease over (idempotent; best effort)."""
        await cancel_all(self._keepalive)
        self._keepalive.clear()
        if not self._leading:
            return
        self._leading = False
        try:
            lease = await get_or_none(self.api, LEASE, self.namespace, self.name)
            if lease is not None and _holder(lease) == self.identity:
                body = {**lease, "spec": {**lease["spec"], "holderIdentity": ""}}
                await call(lambda: self.api.update(LEASE, body), f"release Lease {self.name}")
                log.info("%s released leadership", self.identity)
        except ClientError as exc:  # it then expires by itself
            log.warning("could not release Lease %s (%s); it expires", self.name, exc)

    # ---- one attempt ------------------------------------------------------------------

    async def _attempt(self) -> bool:
        """Take or renew the Lease once; False when another holder has it (or won a race)."""
        try:
            lease = await self.api.get(LEASE, self.namespace, self.name)
        except Exception as exc:
            if has_reason(exc, "NotFound"):
                return await self._create()
            return self._failed(exc)
        self._observe(lease)
        holder = _holder(lease)
        if holder and holder != self.identity and not self._expired(lease):
            return False
        if holder != self.identity:
            log.info("%s takes the Lease over from %r", self.identity, holder)
        body = renewed(lease, self.identity, self.duration, micro_time())
        try:
            await self.api.update(LEASE, body)
        except Exception as exc:
            return False if has_reason(exc, "Conflict") else self._failed(exc)
        return True

    async def _create(self) -> bool:
        now = micro_time()
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration}
        spec |= {"acquireTime": now, "renewTime": now, "leaseTransitions": 0}
        body = {
            "apiVersion": LEASE.api_version,
            "kind": LEASE.kind,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        try:
            await self.api.create(LEASE, body, self.namespace)
        except Exception as exc:
            if has_reason(exc, "NotFound"):  # no namespace yet: make it, then try again
                return await self._create_namespace()
            return False if has_reason(exc, "AlreadyExists") else self._failed(exc)
        return True

    async def _create_namespace(self) -> bool:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        try:
            await self.api.create(NAMESPACE, body)
        except Exception as exc:
            if not has_reason(exc, "AlreadyExists"):
                return self._failed(exc)
        return False

    def _failed(self, exc: BaseException) -> bool:
        if not is_transient(exc):
            raise exc
        log.warning("leader election on Lease %s: %s", self.name, one_line(exc))
        return False

    def _observe(self, lease: Obj) -> None:
        record = (_holder(lease), str((lease.get("spec") or {}).get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()

    def _expired(self, lease: Obj) -> bool:
        seconds = (lease.get("spec") or {}).get("leaseDurationSeconds") or self.duration
        return self.clock() - self._observed_at >= float(seconds)

    # ---- holding ----------------------------------------------------------------------

    async def _keep_renewing(self) -> None:
        while True:
            await asyncio.sleep(self.renew_every)
            left = self.renew_deadline - (self.clock() - self._renewed_at)
            try:
                async with asyncio.timeout(max(left, 0.0)):  # a hung call must not outlast it
                    renewed_now = await self._attempt()
            except TimeoutError:
                renewed_now = False
            except Exception as exc:
                self._lose(f"renewal refused: {one_line(exc)}")
                return
            if renewed_now:
                self._renewed_at = self.clock()
            elif self._observed and self._observed[0] not in ("", self.identity):
                self._lose(f"the Lease names {self._observed[0]!r} now")
                return
            elif self.clock() - self._renewed_at >= self.renew_deadline:
                self._lose(f"no renewal for {self.renew_deadline:.0f}s")
                return

    def _lose(self, why: str) -> None:
        log.error("%s lost leadership of Lease %s: %s", self.identity, self.name, why)
        self._leading = False
        self.lost.set()


def _holder(lease: Obj) -> str:
    return str((lease.get("spec") or {}).get("holderIdentity") or "")
