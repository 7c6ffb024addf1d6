"""The master's authenticator: bearer tokens from their hashed records in the store.

Every master keeps a table of the token records (``podnet.api.tokenrecords``), digest ->
record, loaded by a list of the records' prefix and kept current by a watch on it, and
confirmed by a new list every ``RELIST_SECONDS`` (a watch is silent when nothing
changes, so only a list proves the table is current). A token is looked up by its
digest, compared in constant time:

- not in the table: read once from the store directly (created on another master a
  moment ago), and kept;
- the table not confirmed current for ``FRESH_SECONDS`` (the watch broke, the store does
  not answer): every lookup reads the store directly, and fails (503) when it cannot:
  fail closed, never a stale grant. So a deleted record stops its token on every master
  within ``FRESH_SECONDS`` (< 5 s) at worst, at once while the watch works;
- expired (or a bootstrap token without the ``authentication`` usage): 401.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from podnet.api.identity import User
from podnet.api.tokenrecords import (
    RecordError,
    TokenRecord,
    decode,
    digest,
    digest_of_key,
    token_key,
    tokens_prefix,
    usable,
)
from podnet.model.errors import unauthorized
from podnet.store.base import (
    Compacted,
    KeyValue,
    Store,
    StoreError,
    StoreUnavailable,
    WatchEvent,
)

log = logging.getLogger(__name__)

RELIST_SECONDS = 1.5  # a list confirms the table this often
FRESH_SECONDS = 4.0  # older than this, the table is not trusted (revocation bound < 5 s)
RETRY_SECONDS = 0.5
DIRECT_READS = 16  # concurrent direct reads of unknown tokens, at most


@dataclass(frozen=True)
class _Entry:
    digest: bytes
    record: TokenRecord | None  # None: deleted at ``revision`` (kept until a list passes it)
    revision: int


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; 401 otherwise."""
    if not header:
        raise unauthorized()
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        raise unauthorized()
    if not (token.isascii() and token.isprintable()):  # tokens are ASCII; never encode junk
        raise unauthorized()
    return token


class TokenAuthenticator:
    """Authenticates bearer tokens against the token records under ``prefix``."""

    def __init__(
        self,
        store: Store,
        prefix: str,
        relist_seconds: float = RELIST_SECONDS,
        fresh_seconds: float = FRESH_SECONDS,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self._records_prefix = tokens_prefix(prefix)
        self._relist_seconds = relist_seconds
        self._fresh_seconds = fresh_seconds
        self._table: dict[str, _Entry] = {}
        self._confirmed = float("-inf")  # monotonic start of the last list that succeeded
        self._revision = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._direct = asyncio.Semaphore(DIRECT_READS)

    # ---- keeping the table ------------------------------------------------------------

    async def start(self) -> None:
        """Load the table (fails when the store does not answer), then keep it current."""
        await self._relist()
        self._tasks = [
            asyncio.create_task(self._watch_forever(), name="token-watch"),
            asyncio.create_task(self._relist_forever(), name="token-relist"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    @property
    def fresh(self) -> bool:
        """Whether the table was confirmed current within ``fresh_seconds``."""
        return time.monotonic() - self._confirmed < self._fresh_seconds

    async def _relist(self) -> None:
        started = time.monotonic()
        items, revision = await self.store.list(self._records_prefix)
        self._merge_list(items, revision)
        self._confirmed = started
        self._revision = max(self._revision, revision)

    def _merge_list(self, items: Iterable[KeyValue], revision: int) -> None:
        """The listed records at ``revision``, keeping what the watch saw after it."""
        listed: dict[str, _Entry] = {}
        for kv in items:
            entry = self._entry(kv.key, kv.value, kv.mod_revision)
            if entry is not None:
                listed[digest_of_key(self.prefix, kv.key) or ""] = entry
        table = dict(listed)
        for key, entry in self._table.items():
            if entry.revision > revision:  # newer than the list: the watch's word stands
                table[key] = entry
        self._table = {
            k: e for k, e in table.items() if e.record is not None or e.revision > revision
        }

    def _entry(self, key: str, value: bytes, revision: int) -> _Entry | None:
        hex_digest = digest_of_key(self.prefix, key)
        if hex_digest is None:
            return None
        try:
            record = decode(value)
        except RecordError as exc:
            log.warning("ignoring the token record %s: %s", hex_digest[:16], exc)
            record = None
        return _Entry(bytes.fromhex(hex_digest), record, revision)

    def _apply(self, event: WatchEvent) -> None:
        hex_digest = digest_of_key(self.prefix, event.key)
        if hex_digest is None:
            return
        current = self._table.get(hex_digest)
        if current is not None and current.revision >= event.revision:
            return
        if event.type == "DELETE":
            self._table[hex_digest] = _Entry(bytes.fromhex(hex_digest), None, event.revision)
            return
        entry = self._entry(event.key, event.value, event.revision)
        if entry is not None:
            self._table[hex_digest] = entry

    async def _watch_forever(self) -> None:
        while True:
            try:
                async for event in self.store.watch(self._records_prefix, self._revision):
                    self._apply(event)
                    self._revision = max(self._revision, event.revision)
                raise StoreUnavailable("the token watch ended")
            except asyncio.CancelledError:
                raise
            except Compacted:
                await self._relist_quietly()
            except Exception as exc:
                log.warning("token watch broke (%s); watching again", exc)
                await asyncio.sleep(RETRY_SECONDS)
                await self._relist_quietly()

    async def _relist_quietly(self) -> None:
        try:
            await self._relist()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("cannot list the token records: %s", exc)

    async def _relist_forever(self) -> None:
        while True:
            await asyncio.sleep(self._relist_seconds)
            await self._relist_quietly()

    # ---- lookups ------------------------------------------------------------------------

    async def _read(self, hex_digest: str) -> _Entry | None:
        """The record from the store itself; ``StoreUnavailable`` (503) when the store does
        not answer, whatever its error: fail closed."""
        try:
            async with self._direct:
                kv = await self.store.get(token_key(self.prefix, hex_digest))
        except StoreUnavailable:
            raise
        except (StoreError, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot read the token record: {exc}") from exc
        if kv is None:
            return None
        entry = self._entry(kv.key, kv.value, kv.mod_revision)
        current = self._table.get(hex_digest)
        if entry is not None and (current is None or current.revision < entry.revision):
            self._table[hex_digest] = entry
        return entry

    async def lookup(self, token: str) -> TokenRecord | None:
        """The usable record of ``token``, or None (unknown, deleted or expired)."""
        presented = digest(token)
        entry = self._table.get(presented) if self.fresh else None
        if entry is None:
            entry = await self._read(presented)
        expected = entry.digest if entry is not None else b""
        if entry is None or not hmac.compare_digest(bytes.fromhex(presented), expected):
            return None
        record = entry.record
        return record if record is not None and usable(record) else None

    async def authenticate_request(self, authorization_header: str | None) -> User:
        """The user of an ``Authorization: Bearer <token>`` header; 401 otherwise."""
        record = await self.lookup(bearer_token(authorization_header))
        if record is None:
            raise unauthorized()
        return record.identity()

    def users(self) -> list[User]:
        """Every user the table knows (for diagnostics)."""
        return [e.record.identity() for e in self._table.values() if e.record is not None]
