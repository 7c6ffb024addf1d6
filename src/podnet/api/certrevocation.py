"""Revoked client certificates: every certificate of a user issued before a moment.

A removed node (``podnet adm node remove``) must lose its client certificate on every
master, though certificates are not listed anywhere: the revocation is a record per user,
``<prefix>identities/revoked/<sha256 hex of the user name>`` = ``{"user", "before"}``,
and a certificate of that user issued earlier than ``before`` is refused (the moment of
issue: ``podnet.api.pki.issued_at``, notBefore less the signer's backdate).
A node that joins again later gets a new certificate, issued after the moment, which
works.

Every master polls the records' prefix (``POLL_SECONDS``; a handful of small keys) and
refuses to decide on a table older than ``FRESH_SECONDS``: a certificate presented then
gets 503, never a stale yes. So a revocation holds on every master within 5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
import logging
import time

from podnet.api.identity import User
from podnet.api.tokenrecords import now
from podnet.store.base import Put, Store, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

REVOKED_DIR = "identities/revoked/"
POLL_SECONDS = 2.0  # with FRESH_SECONDS: a revocation holds on every master within 5 s
FRESH_SECONDS = 4.0


def revoked_prefix(prefix: str) -> str:
    return (prefix if prefix.endswith("/") else prefix + "/") + REVOKED_DIR


def revoked_key(prefix: str, user: str) -> str:
    return revoked_prefix(prefix) + hashlib.sha256(user.encode()).hexdigest()


def encode(user: str, before: datetime.datetime) -> bytes:
    return json.dumps({"user": user, "before": before.isoformat()}).encode()


def decode(value: bytes) -> tuple[str, datetime.datetime]:
    """(user, moment) of a record; ValueError if it is not one."""
    body = json.loads(value)
    before = datetime.datetime.fromisoformat(str(body["before"]))
    if before.tzinfo is None:
        raise ValueError("a revocation moment needs its time zone")
    return str(body["user"]), before


async def revoke_certificates(store: Store, prefix: str, user: str) -> datetime.datetime:
    """Revoke every certificate of ``user`` issued until now; return the moment. A
    certificate issued in this very second is revoked too (the moment is the next one)."""
    moment = now() + datetime.timedelta(seconds=1)
    await store.commit([], [Put(revoked_key(prefix, user), encode(user, moment))])
    return moment


class RevokedCertificates:
    """The master's view of the revocations, polled from the store."""

    def __init__(self, store: Store, prefix: str) -> None:
        self.store = store
        self.prefix = prefix
        self._revoked: dict[str, datetime.datetime] = {}
        self._confirmed = float("-inf")  # monotonic time of the last good poll
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._poll()
        self._task = asyncio.create_task(self._forever(), name="certificate revocations")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _forever(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            try:
                await self._poll()
            except (StoreError, StoreUnavailable, OSError) as exc:
                log.warning("certificate revocations not read: %s", exc)

    async def _poll(self) -> None:
        items, _ = await self.store.list(revoked_prefix(self.prefix))
        table: dict[str, datetime.datetime] = {}
        for kv in items:
            try:
                user, before = decode(kv.value)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("skipping the revocation record %s: %s", kv.key, exc)
                continue
            table[user] = max(before, table.get(user, before))
        self._revoked = table
        self._confirmed = time.monotonic()

    def revoked(self, user: User, serial: int, issued: datetime.datetime) -> bool:
        """Whether the certificate of ``user`` issued at ``issued`` is revoked;
        ``StoreUnavailable`` (503) while the table is not known to be current."""
        if time.monotonic() - self._confirmed > FRESH_SECONDS:
            raise StoreUnavailable("certificate revocations are not current; try again")
        before = self._revoked.get(user.name)
        return before is not None and issued < before
