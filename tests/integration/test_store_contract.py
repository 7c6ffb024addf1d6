"""The Store contract, checked the same way on real etcd and on the in-memory twin."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from podnet.store.base import Absent, Compacted, Delete, ModRevisionIs, Put, Store, WatchEvent
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess
from podnet.store.memory import MemoryStore
from podnet.testing.e2e import eventually


@pytest.fixture(params=["etcd", "memory"])
async def store(request: pytest.FixtureRequest, etcd: EtcdProcess) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    real = EtcdStore(etcd.endpoint)
    await real.connect()
    try:
        yield real
    finally:
        await real.close()


@pytest.fixture
def key() -> str:
    return f"/contract-{uuid.uuid4().hex[:8]}/"


async def follow(store: Store, key: str, start: int, seen: list[WatchEvent], count: int) -> None:
    """Watch ``key`` after ``start`` into ``seen`` until it holds ``count`` events."""
    async for event in store.watch(key, start):
        seen.append(event)
        if len(seen) == count:
            return


async def test_conditions_guard_every_write(store: Store, key: str) -> None:
    first = await store.commit([Absent(f"{key}a")], [Put(f"{key}a", b"1")])
    assert first is not None
    assert await store.commit([Absent(f"{key}a")], [Put(f"{key}a", b"2")]) is None
    assert await store.commit([ModRevisionIs(f"{key}a", first - 1)], [Put(f"{key}a", b"3")]) is None
    second = await store.commit(
        [ModRevisionIs(f"{key}a", first)], [Put(f"{key}a", b"4"), Put(f"{key}b", b"5")]
    )
    assert second is not None and second > first
    got = await store.get(f"{key}a")
    assert got is not None and got.value == b"4" and got.mod_revision == second
    assert got.create_revision == first
    failed = await store.commit([Absent(f"{key}c"), Absent(f"{key}b")], [Put(f"{key}c", b"6")])
    assert failed is None and await store.get(f"{key}c") is None


async def test_list_is_ordered_and_large_prefixes_page(store: Store, key: str) -> None:
    for start in range(0, 4500, 100):  # etcd allows 128 operations per txn
        await store.commit(
            [], [Put(f"{key}{i:05d}", b"v" * 1500) for i in range(start, start + 100)]
        )
    items, revision = await store.list(key)
    assert [kv.key for kv in items] == [f"{key}{i:05d}" for i in range(4500)]
    assert revision == await store.revision()


async def test_watch_replays_then_follows_and_reports_previous_values(
    store: Store, key: str
) -> None:
    start = await store.commit([], [Put(f"{key}x", b"1")])
    assert start is not None
    await store.commit([], [Put(f"{key}x", b"2")])
    await store.commit([], [Delete(f"{key}x")])
    seen: list[WatchEvent] = []
    task = asyncio.create_task(follow(store, key, start, seen, 3))
    await eventually(lambda: len(seen) == 2, what="the replay")  # then y comes live
    await store.commit([], [Put(f"{key}y", b"3")])
    await asyncio.wait_for(task, 5)
    assert [(e.type, e.key, e.value, e.prev_value) for e in seen] == [
        ("PUT", f"{key}x", b"2", b"1"),
        ("DELETE", f"{key}x", b"2", b"2"),
        ("PUT", f"{key}y", b"3", None),
    ]


async def test_compacted_history_cannot_be_watched(store: Store, key: str) -> None:
    old = await store.commit([], [Put(f"{key}c", b"1")])
    assert old is not None
    latest = await store.commit([], [Put(f"{key}c", b"2")])
    await store.commit([], [Put(f"{key}c", b"3")])
    assert latest is not None
    await store.compact(latest)
    with pytest.raises(Compacted):
        await store.check_revision(old - 1)
    with pytest.raises(Compacted):
        async for _ in store.watch(key, old - 1):
            break
    await store.check_revision(latest)


async def test_a_list_of_large_objects_over_grpcs_message_limit_is_read_whole(
    store: Store, key: str
) -> None:
    """Eight 1 MiB values are 8 MiB, twice gRPC's 4 MiB receive limit for one page: the
    list reads them in smaller pages instead of failing (issue 8: listing events gave 503)."""
    big = b"x" * (1 << 20)
    for i in range(8):
        assert await store.commit([], [Put(f"{key}{i}", big + bytes([i]))]) is not None
    items, revision = await store.list(key)
    assert [kv.key for kv in items] == [f"{key}{i}" for i in range(8)]
    assert all(kv.value == big + bytes([i]) for i, kv in enumerate(items))
    assert revision >= items[-1].mod_revision


async def test_a_watch_catching_up_over_grpcs_message_limit_gets_every_event(
    store: Store, key: str
) -> None:
    """A watch from an old revision gets the history batched, up to 1,000 revisions in
    one answer from etcd: here 12 revisions of 1 MiB, over gRPC's 4 MiB default receive
    limit. Every event arrives (with that limit, the stream failed at the same revision
    on every retry, and the master's watch cache stopped there for good)."""
    start = await store.revision()
    big = b"w" * (1 << 20)
    for i in range(12):
        assert await store.commit([], [Put(f"{key}{i:02d}", big + bytes([i]))]) is not None
    seen: list[WatchEvent] = []
    await asyncio.wait_for(follow(store, key, start, seen, 12), 30)
    assert [e.key for e in seen] == [f"{key}{i:02d}" for i in range(12)]
    assert all(e.value == big + bytes([i]) for i, e in enumerate(seen))


async def test_gets_asked_together_each_get_their_own_key(store: Store, key: str) -> None:
    """Gets asked in one turn of the loop (etcd: read in one transaction of ranges, in
    batches of at most 64) each answer their own key, absent ones as None, and never
    an answer older than a write finished before they were asked."""
    written = {f"{key}{i:03d}": b"v%d" % i for i in range(0, 150, 2)}
    revision = await store.commit([], [Put(k, v) for k, v in list(written.items())[:60]])
    revision = await store.commit([], [Put(k, v) for k, v in list(written.items())[60:]])
    keys = [f"{key}{i:03d}" for i in range(150)]
    got = await asyncio.gather(*(store.get(k) for k in keys))
    assert [kv.value if kv else None for kv in got] == [written.get(k) for k in keys]
    assert all(kv.key == k for k, kv in zip(keys, got, strict=True) if kv)
    assert max(kv.mod_revision for kv in got if kv) == revision
    changed = await store.commit([], [Put(keys[0], b"new")])
    again = await asyncio.gather(store.get(keys[0]), store.get(keys[1]))
    assert again[0] is not None and again[0].value == b"new"
    assert again[0].mod_revision == changed and again[1] is None
