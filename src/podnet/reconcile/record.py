"""What one pass of a reconcile loop did, and the clock the loops read.

``ApplyRecord`` is the loop's report of its last pass: what it applied, when, how long
it took, how it ended, the error if any, and the objects it left out. ``note()`` is its
compact JSON form for the node's status note.

Results:

- ``applied``: the whole desired state is in the data plane.
- ``partial``: the data plane refused the whole; bisection left out ``left_out`` and
  the rest is in.
- ``rejected``: the data plane refused it even with every keyed object left out (a
  permanent error no object explains); nothing new was applied.
- ``failed``: a transient error (or the apply timeout); retried with backoff.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

APPLIED, PARTIAL, REJECTED, FAILED = "applied", "partial", "rejected", "failed"
ERROR_CHARS = 300  # enough to say why; a note stays small


@dataclass(frozen=True)
class ApplyRecord:
    """One pass of a loop: ``at`` is wall time (seconds), ``seconds`` compile + apply,
    ``compile_seconds`` the compile part."""

    loop: str
    what: str
    at: float
    seconds: float
    result: str
    error: str = ""
    left_out: tuple[str, ...] = ()
    compile_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the whole desired state is applied."""
        return self.result == APPLIED

    def note(self) -> dict[str, Any]:
        """The compact form for the node's status note (empty fields left out)."""
        found: dict[str, Any] = {
            "what": self.what,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)),
            "ms": round(self.seconds * 1000, 1),
            "compile_ms": round(self.compile_seconds * 1000, 1),
            "result": self.result,
        }
        if self.error:
            found["error"] = self.error[:ERROR_CHARS]
        if self.left_out:
            found["left_out"] = list(self.left_out)
        return found

    def same_outcome(self, other: ApplyRecord | None) -> bool:
        """Whether ``other`` ended the same way (result, error and left-out objects)."""
        return other is not None and (self.result, self.error, self.left_out) == (
            other.result,
            other.error,
            other.left_out,
        )


class Clock:
    """Time as the loops read it; tests pass a fake one (no wall-clock waits)."""

    def time(self) -> float:
        """Wall time, for records."""
        return time.time()

    def monotonic(self) -> float:
        """For durations and rate limits."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Coalescing and backoff waits."""
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """Wait for ``event`` at most ``timeout`` seconds; False when the time ran out."""
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return False
        return True


SYSTEM_CLOCK = Clock()
