"""The node's status note: each loop's last ``ApplyRecord``, published as compact JSON.

``StatusNote.record`` keeps the newest record per loop; ``run`` publishes the whole note
(``{"<loop>": {what, at, ms, result, error, left_out}, ...}``) through the caller's
``publish`` (the agent writes a Node annotation). Writes are rate limited so thousands
of nodes do not flood etcd: a new outcome (result, error or left-out objects changed) is
published at most every ``min_interval`` seconds, a mere refresh (same outcome, newer
time or size) at most every ``refresh_interval``; the first write waits ``first_delay``
after the first record, so that it carries the first pass of every loop. A failed
publish is retried at the next due time.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from podnet.reconcile.record import SYSTEM_CLOCK, ApplyRecord, Clock

log = logging.getLogger("podnet.reconcile.note")

FIRST_DELAY = 1.0  # the first write waits this long: every loop's first pass is in
MIN_INTERVAL = 5.0
REFRESH_INTERVAL = 300.0


class StatusNote:
    """The newest record of every loop, and the task that publishes them."""

    def __init__(
        self,
        publish: Callable[[str], Awaitable[None]],
        min_interval: float = MIN_INTERVAL,
        refresh_interval: float = REFRESH_INTERVAL,
        first_delay: float = FIRST_DELAY,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.publish, self.clock = publish, clock
        self.min_interval, self.refresh_interval = min_interval, refresh_interval
        self.first_delay = first_delay
        self.records: dict[str, ApplyRecord] = {}
        self.published: dict[str, ApplyRecord] = {}
        self.writes = 0
        self._last_attempt: float | None = None
        self._first_record: float | None = None
        self._changed = asyncio.Event()

    def record(self, record: ApplyRecord) -> None:
        """Keep ``record`` as its loop's newest; published when due."""
        self.records[record.loop] = record
        if self._first_record is None:
            self._first_record = self.clock.monotonic()
        self._changed.set()

    def text(self) -> str:
        """The note as published: compact JSON, loops in name order."""
        note: dict[str, Any] = {name: r.note() for name, r in sorted(self.records.items())}
        return json.dumps(note, separators=(",", ":"), sort_keys=True)

    def news(self) -> bool:
        """Whether some loop's outcome differs from the one published."""
        return any(not r.same_outcome(self.published.get(n)) for n, r in self.records.items())

    async def run(self) -> None:
        """Publish when due, for ever."""
        while True:
            await self._changed.wait()
            while (wait := self._due_in()) > 0:
                self._changed.clear()
                await self.clock.wait(self._changed, wait)  # news may make it due sooner
            self._changed.clear()
            if not await self.publish_now():
                self._changed.set()  # try again when due

    async def publish_now(self) -> bool:
        """Publish the note at once; False (and logged) when that failed."""
        records, text = dict(self.records), self.text()
        self._last_attempt = self.clock.monotonic()
        try:
            await self.publish(text)
        except Exception as exc:  # the API is down: try again when due
            log.warning("publishing the reconcile note failed: %s", exc)
            return False
        self.published = records
        self.writes += 1
        return True

    def _due_in(self) -> float:
        if self._last_attempt is None:
            return (self._first_record or 0.0) + self.first_delay - self.clock.monotonic()
        interval = self.min_interval if self.news() else self.refresh_interval
        return self._last_attempt + interval - self.clock.monotonic()
