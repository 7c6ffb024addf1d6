"""The linux backend's worker threads and the locks that order their work."""

from __future__ import annotations

import asyncio
import threading
import time

from podnet.dataplane.linux.workers import (
    KeyedLocks,
    NamespaceWorker,
    SharedExclusive,
    namespace_id,
)


async def let_others_run() -> None:
    """Give every ready task its turns until it waits again (pure asyncio: no clock)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_shared_holders_overlap_and_exclusive_waits_for_them() -> None:
    lock, order = SharedExclusive(), []
    await lock.acquire(False)
    await lock.acquire(False)  # a second shared holder does not wait

    async def exclusive() -> None:
        await lock.acquire(True)
        order.append("exclusive")
        lock.release(True)

    task = asyncio.create_task(exclusive())
    await let_others_run()
    assert order == []
    lock.release(False)
    await let_others_run()
    assert order == []
    lock.release(False)
    await task
    assert order == ["exclusive"]


async def test_a_waiting_exclusive_holder_goes_before_new_shared_ones() -> None:
    lock, order = SharedExclusive(), []
    await lock.acquire(False)

    async def take(exclusive: bool, name: str) -> None:
        await lock.acquire(exclusive)
        order.append(name)
        await let_others_run()
        lock.release(exclusive)

    writer = asyncio.create_task(take(True, "setup"))
    await let_others_run()
    reader = asyncio.create_task(take(False, "attach"))
    await let_others_run()
    assert order == []
    lock.release(False)
    await asyncio.gather(writer, reader)
    assert order == ["setup", "attach"]


async def test_a_cancelled_waiter_leaves_the_lock_usable() -> None:
    lock = SharedExclusive()
    await lock.acquire(True)
    waiter = asyncio.create_task(lock.acquire(False))
    await let_others_run()
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    lock.release(True)
    await asyncio.wait_for(lock.acquire(True), 1)


async def test_keyed_locks_serialise_one_key_only() -> None:
    locks, order = KeyedLocks(), []

    async def run(key: str, name: str) -> None:
        await locks.acquire(key)
        order.append(f"{name} in")
        await let_others_run()
        order.append(f"{name} out")
        locks.release(key)

    await asyncio.gather(run("a", "a1"), run("a", "a2"), run("b", "b1"))
    assert order.index("a1 out") < order.index("a2 in")
    assert order.index("b1 in") < order.index("a1 out")  # another key did not wait
    assert locks._locks == {}  # entries go with their last user


def test_workers_run_in_parallel_in_their_namespace() -> None:
    worker = NamespaceWorker("test", threads=3)
    started = threading.Barrier(3, timeout=5)

    def job() -> int:
        started.wait()  # only passes if three jobs run at once
        return namespace_id()

    try:
        futures = [worker.submit(job) for _ in range(3)]
        assert {f.result(timeout=5) for f in futures} == {namespace_id()}
    finally:
        worker.stop()


def test_a_failing_job_reports_its_error_and_the_worker_goes_on() -> None:
    worker = NamespaceWorker("test")

    def fail() -> None:
        raise ValueError("boom")

    try:
        failed = worker.submit(fail)
        assert isinstance(failed.exception(timeout=5), ValueError)
        assert worker.submit(time.monotonic).result(timeout=5) > 0
    finally:
        worker.stop()
