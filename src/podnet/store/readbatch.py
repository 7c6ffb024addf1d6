"""Point reads that arrive together go to etcd together.

Each etcd call through grpc.aio costs the master about as much CPU as serving a small
HTTPS request. When many requests are served at once (thousands of nodes registering,
32 clients reading), the gets that are asked for in the same turn of the event loop are
sent as one read: one key alone as a plain range, several as one transaction of ranges
(no comparisons), which etcd answers at a single revision.

Each caller still gets a linearizable read: the batch is sent after every one of its
callers asked, so its revision is at least the one current when each of them asked, as
the caller's own read would be. A failed batch fails each of its callers with the same
error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
MAX_BATCH = 64  # keys per transaction (etcd allows 128 operations in one by default)
Send = Callable[[Sequence[bytes]], Awaitable[Sequence[T]]]


class ReadBatcher(Generic[T]):
    """Gathers ``read(key)`` calls of one loop turn into ``send(keys)`` calls."""

    def __init__(self, send: Send[T], limit: int = MAX_BATCH) -> None:
        self._send = send
        self._limit = limit
        self._waiting: list[tuple[bytes, asyncio.Future[T]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # sends made (tests count them)

    async def read(self, key: bytes) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._flush)
        self._waiting.append((key, future))
        return await future

    def _flush(self) -> None:
        waiting, self._waiting = self._waiting, []
        for start in range(0, len(waiting), self._limit):
            task = asyncio.get_running_loop().create_task(
                self._answer(waiting[start : start + self._limit])
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(self, batch: list[tuple[bytes, asyncio.Future[T]]]) -> None:
        self.batches += 1
        try:
            answers = await self._send([key for key, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(answer)
