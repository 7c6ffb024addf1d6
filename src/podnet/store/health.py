"""Noticing an etcd outage, so that calls fail in milliseconds instead of at their deadline.

Each etcd call has a 10 s deadline and waits for a connection that much (a member that
moves or restarts is waited for, not failed at once). During an outage that made every
API call, ``/readyz`` included, take 10-18 s to answer 503 (issue 19, finding 11).
``StoreHealth`` probes etcd every ``interval`` seconds with a trivial read that must
answer within ``timeout``; a call failing with "unavailable" tells it too. Once etcd
is down:

- new calls fail at once with ``StoreUnavailable`` (the API answers 503);
- calls already waiting are cut at once (``guarded``), not left to their deadline;
- the probe goes on, and the first answer brings etcd back for every caller.

An etcd that takes longer than ``timeout`` for a count-only read is treated as down
for that moment: its callers get 503 and retry, rather than all waiting on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from podnet.store.base import StoreUnavailable

log = logging.getLogger("podnet.store.health")

TIMEOUT = 0.5  # seconds the probe's read may take
INTERVAL = 0.25  # seconds between probes
SAFETY = 10.0  # seconds after which a probe that never returned counts as failed
Probe = Callable[[float], Awaitable[object]]


class StoreHealth:
    """Whether etcd answers now; cuts the calls waiting on it when it does not.

    ``probe(timeout)`` must enforce ``timeout`` itself, in real time (a gRPC deadline),
    and raise when etcd did not answer within it."""

    def __init__(self, probe: Probe, timeout: float = TIMEOUT, interval: float = INTERVAL) -> None:
        self.probe = probe
        self.timeout = timeout
        self.interval = interval
        self.down = ""  # why etcd is taken to be down; empty while it answers
        self.outages = 0
        self._waiting: set[asyncio.Timeout] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Probe in the background (in the running loop) until ``stop``."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="etcd-health")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def check(self) -> None:
        """Raise ``StoreUnavailable`` at once while etcd is down."""
        if self.down:
            raise StoreUnavailable(f"etcd is unavailable ({self.down}); failing fast")

    @contextlib.asynccontextmanager
    async def guarded(self) -> AsyncIterator[None]:
        """Run a call that fails at once (``StoreUnavailable``) if etcd goes down."""
        self.check()
        try:
            async with asyncio.timeout(None) as deadline:
                self._waiting.add(deadline)
                try:
                    yield
                finally:
                    self._waiting.discard(deadline)
        except TimeoutError:
            if deadline.expired() and self.down:
                self.check()
            raise

    def failed(self, why: str) -> None:
        """etcd is down (a call or the probe says so): cut every waiting call."""
        if not self.down:
            self.outages += 1
            log.warning("etcd is unavailable (%s): calls fail at once until it answers", why)
        self.down = why
        now = asyncio.get_running_loop().time()
        for deadline in list(self._waiting):
            deadline.reschedule(now)

    async def _run(self) -> None:
        while True:
            try:
                # The probe's own deadline is the client's (real time, kept by gRPC's
                # core): a busy event loop delivers its answer late, not as an outage.
                await asyncio.wait_for(self.probe(self.timeout), SAFETY)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failed(f"no answer to a read in {self.timeout:g} s: {type(exc).__name__}")
            else:
                if self.down:
                    log.warning("etcd answers again")
                    self.down = ""
            await asyncio.sleep(self.interval)
