"""The master's etcd timings and errors (podnet.store.etcdmetrics), observed around the
store's real calls (``EtcdStore._call``) with a fake KV service in place of etcd's."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from aetcd import rpc
from prometheus_client import CollectorRegistry, generate_latest

from podnet.store.base import Put, StoreError, StoreUnavailable
from podnet.store.etcd import EtcdStore
from podnet.store.etcdmetrics import EtcdMetrics
from podnet.testing.metricstext import sample


class FakeKv:
    """Range answers an empty read; Txn fails with the next code of ``txn_errors``."""

    def __init__(self) -> None:
        self.txn_errors: list[grpc.StatusCode] = []

    async def Range(self, request: Any, **_: Any) -> Any:
        return rpc.RangeResponse(header=rpc.ResponseHeader(revision=7))

    async def Txn(self, request: Any, **_: Any) -> Any:
        if self.txn_errors:
            code = self.txn_errors.pop(0)
            raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "no")
        return rpc.TxnResponse(header=rpc.ResponseHeader(revision=8), succeeded=True)

    async def Compact(self, request: Any, **_: Any) -> Any:
        return rpc.CompactionResponse()


class FakeClient:
    def __init__(self) -> None:
        self.kvstub = FakeKv()
        self.metadata = None


def store_with_fake() -> tuple[EtcdStore, FakeKv, CollectorRegistry]:
    registry = CollectorRegistry()
    store = EtcdStore("127.0.0.1:1", metrics=EtcdMetrics(registry))
    client = FakeClient()
    store._client = client  # type: ignore[assignment]
    return store, client.kvstub, registry


async def test_calls_are_timed_by_operation_and_failures_counted_by_code() -> None:
    store, kv, registry = store_with_fake()
    assert await store.revision() == 7
    assert await store.get("/a") is None
    assert await store.commit([], [Put("/a", b"1")]) == 8
    await store.compact(5)
    kv.txn_errors = [grpc.StatusCode.FAILED_PRECONDITION]
    with pytest.raises(StoreError, match="FAILED_PRECONDITION"):
        await store.commit([], [Put("/a", b"2")])
    kv.txn_errors = [grpc.StatusCode.UNAVAILABLE] * 3
    with pytest.raises(StoreUnavailable):
        await store.commit([], [Put("/a", b"3")])
    text = generate_latest(registry)
    count = "podnet_etcd_request_duration_seconds_count"
    assert sample(text, count, operation="Range") == 2.0
    assert sample(text, count, operation="Txn") == 3.0  # ok, refused, unavailable
    assert sample(text, count, operation="Compact") == 1.0
    assert sample(text, count, operation="watch") == 0.0
    total = sample(text, "podnet_etcd_request_duration_seconds_sum")
    assert total is not None and 0 < total < 5
    errors = "podnet_etcd_request_errors_total"
    assert sample(text, errors, operation="Txn", code="FAILED_PRECONDITION") == 1.0
    assert sample(text, errors, operation="Txn", code="UNAVAILABLE") == 1.0
    assert sample(text, errors, operation="Range") is None


async def test_keys_never_become_labels() -> None:
    """The label set stays the operations', however many keys are read."""
    store, _, registry = store_with_fake()
    for i in range(20):
        await store.get(f"/pods/ns/pod-{i}")
    text = generate_latest(registry).decode()
    assert "pod-" not in text
    series = [line for line in text.splitlines() if line.startswith("podnet_etcd_request_dur")]
    assert len(series) == 4 * (14 + 1 + 3)  # operations x (buckets, +Inf, sum, count, created)
