"""Supervision of the leader's controllers: a failed controller restarts alone.

Each controller runs in a slot that knows how to build a fresh instance of it. When one
of a controller's tasks ends (a watch whose handler raised, a background task that gave
up on an etcd timeout under load), that controller alone is stopped, and after the
client's jittered backoff (``podnet.client.backoff``) a fresh instance is built and
started (a new listing of everything it follows); the other controllers keep running,
their tasks untouched. Every failure is logged at error level and reported to
``on_failure`` (the master counts it in ``/metrics``).

Only two things end the whole leadership term (``run`` raises): a permanent failure (a
refused configuration, ``PERMANENT``), and a controller that failed more than
``max_restarts`` times in a row, none of its runs lasting ``healthy_after`` seconds.
Losing leadership is the manager's business: it cancels ``run`` and calls ``stop``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from podnet.client.backoff import Backoff
from podnet.client.errors import one_line
from podnet.controllers.base import Controller
from podnet.controllers.clusternetwork import ClusterNetworkError
from podnet.controllers.workqueue import cancel_all

RESTART_BACKOFF = Backoff(0.5, 30.0)  # between restarts of one controller
MAX_RESTARTS = 5  # consecutive failures of one controller before the term ends
HEALTHY_AFTER = 60.0  # seconds a controller must run for its next failure to count as a first
PERMANENT: tuple[type[BaseException], ...] = (ClusterNetworkError,)


class ControllerFailed(Exception):
    """A controller failed permanently or too often: the leadership term ends."""


@dataclass
class Slot:
    """One supervised controller: how to build it, the running instance, its failures."""

    name: str
    build: Callable[[], Controller]
    controller: Controller
    started_at: float = 0.0
    failures: int = 0  # consecutive


class Supervisor:
    """Starts controllers in order, restarts a failed one alone, stops them all."""

    def __init__(
        self,
        log: logging.Logger | None = None,
        backoff: Backoff = RESTART_BACKOFF,
        max_restarts: int = MAX_RESTARTS,
        healthy_after: float = HEALTHY_AFTER,
        on_failure: Callable[[str], object] | None = None,
    ) -> None:
        self.log = log or logging.getLogger("podnet.controllers.manager")
        self.backoff = backoff
        self.max_restarts = max_restarts
        self.healthy_after = healthy_after
        self.on_failure = on_failure
        self.slots: list[Slot] = []

    @property
    def controllers(self) -> list[Controller]:
        """The running instances, in start order."""
        return [slot.controller for slot in self.slots]

    def running(self, name: str) -> Controller | None:
        """The running instance of the controller called ``name``."""
        return next((slot.controller for slot in self.slots if slot.name == name), None)

    async def start(self, name: str, build: Callable[[], Controller]) -> Controller:
        """Build and start one controller (returns once it is synced) and supervise it."""
        slot = Slot(name, build, build())
        self.slots.append(slot)  # before starting: ``stop`` must reach a half-started one
        self.log.info("starting %s", name)
        await slot.controller.start()
        slot.started_at = _now()
        return slot.controller

    async def run(self) -> None:
        """Supervise every started controller until one fails for good (which raises
        ``ControllerFailed``, or the permanent error itself)."""
        watchers = [
            asyncio.create_task(self._supervise(slot), name=f"supervise-{slot.name}")
            for slot in self.slots
        ]
        try:
            done, _ = await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
            done.pop().result()
            raise ControllerFailed("a controller's supervision ended")  # pragma: no cover
        finally:
            await cancel_all(watchers)

    async def stop(self) -> None:
        """Stop every controller, last started first."""
        for slot in reversed(self.slots):
            await slot.controller.stop()
        self.slots.clear()

    async def _supervise(self, slot: Slot) -> None:
        """Restart ``slot``'s controller whenever one of its tasks ends; raise when it
        failed permanently or too often."""
        while True:
            cause: BaseException | None = await _first_ending(slot.controller.tasks)
            while cause is not None:
                await self._failed(slot, cause)
                cause = await self._restart(slot)

    async def _failed(self, slot: Slot, cause: BaseException) -> None:
        """Stop the failed controller, count and log the failure, wait out the backoff."""
        await slot.controller.stop()
        if self.on_failure is not None:
            self.on_failure(slot.name)
        if isinstance(cause, PERMANENT):
            self.log.error("%s failed permanently: %s", slot.name, one_line(cause))
            raise cause
        if _now() - slot.started_at >= self.healthy_after:
            slot.failures = 0
        slot.failures += 1
        if slot.failures > self.max_restarts:
            why = f"{slot.name} failed {slot.failures} times in a row, last: {one_line(cause)}"
            self.log.error("%s; ending the leadership term", why, exc_info=cause)
            raise ControllerFailed(why) from cause
        delay = self.backoff.delay(slot.failures - 1)
        self.log.error(
            "%s failed: %s; restarting it alone in %.1fs (failure %d of at most %d)",
            slot.name,
            one_line(cause),
            delay,
            slot.failures,
            self.max_restarts,
            exc_info=cause,
        )
        await asyncio.sleep(delay)

    async def _restart(self, slot: Slot) -> BaseException | None:
        """Start a fresh instance in ``slot``; the error when its start failed."""
        slot.controller = slot.build()
        slot.started_at = _now()
        try:
            await slot.controller.start()
        except Exception as exc:
            return exc
        self.log.info("%s restarted and synced", slot.name)
        return None


async def _first_ending(tasks: list[asyncio.Task[Any]]) -> BaseException:
    """Wait until one of ``tasks`` ends (they run for ever) and say why it did."""
    if not tasks:
        await asyncio.Event().wait()  # nothing can fail: wait until cancelled
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    task = done.pop()
    if task.cancelled():
        return RuntimeError(f"task {task.get_name()} was cancelled")
    return task.exception() or RuntimeError(f"task {task.get_name()} ended")


def _now() -> float:
    return asyncio.get_running_loop().time()
