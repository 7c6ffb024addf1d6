"""Per-container locks: CNI requests run serially per container, concurrently across them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class ContainerLocks:
    """One lock per container ID: requests are serial per container, concurrent across."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def busy(self, container_id: str) -> bool:
        """Whether a request for ``container_id`` is in progress or waiting."""
        return container_id in self._locks

    @asynccontextmanager
    async def hold(self, container_id: str) -> AsyncIterator[None]:
        """Hold the container's lock; the entry disappears when nobody uses it."""
        lock, users = self._locks.get(container_id) or (asyncio.Lock(), 0)
        self._locks[container_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[container_id]
            if users == 1:
                del self._locks[container_id]
            else:
                self._locks[container_id] = (lock, users - 1)
