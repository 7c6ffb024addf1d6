"""The master's CSR approver and signer: a loop over the CertificateSigningRequests.

It runs in the master process only, the one holder of the cluster CA's key; what it
decides and signs is ``podnet.controllers.csrapproval``'s. It writes through the
registry like any client (``/approval``, then ``/status``), so the update rules of
``podnet.api.csrupdate`` hold for it too: it cannot sign what is not Approved. Expired
requests are removed (``csrapproval.expired``: finished after an hour, pending after a
day), which also bounds what a requester leaves in etcd. Every master runs it; two
writing the same request meet etcd's optimistic concurrency and one of them retries on
the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from podnet.api.csrrestriction import BOUND_NODE_EXTRA
from podnet.api.identity import BOOTSTRAP_USER_PREFIX
from podnet.api.objects import now_rfc3339
from podnet.api.pki import CLIENT_VALIDITY
from podnet.api.registry import Registry
from podnet.api.tokenissue import spend_bootstrap
from podnet.api.tokenrecords import RecordError
from podnet.api.watchcache import WatchCache
from podnet.controllers.csrapproval import SignError, certificate_for, decide, expired
from podnet.model import errors
from podnet.model.csr import APPROVED, DENIED, FAILED, certificate_of, has_condition
from podnet.model.kinds import CERTIFICATE_SIGNING_REQUEST as CSR
from podnet.store.base import StoreUnavailable

log = logging.getLogger(__name__)
INTERVAL = 1.0  # seconds between rounds at most (a request's change starts one sooner)
CONCURRENT = 16  # requests handled at once in a round


def _condition(type_: str, reason: str, message: str) -> dict[str, Any]:
    now = now_rfc3339()
    return {
        "type": type_,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    }


def _with_condition(obj: dict[str, Any], condition: dict[str, Any]) -> dict[str, Any]:
    status = dict(obj.get("status") or {})
    status["conditions"] = [*(status.get("conditions") or []), condition]
    return {**obj, "status": status}


class CsrSigner:
    """Approves what policy allows, and signs every Approved request it may."""

    def __init__(
        self,
        registry: Registry,
        ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
        interval: float = INTERVAL,
        cache: WatchCache | None = None,
        duration: dt.timedelta = CLIENT_VALIDITY,
    ) -> None:
        """``duration``: the lifetime of the certificates it signs (a request may ask for
        less), ``podnet master --cluster-signing-duration``."""
        self.registry = registry
        self.duration = duration
        self.cache = cache  # the master's watch cache: a round then reads no etcd
        self.ca_cert, self.ca_key = ca
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._written = 0  # the latest revision this signer wrote

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="csr-signer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            seen = self.cache.latest_revision if self.cache is not None else 0
            try:
                await self.sync()
            except StoreUnavailable as exc:
                log.warning("CSR signer: storage unavailable: %s", exc)
            except Exception:
                log.exception("CSR signer round failed")
            await self._next_round(seen)

    async def _next_round(self, seen: int) -> None:
        """Wait ``interval``, or less: with the watch cache, until a request changes
        after revision ``seen`` (a new one is handled at once, not up to a round later;
        the signer's own writes wake it once more, for a round with nothing to do).
        The cache first catches up with those writes: a round that read a request as it
        was before them would sign it again, and fail to store that."""
        if self.cache is None:
            await asyncio.sleep(self.interval)
            return
        await self.cache.wait_for(self._written, self.interval)
        events = self.cache.follow(seen, self.interval, CSR)  # woken by requests only
        try:
            await anext(events)
        except errors.ApiError:  # the cache moved past ``seen``: a round reads it anew
            pass
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    async def sync(self) -> None:
        """One round: remove the expired requests, handle those not yet finished (read
        from the watch cache when there is one: it may trail etcd by the watch's delay,
        and a write on a stale object fails and is retried the next round). Up to
        ``CONCURRENT`` requests are handled at once: each is a few etcd writes, and 100
        nodes joining together should not wait for each other's in turn."""
        if self.cache is not None:
            items = [cached.obj for _, cached in self.cache.objects(CSR)[0]]
        else:
            items, _ = await self.registry.list(CSR)
        now = dt.datetime.now(dt.UTC)
        slots = asyncio.Semaphore(CONCURRENT)

        async def one(obj: dict[str, Any]) -> None:
            if expired(obj, now):
                async with slots:
                    with contextlib.suppress(errors.ApiError):  # gone already
                        await self.registry.delete(CSR, None, obj["metadata"]["name"])
                return
            if certificate_of(obj) or has_condition(obj, DENIED) or has_condition(obj, FAILED):
                return
            async with slots:
                try:
                    await self._handle(obj)
                except errors.ApiError as exc:  # changed meanwhile: the next round sees it
                    log.info("CSR %s: %s", obj["metadata"]["name"], exc)

        outcomes = await asyncio.gather(*(one(o) for o in items), return_exceptions=True)
        for outcome in outcomes:  # every request's writes are over before a failure shows
            if isinstance(outcome, BaseException):
                raise outcome

    async def _handle(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if not has_condition(obj, APPROVED):
            decision = decide(obj)
            if decision is None:
                return
            condition = _condition(decision.type, decision.reason, decision.message)
            obj = await self._write(_with_condition(obj, condition), "approval")
            log.info("CSR %s: %s (%s)", name, decision.type, decision.message)
            if decision.type != APPROVED:
                return
        try:
            certificate = certificate_for(obj, self.ca_cert, self.ca_key, self.duration)
        except SignError as exc:
            failed = _with_condition(obj, _condition(FAILED, "SignerValidationFailure", str(exc)))
            await self._write(failed, "status")
            log.warning("CSR %s not signed: %s", name, exc)
            return
        status = {**(obj.get("status") or {}), "certificate": certificate}
        await self._write({**obj, "status": status}, "status")
        log.info("CSR %s signed", name)
        await self._spend_token(obj)

    async def _write(self, obj: dict[str, Any], subresource: str) -> dict[str, Any]:
        """Update a request's ``subresource``; the revision written is noted (see
        ``_next_round``)."""
        written = await self.registry.update(CSR, obj, None, obj["metadata"]["name"], subresource)
        version = int(written["metadata"].get("resourceVersion") or 0)
        self._written = max(self._written, version)
        return written

    async def _spend_token(self, obj: dict[str, Any]) -> None:
        """A node-bound bootstrap token is used up once its node has a certificate."""
        spec = obj.get("spec") or {}
        user = str(spec.get("username") or "")
        if BOUND_NODE_EXTRA not in (spec.get("extra") or {}):
            return
        if not user.startswith(BOOTSTRAP_USER_PREFIX):
            return
        ident = user.removeprefix(BOOTSTRAP_USER_PREFIX)
        try:
            if await spend_bootstrap(self.registry.store, self.registry.prefix, ident):
                log.info("bootstrap token %s used up (bound to one node)", ident)
        except (StoreUnavailable, RecordError) as exc:
            log.warning("bootstrap token %s not marked used up: %s", ident, exc)
