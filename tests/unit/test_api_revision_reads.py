"""Consistent lists and watches share etcd revision reads (``listing.RevisionReads``):
callers that arrive together cost one read, and no caller is ever given a read that was
sent before it arrived (its answer is never older than the revision when it asked)."""

from __future__ import annotations

import asyncio

import pytest

from podnet.api.listing import RevisionReads, revision_reads
from podnet.store.base import Put
from podnet.store.memory import MemoryStore


class GatedStore(MemoryStore):
    """A store whose revision reads take their answer, then wait at a gate (one release
    per read) before giving it: a read on its way while other things happen."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Semaphore(0)
        self.asked = asyncio.Event()

    async def revision(self) -> int:
        answer = await super().revision()
        self.asked.set()
        await self.gate.acquire()
        return answer


async def test_callers_that_arrive_together_share_one_read() -> None:
    store = GatedStore()
    reads = RevisionReads(store)
    written = await store.commit([], [Put("/k", b"1")])
    callers = [asyncio.create_task(reads.current()) for _ in range(50)]
    await store.asked.wait()
    store.gate.release()
    assert await asyncio.gather(*callers) == [written] * 50
    assert reads.reads == 1


async def test_a_caller_never_gets_a_read_sent_before_it_arrived() -> None:
    store = GatedStore()
    reads = RevisionReads(store)
    first = await store.commit([], [Put("/k", b"1")])
    early = asyncio.create_task(reads.current())
    await store.asked.wait()  # the first read is on its way, with the first revision
    store.asked.clear()
    second = await store.commit([], [Put("/k", b"2")])  # meanwhile, a write
    late = [asyncio.create_task(reads.current()) for _ in range(10)]
    await asyncio.sleep(0)
    store.gate.release()
    assert await early == first
    await store.asked.wait()  # a second read, for the callers that came during the first
    store.gate.release()
    assert await asyncio.gather(*late) == [second] * 10
    assert reads.reads == 2


async def test_a_failed_read_fails_its_callers_and_the_next_read_is_fresh() -> None:
    class Failing(MemoryStore):
        failures = 1

        async def revision(self) -> int:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("etcd went away")
            return await super().revision()

    store = Failing()
    reads = RevisionReads(store)
    with pytest.raises(ConnectionError):
        await reads.current()
    assert await reads.current() == await MemoryStore.revision(store)
    assert reads.reads == 2


def test_one_reader_per_store() -> None:
    store, other = MemoryStore(), MemoryStore()
    assert revision_reads(store) is revision_reads(store)
    assert revision_reads(store) is not revision_reads(other)
