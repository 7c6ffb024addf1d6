"""Work queues and tasks for controllers.

``KeyedQueue`` holds one work item per key (an object name): serial per key, concurrent
across keys, failures retried with jittered backoff, as kuryr-kubernetes' handlers are.
Handlers read the latest state from the controller's cache, so a key queued many times
is handled once, and a key changed while being handled is handled once more.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from podnet.client.backoff import Backoff
from podnet.client.errors import ClientError, has_reason, is_transient

log = logging.getLogger("podnet.controllers")

RETRY_BACKOFF = Backoff(0.05, 30.0)


class KeyedQueue:
    """One work item per key: serial per key, concurrent across keys.

    Adding a key that is queued is a no-op; adding one that is being handled runs it once
    more afterwards. Transient errors, conflicts and races are retried with backoff;
    anything else is logged and dropped (the next resync brings the key back).
    """

    def __init__(
        self,
        name: str,
        handler: Callable[[str], Awaitable[None]],
        workers: int = 16,
        backoff: Backoff = RETRY_BACKOFF,
    ) -> None:
        self.name = name
        self._handler = handler
        self._worker_count = workers
        self._backoff = backoff
        self._pending: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._dirty: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The worker tasks."""
        return list(self._workers)

    def add(self, key: str) -> None:
        """Ask for ``key`` to be handled (again)."""
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._pending.put_nowait(key)
            self._idle.clear()

    def add_after(self, key: str, delay: float) -> None:
        """Handle ``key`` after ``delay`` seconds (one timer per key)."""
        if key not in self._timers:
            loop = asyncio.get_running_loop()
            self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def start(self) -> None:
        """Start the workers."""
        for number in range(self._worker_count):
            task = asyncio.create_task(self._work(), name=f"{self.name}-worker-{number}")
            self._workers.append(task)

    async def stop(self) -> None:
        """Cancel the workers and pending retries."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        await cancel_all(self._workers)
        self._workers.clear()

    async def wait_idle(self) -> None:
        """Wait until nothing is queued or running (retries scheduled for later don't count)."""
        await self._idle.wait()

    async def _work(self) -> None:
        while True:
            key = await self._pending.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                await self._handle(key)
            finally:
                self._active.discard(key)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.add(key)
                if not self._queued and not self._active:
                    self._idle.set()

    async def _handle(self, key: str) -> None:
        try:
            await self._handler(key)
            self._failures.pop(key, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(key, exc)

    def _failed(self, key: str, exc: Exception) -> None:
        if is_transient(exc) or has_reason(exc, "Conflict", "AlreadyExists", "NotFound"):
            attempt = self._failures.get(key, 0)
            self._failures[key] = attempt + 1
            delay = self._backoff.delay(attempt)
            log.warning("%s %s: %s; retrying in %.2fs", self.name, key, exc, delay)
            self.add_after(key, delay)
            return
        self._failures.pop(key, None)
        trace = not isinstance(exc, ClientError)  # an API refusal needs no traceback
        log.error("%s %s failed: %s", self.name, key, exc, exc_info=trace)


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until every one has finished.

    A task that swallows its cancellation (a library that catches it, or a call that
    completed at the same instant) is cancelled again rather than waited on for ever.
    """
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # mark it retrieved; failures were logged where they happened


def spawn(tasks: list[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any], name: str) -> None:
    """Start ``coro`` as a named task and remember it in ``tasks``."""
    tasks.append(asyncio.create_task(coro, name=name))
