"""``Store`` on a real etcd v3, through the asyncio client aetcd."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aetcd
import aetcd.exceptions
import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end

from podnet.store.base import (
    Absent,
    Compacted,
    Condition,
    Delete,
    KeyValue,
    ModRevisionIs,
    Operation,
    Put,
    StoreError,
    StoreUnavailable,
    WatchEvent,
)
from podnet.store.etcd_client import EtcdClient, parse_endpoints
from podnet.store.etcd_pki import EtcdTls
from podnet.store.etcdmetrics import EtcdMetrics
from podnet.store.health import StoreHealth
from podnet.store.readbatch import ReadBatcher

TIMEOUT = 10.0
TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)
# Errors after which a write may or may not have been applied (the leader member died
# with the proposal, or the connection broke after sending it): read back, then retry.
# "Stream removed" / "Broken pipe": the member the channel used died under the request
# (seen when one of three members is killed); the channel moves to another member.
BROKEN = ("Socket closed", "Connection reset", "Stream removed", "Broken pipe")
AMBIGUOUS = ("request timed out", "leader changed", *BROKEN)
AMBIGUOUS_RETRIES = 2
READ_RETRY = ("leader changed", *BROKEN)
PAGE = 2000  # keys per range request (a page of pods stays far below 4 MiB)


def _kv(raw: Any) -> KeyValue:
    return KeyValue(raw.key.decode(), bytes(raw.value), raw.create_revision, raw.mod_revision)


class EtcdStore:
    """Talks to an etcd cluster; every call has a deadline.

    ``endpoints`` is ``host:port``, several of them comma-separated, or a list: the
    client uses one member and fails over to the next (``podnet.store.etcd_client``).
    ``tls`` (CA, client certificate and key) is required by a TLS etcd. With
    ``fail_fast`` (the master's store), calls fail at once while etcd does not answer
    (``podnet.store.health``) instead of waiting for their deadline. ``metrics`` (the
    master's) times each call and counts its failures (``podnet.store.etcdmetrics``).
    """

    def __init__(
        self,
        endpoints: str | Sequence[str] = "127.0.0.1:2379",
        timeout: float = TIMEOUT,
        tls: EtcdTls | None = None,
        fail_fast: bool = False,
        metrics: EtcdMetrics | None = None,
    ) -> None:
        self.metrics = metrics
        self.endpoints = parse_endpoints(endpoints)
        self._client = EtcdClient(self.endpoints, tls, int(timeout))
        self._timeout = timeout
        self._gets: ReadBatcher[Any] = ReadBatcher(self._get_many)  # podnet.store.readbatch
        self.health = StoreHealth(self._probe) if fail_fast else None

    async def connect(self) -> None:
        try:
            await asyncio.wait_for(self._client.connect(), self._timeout)
        except (aetcd.exceptions.ClientError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot reach etcd: {exc}") from exc
        if self.health is not None:
            self.health.start()

    async def _probe(self, timeout: float) -> None:
        """A count-only read the connected member answers alone (serializable: a leader
        election is not an outage), failing at once when no member is reachable."""
        request = rpc.RangeRequest(key=b"\0", count_only=True, serializable=True)
        await self._client.kvstub.Range(
            request, timeout=timeout, metadata=self._client.metadata, wait_for_ready=False
        )

    def _guarded(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.health.guarded() if self.health is not None else contextlib.nullcontext()

    async def _call(self, method: str, request: Any) -> Any:
        """``method`` (``Range``, ``Txn``, ``Compact``) of the KV service, timed."""
        started = time.perf_counter()
        try:
            return await self._call_once(getattr(self._client.kvstub, method), request)
        except grpc.aio.AioRpcError as exc:
            self._failed(method, exc.code().name)
            message = f"etcd request failed: {exc.code().name}: {exc.details()}"
            if exc.code() in TRANSIENT:
                raise StoreUnavailable(message) from exc
            raise StoreError(message) from exc
        except StoreUnavailable:  # refused at once: the health probe finds etcd down
            self._failed(method, "UNAVAILABLE")
            raise
        finally:
            if self.metrics is not None:
                self.metrics.observe(method, time.perf_counter() - started)

    async def _call_once(self, stub_method: Any, request: Any) -> Any:
        # wait_for_ready: while the channel moves to another member (or waits for a
        # restarted one) a request waits, up to its deadline, instead of failing at once
        # (unless the health probe finds etcd down: then it fails at once).
        async with self._guarded():
            return await stub_method(
                request,
                timeout=self._timeout,
                metadata=self._client.metadata,
                wait_for_ready=True,
            )

    def _failed(self, operation: str, code: str) -> None:
        if self.metrics is not None:
            self.metrics.failed(operation, code)

    async def _read(self, request: Any, method: str = "Range") -> Any:
        """A Range (or a read-only Txn), retried (it changes nothing) when the etcd leader
        just changed."""
        for attempt in range(AMBIGUOUS_RETRIES + 1):
            try:
                return await self._call(method, request)
            except StoreUnavailable as exc:
                # Not after "request timed out": that read already waited 7 s for a leader.
                if attempt == AMBIGUOUS_RETRIES or not _ambiguous(exc, READ_RETRY):
                    raise
                await asyncio.sleep(random.uniform(0.05, 0.2))
        raise AssertionError("unreachable")

    async def get(self, key: str) -> KeyValue | None:
        raw = await self._gets.read(key.encode())
        return _kv(raw) if raw is not None else None

    async def _get_many(self, keys: Sequence[bytes]) -> list[Any]:
        """The stored key-values of ``keys`` (None where absent), read at one revision."""
        if len(keys) == 1:
            resp = await self._read(rpc.RangeRequest(key=keys[0]))
            return [resp.kvs[0] if resp.kvs else None]
        ops = [rpc.RequestOp(request_range=rpc.RangeRequest(key=key)) for key in keys]
        resp = await self._read(rpc.TxnRequest(compare=[], success=ops, failure=[]), "Txn")
        return [r.response_range.kvs[0] if r.response_range.kvs else None for r in resp.responses]

    async def list(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Read in pages at one revision, so a large prefix never exceeds gRPC's limit."""
        start, end = prefix.encode(), prefix_range_end(prefix.encode())
        items: list[KeyValue] = []
        revision, page = 0, PAGE
        while True:
            request = rpc.RangeRequest(key=start, range_end=end, limit=page, revision=revision)
            try:
                resp = await self._read(request)
            except (StoreError, StoreUnavailable) as exc:
                # A page of large objects (events, big pods) over gRPC's message limit:
                # read that part in smaller pages instead of failing the whole list.
                if "RESOURCE_EXHAUSTED" not in str(exc) or page == 1:
                    raise
                page = max(1, page // 4)
                continue
            revision = revision or resp.header.revision
            items.extend(_kv(kv) for kv in resp.kvs)
            if not resp.more or not resp.kvs:
                return items, revision
            start = resp.kvs[-1].key + b"\0"

    async def commit(
        self, conditions: Sequence[Condition], operations: Sequence[Operation]
    ) -> int | None:
        request = rpc.TxnRequest(
            compare=[_compare(c) for c in conditions],
            success=[_request_op(op) for op in operations],
            failure=[],
        )
        for attempt in range(AMBIGUOUS_RETRIES + 1):
            try:
                resp = await self._call("Txn", request)
                return resp.header.revision if resp.succeeded else None
            except StoreUnavailable as exc:
                # The etcd leader died with our proposal: it may or may not have been
                # committed. Read back; if our writes are there, it was; otherwise the
                # conditions decide again on the new leader.
                if attempt == AMBIGUOUS_RETRIES or not _ambiguous(exc):
                    raise
                applied = await self._applied(operations)
                if applied is not None:
                    return applied
        raise AssertionError("unreachable")

    async def _applied(self, operations: Sequence[Operation]) -> int | None:
        """The revision at which ``operations`` show in the store, or None if they don't."""
        revision = 0
        for op in operations:
            kv = await self.get(op.key)
            if isinstance(op, Put):
                if kv is None or kv.value != op.value:
                    return None
                revision = max(revision, kv.mod_revision)
            elif kv is not None:
                return None
        return revision or await self.revision()

    async def watch(self, prefix: str, after_revision: int) -> AsyncIterator[WatchEvent]:
        start = prefix.encode()
        watch = await self._open_watch(start, after_revision)
        try:
            async for event in watch:
                yield _event(event)
        except aetcd.exceptions.RevisionCompactedError as exc:
            self._failed("watch", "OUT_OF_RANGE")
            raise Compacted(after_revision, getattr(exc, "compacted_revision", 0)) from exc
        except aetcd.exceptions.ClientError as exc:
            self._failed("watch", "UNAVAILABLE")
            raise StoreUnavailable(f"etcd watch failed: {exc}") from exc
        finally:
            await watch.cancel()

    async def _open_watch(self, start: bytes, after_revision: int) -> Any:
        """A watch of ``start``'s prefix after ``after_revision``, its opening timed."""
        started = time.perf_counter()
        try:
            return await self._client.watch(
                start,
                range_end=prefix_range_end(start),
                start_revision=after_revision + 1,
                prev_kv=True,
            )
        except aetcd.exceptions.RevisionCompactedError as exc:
            self._failed("watch", "OUT_OF_RANGE")
            raise Compacted(after_revision, getattr(exc, "compacted_revision", 0)) from exc
        except aetcd.exceptions.ClientError:
            self._failed("watch", "UNAVAILABLE")
            raise
        finally:
            if self.metrics is not None:
                self.metrics.observe("watch", time.perf_counter() - started)

    async def revision(self) -> int:
        resp = await self._read(rpc.RangeRequest(key=b"\0", count_only=True))
        return int(resp.header.revision)

    async def check_revision(self, revision: int) -> None:
        request = rpc.RangeRequest(key=b"\0", count_only=True, revision=revision + 1)
        try:
            async with self._guarded():
                await self._client.kvstub.Range(
                    request, timeout=self._timeout, metadata=self._client.metadata
                )
        except StoreUnavailable:
            raise
        except Exception as exc:
            if "compacted" in str(exc):
                raise Compacted(revision, 0) from exc
            if "future revision" in str(exc):
                return
            raise StoreUnavailable(f"etcd request failed: {exc}") from exc

    async def compact(self, revision: int) -> None:
        await self._call("Compact", rpc.CompactionRequest(revision=revision, physical=True))

    async def close(self) -> None:
        if self.health is not None:
            await self.health.stop()
        await self._client.close()

    @property
    def client(self) -> aetcd.Client:
        """The raw client, for leases and leader election."""
        return self._client


def _ambiguous(exc: StoreUnavailable, texts: tuple[str, ...] = AMBIGUOUS) -> bool:
    return any(text in str(exc) for text in texts)


def _compare(cond: Condition) -> Any:
    msg = rpc.Compare(key=cond.key.encode())
    if isinstance(cond, Absent):
        msg.target = rpc.Compare.CREATE
        msg.result = rpc.Compare.EQUAL
        msg.create_revision = 0
    else:
        assert isinstance(cond, ModRevisionIs)
        msg.target = rpc.Compare.MOD
        msg.result = rpc.Compare.EQUAL
        msg.mod_revision = cond.revision
    return msg


def _request_op(op: Operation) -> Any:
    if isinstance(op, Put):
        return rpc.RequestOp(request_put=rpc.PutRequest(key=op.key.encode(), value=op.value))
    assert isinstance(op, Delete)
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=op.key.encode()))


def _event(event: Any) -> WatchEvent:
    kv = event.kv
    if event.kind == aetcd.rtypes.EventKind.DELETE:
        prev = event.prev_kv
        value = bytes(prev.value) if prev is not None else b""
        created = prev.create_revision if prev is not None else 0
        return WatchEvent("DELETE", kv.key.decode(), value, kv.mod_revision, created, value or None)
    prev = event.prev_kv
    # etcd sends an empty prev_kv (create_revision 0) when the key is new.
    prev_value = bytes(prev.value) if prev is not None and prev.create_revision else None
    return WatchEvent(
        "PUT", kv.key.decode(), bytes(kv.value), kv.mod_revision, kv.create_revision, prev_value
    )
