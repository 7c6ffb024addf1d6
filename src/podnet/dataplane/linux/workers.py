"""Threads that stay in one network namespace, and the lock that orders their work.

A ``NamespaceWorker`` runs submitted functions on its own threads, which inherit the
namespace of the thread that started them. The backend keeps two: one thread for the
node's own set-up (check, set-up, remote nodes, listings) and a few for pod wiring, so
independent pods are wired in parallel; the kernel's rtnl lock orders their changes, and
a veth deletion's long wait (an RCU grace period, ~15-25 ms) happens outside that lock,
so deletions overlap.

``SharedExclusive`` keeps set-up and pod wiring apart: set-up reads the pods it must keep
(veths and anti-spoofing elements), which a concurrent attach would change under it.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


def namespace_id() -> int:
    """The calling thread's network namespace (inode of its ns file)."""
    return os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino


class NamespaceWorker:
    """``threads`` threads that run submitted functions, in the namespace they were
    started in; functions submitted together may run concurrently when threads > 1."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self.namespace = namespace_id()
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn``; its result (or exception) arrives in the returned future."""
        future: Future[T] = Future()
        self._queue.put((fn, future))
        return future

    def stop(self, timeout: float = 5.0) -> None:
        """Finish queued work, then end the threads."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout)

    def _run(self) -> None:
        if namespace_id() != self.namespace:  # cannot happen: threads inherit it
            raise RuntimeError("worker thread started outside its namespace")
        while (item := self._queue.get()) is not None:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as err:
                future.set_exception(err)


class SharedExclusive:
    """An asyncio lock held by many (shared) or by one (exclusive). A waiting exclusive
    holder goes before new shared ones, so a steady flow of pods cannot starve a resync.
    ``release`` is synchronous, so a worker future's done-callback can call it."""

    def __init__(self) -> None:
        self._shared = 0
        self._exclusive = False
        self._exclusive_waiting = 0
        self._waiters: list[asyncio.Future[None]] = []

    async def acquire(self, exclusive: bool) -> None:
        """Wait until the lock can be held this way, then hold it."""
        self._exclusive_waiting += exclusive
        try:
            while not self._free_for(exclusive):
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    await waiter
                finally:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
        finally:
            self._exclusive_waiting -= exclusive
        if exclusive:
            self._exclusive = True
        else:
            self._shared += 1

    def release(self, exclusive: bool) -> None:
        """Give up one hold; wake the waiters to try again."""
        if exclusive:
            self._exclusive = False
        else:
            self._shared -= 1
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _free_for(self, exclusive: bool) -> bool:
        if exclusive:
            return not self._exclusive and self._shared == 0
        return not self._exclusive and self._exclusive_waiting == 0


class KeyedLocks:
    """One asyncio lock per key (a pod's host veth): its operations run one at a time
    whatever the caller does; an entry lives only while someone uses it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    async def acquire(self, key: str) -> None:
        """Wait for ``key``'s lock and hold it."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._leave(key)
            raise

    def release(self, key: str) -> None:
        """Give ``key``'s lock up (synchronous, for done-callbacks)."""
        self._locks[key][0].release()
        self._leave(key)

    def _leave(self, key: str) -> None:
        lock, users = self._locks[key]
        if users == 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)
