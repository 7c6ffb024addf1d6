"""What the watch cache's in-process followers wait on: one wakeup per kind.

Every controller in the master follows the watch cache for one kind. A follower woken
by every change of every kind costs each write one wakeup per follower (about twenty);
woken only by its own kind, a Lease renewal wakes the Lease followers and nobody else.

A follower that sleeps through other kinds' changes may find its place in the ring
dropped when it wakes. That is harmless exactly when no change of its own kind was
dropped with it, which ``Followers`` keeps track of: the latest revision dropped, per
kind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

from podnet.model.kinds import Kind


class Change(Protocol):
    @property
    def kind(self) -> Kind: ...

    @property
    def revision(self) -> int: ...


class Followers:
    """Per-kind wakeups, and the latest revision of each kind that left the ring."""

    def __init__(self) -> None:
        self._wakeups: dict[Kind, asyncio.Future[None]] = {}
        self._dropped: dict[Kind, int] = {}

    def wakeup(self, kind: Kind) -> asyncio.Future[None]:
        """The future the next change of ``kind`` completes."""
        future = self._wakeups.get(kind)
        if future is None:
            future = self._wakeups[kind] = asyncio.get_running_loop().create_future()
        return future

    def changed(self, kind: Kind) -> None:
        """A change of ``kind`` is in the ring: wake its followers."""
        future = self._wakeups.pop(kind, None)
        if future is not None and not future.done():
            future.set_result(None)

    def wake_all(self) -> None:
        for kind in list(self._wakeups):
            self.changed(kind)

    def dropped(self, changes: Iterable[Change]) -> None:
        """``changes`` left the ring (in revision order)."""
        for change in changes:
            self._dropped[change.kind] = change.revision

    def missed(self, kind: Kind, seen: int) -> bool:
        """Whether a change of ``kind`` after revision ``seen`` left the ring."""
        return self._dropped.get(kind, 0) > seen


async def woken(wakeup: asyncio.Future[None], timeout: float | None) -> bool:
    """Wait for the shared ``wakeup`` (True) or ``timeout`` (False) without cancelling it.

    The same as ``wait_for(shield(wakeup), timeout)`` with one future and one timer
    instead of four futures."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def release(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    wakeup.add_done_callback(release)
    timer = loop.call_later(timeout, release) if timeout is not None else None
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
        wakeup.remove_done_callback(release)
    return wakeup.done()
