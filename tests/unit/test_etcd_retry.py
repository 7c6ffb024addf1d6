"""A request cut because the etcd member under it died is retried on another member
(CI saw `UNAVAILABLE: Stream removed (sendmsg: Broken pipe (32))` as a 503 for the first
write after one of three members was killed). Writes are read back first: the write may
have been applied before the member died."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from podnet.store.base import Put, StoreUnavailable
from podnet.store.etcd import EtcdStore

BROKEN_PIPE = "etcd request failed: UNAVAILABLE: Stream removed (sendmsg: Broken pipe (32))"


class Answer:
    class header:  # the shape of an etcd response header
        revision = 42

    succeeded = True
    kvs: list[Any] = []
    more = False


def unconnected() -> EtcdStore:
    store = EtcdStore("127.0.0.1:1")
    store._client.kvstub = types.SimpleNamespace(Txn="Txn", Range="Range")  # never called
    return store


def flaky(failures: list[str]) -> Any:
    calls: list[Any] = []

    async def call(_method: Any, request: Any) -> Any:
        calls.append(request)
        if failures:
            raise StoreUnavailable(failures.pop(0))
        return Answer()

    call.calls = calls  # type: ignore[attr-defined]
    return call


def test_a_write_cut_by_a_dying_member_is_read_back_then_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = unconnected()
    call = flaky([BROKEN_PIPE])
    monkeypatch.setattr(store, "_call", call)
    read_back: list[Any] = []

    async def applied(operations: Any) -> None:
        read_back.append(operations)
        return None  # not applied: the conditions decide again

    monkeypatch.setattr(store, "_applied", applied)
    assert asyncio.run(store.commit([], [Put("/k", b"v")])) == 42
    assert len(call.calls) == 2 and len(read_back) == 1


def test_a_read_cut_by_a_dying_member_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    store = unconnected()
    call = flaky([BROKEN_PIPE])
    monkeypatch.setattr(store, "_call", call)
    assert asyncio.run(store.revision()) == 42
    assert len(call.calls) == 2


def test_other_unavailable_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    store = unconnected()
    call = flaky(["etcd request failed: UNAVAILABLE: failed to connect to all addresses"])
    monkeypatch.setattr(store, "_call", call)
    with pytest.raises(StoreUnavailable):
        asyncio.run(store.commit([], [Put("/k", b"v")]))
    assert len(call.calls) == 1
