"""``ReconcileLoop``: change -> coalesce -> compile -> apply -> back off -> resync.

See the package docstring for how a user plugs in (``Target``) and what a pass does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from podnet.client.backoff import Backoff
from podnet.dataplane.interface import DataPlaneError, DataPlaneRejected
from podnet.reconcile.bisect import find_rejected
from podnet.reconcile.metrics import ReconcileMetrics
from podnet.reconcile.record import (
    APPLIED,
    FAILED,
    PARTIAL,
    REJECTED,
    SYSTEM_CLOCK,
    ApplyRecord,
    Clock,
)

log = logging.getLogger("podnet.reconcile")

D = TypeVar("D")
COALESCE_SECONDS = 0.05
APPLY_TIMEOUT = 120.0
RETRY_BACKOFF = Backoff(0.5, 30.0)
PERMANENT: tuple[type[BaseException], ...] = (DataPlaneRejected,)
TRANSIENT: tuple[type[BaseException], ...] = (DataPlaneError, TimeoutError)


class Target(Protocol[D]):
    """What a loop reconciles: how to compute the desired state ``D`` and apply it."""

    name: str  # the loop's name in logs, metrics and the status note

    def take(self) -> Callable[[], D]:
        """On the event loop: take the changes queued so far and return the step that
        compiles the desired state from them (run in a worker thread if asked)."""
        ...

    async def apply(self, desired: D) -> None:
        """Hand ``desired`` to the data plane (all or nothing)."""
        ...

    def keys(self, desired: D) -> Sequence[str]:
        """The names of the objects bisection may leave out, in a stable order."""
        ...

    def without(self, desired: D, left_out: frozenset[str]) -> D:
        """``desired`` with the objects named in ``left_out`` left out."""
        ...

    def describe(self, desired: D) -> str:
        """What ``desired`` holds, in a few words (``12 pods, 3 policies``)."""
        ...

    async def after_apply(self, desired: D, record: ApplyRecord) -> None:
        """Called after each pass that applied ``desired`` (whole or cut), resyncs
        included (logging, notes: compare with the last one to tell a change)."""
        ...


@dataclass(frozen=True)
class Pacing:
    """How a loop paces its passes: ``resync_period`` seconds without a change before the
    same state is applied again, ``coalesce`` seconds of a burst taken together, the
    compile in a worker thread or not, the apply timeout and the transient-error backoff."""

    resync_period: float
    coalesce: float = COALESCE_SECONDS
    compile_in_thread: bool = False
    apply_timeout: float = APPLY_TIMEOUT
    backoff: Backoff = RETRY_BACKOFF


class ReconcileLoop(Generic[D]):
    """Keeps the data plane equal to ``target``'s desired state (package docstring)."""

    def __init__(
        self,
        target: Target[D],
        pacing: Pacing,
        *,
        inputs: Iterable[str] = (),
        metrics: ReconcileMetrics | None = None,
        report: Callable[[ApplyRecord], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.target, self.pacing, self.clock = target, pacing, clock
        self.metrics, self.report = metrics, report
        self.synced = asyncio.Event()  # set after each pass that applied (all or part)
        self.last: ApplyRecord | None = None  # the last pass's record
        self.last_latency: float | None = None  # first change -> applied, seconds
        self.left_out: frozenset[str] = frozenset()
        self._unlisted = set(inputs)
        self._first_change: float | None = None
        self._refused: D | None = None  # the desired state bisection last cut
        self._cut: D | None = None  # it without the left-out objects, as applied
        self._error = ""  # the last refusal's message
        self._compiled = 0.0  # seconds the last compile took
        self._changed = asyncio.Event()
        self._changed.set()  # the first pass is due as soon as every input has listed

    # ---- what feeds it -------------------------------------------------------------------

    def changed(self) -> None:
        """An input changed: a pass follows after ``coalesce``."""
        if self._first_change is None:
            self._first_change = self.clock.monotonic()
        self._changed.set()

    def listed(self, name: str) -> None:
        """Input ``name`` delivered its first listing (and, as any change, a pass)."""
        self._unlisted.discard(name)
        self.changed()

    def poke(self) -> None:
        """Ask for a pass now even if nothing changed (a resync)."""
        self._changed.set()

    def ready(self) -> bool:
        """Whether every input has delivered its listing."""
        return not self._unlisted

    # ---- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Pass on every change (coalesced, once every input has listed) and every
        ``resync_period``; back off after transient errors; never returns."""
        attempt = 0
        while True:
            if not await self.clock.wait(self._changed, self.pacing.resync_period):
                log.debug("periodic resync of %s", self.target.name)
            await self.clock.sleep(self.pacing.coalesce)
            self._changed.clear()
            if not self.ready():
                continue
            if await self.reconcile_once():
                attempt = 0
                continue
            await self.clock.sleep(self.pacing.backoff.delay(attempt))
            attempt += 1
            self._changed.set()

    async def reconcile_once(self) -> bool:
        """Compile and apply once; False after a transient error (retry with backoff)."""
        first, self._first_change = self._first_change, None
        started = self.clock.monotonic()
        step = self.target.take()
        desired = await asyncio.to_thread(step) if self.pacing.compile_in_thread else step()
        self._compiled = self.clock.monotonic() - started
        try:
            result, left_out, error = await self._apply(desired)
        except TRANSIENT as exc:
            if first is not None:
                self._first_change = first  # older than any change queued since
            error = str(exc) or type(exc).__name__
            log.error("%s: applying failed: %s", self.target.name, error)
            self._finish(desired, started, FAILED, error=error)
            self.synced.clear()
            return False
        self.left_out = left_out
        record = self._finish(desired, started, result, error, left_out)
        if result == REJECTED:
            self.synced.clear()
            return True  # retried at the next change or resync, not in a tight loop
        self.last_latency = self.clock.monotonic() - (first or started)
        await self.target.after_apply(desired, record)
        self.synced.set()
        return True

    async def _apply(self, desired: D) -> tuple[str, frozenset[str], str]:
        """(result, left-out keys, error) of applying ``desired``, bisecting a refusal."""
        known = self._refused is not None and (desired is self._refused or desired == self._refused)
        if known and self._cut is not None:  # a resync of a state already cut
            if await self._accepts(self._cut):
                return PARTIAL, self.left_out, self._error
        elif await self._accepts(desired):
            self._refused = None
            return APPLIED, frozenset(), ""
        return await self._bisect(desired)

    async def _bisect(self, desired: D) -> tuple[str, frozenset[str], str]:
        error = self._error
        self._refused, self._cut, self.left_out = desired, None, frozenset()
        if self.metrics is not None:
            self.metrics.refused(self.target.name)
        keys = self.target.keys(desired)
        log.error("%s: the data plane refused %s: %s", self.target.name, self._what(desired), error)

        async def accepts(left_out: frozenset[str]) -> bool:
            cut = self.target.without(desired, left_out)
            if not await self._accepts(cut):
                return False
            self._cut = cut  # the last one accepted is what the data plane holds
            return True

        try:
            found = await find_rejected(keys, accepts)
        except TRANSIENT:
            self._refused = self._cut = None  # half searched: start again next time
            raise
        self._error = error  # what the whole state was refused for, not the last probe
        if found is None:
            self._cut = None  # what the probes left is no cut to resync with
            log.error("%s: refused even without any of its %d objects", self.target.name, len(keys))
            return REJECTED, frozenset(), error
        names = ", ".join(sorted(found))
        log.error("%s: left out %s; the rest is applied", self.target.name, names)
        return PARTIAL, found, error

    async def _accepts(self, desired: D) -> bool:
        """Apply with the timeout; False when refused (the error kept), transient errors
        raised."""
        try:
            async with asyncio.timeout(self.pacing.apply_timeout):
                await self.target.apply(desired)
        except PERMANENT as exc:
            self._error = str(exc) or type(exc).__name__
            return False
        return True

    def _finish(
        self,
        desired: D,
        started: float,
        result: str,
        error: str = "",
        left_out: frozenset[str] = frozenset(),
    ) -> ApplyRecord:
        record = ApplyRecord(
            self.target.name,
            self._what(desired),
            self.clock.time(),
            self.clock.monotonic() - started,
            result,
            error,
            tuple(sorted(left_out)),
            self._compiled,
        )
        self.last = record
        if self.metrics is not None:
            self.metrics.observe(record)
        if self.report is not None:
            self.report(record)
        return record

    def _what(self, desired: D) -> str:
        return self.target.describe(desired)
