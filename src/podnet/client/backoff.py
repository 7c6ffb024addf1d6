"""Retrying with exponential backoff, jitter and a deadline: the one retry policy of podnet.

``Backoff`` says how long to wait before each retry; ``Attempts`` walks one run of retries
against a clock and a deadline; ``with_retry`` retries an async call with them. The clock,
the sleep and the random source are parameters, so tests run on a fake clock.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from podnet.client.errors import is_transient, one_line

log = logging.getLogger("podnet.client")

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: ``initial * factor**attempt``, capped at ``cap``,
    times a random factor from ``floor`` to 1 (``floor=0`` is "full jitter")."""

    initial: float = 0.1
    cap: float = 10.0
    factor: float = 2.0
    floor: float = 0.5
    rand: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        base = min(self.cap, self.initial * self.factor ** min(attempt, 32))
        return base * (self.floor + (1.0 - self.floor) * self.rand())


# Watches (and their listings) retry at least once a second, with full jitter so that
# the clients of a cluster do not reconnect in step: a watch is back within ~1 s of the
# master, and each client costs a down master at most a few refused connections a second.
WATCH_BACKOFF = Backoff(0.2, 1.0, floor=0.0)


class Attempts:
    """One run of retries: the delay before the next one, until a deadline.

    ``deadline`` is in seconds from the creation of the run (None: never give up);
    ``clock`` is monotonic seconds (the event loop's time, or a fake).
    """

    def __init__(
        self, backoff: Backoff, deadline: float | None, clock: Callable[[], float]
    ) -> None:
        self.backoff = backoff
        self.clock = clock
        self.give_up = None if deadline is None else clock() + deadline
        self.attempt = 0

    def next_delay(self) -> float | None:
        """The wait before the next retry, or None when it would end past the deadline."""
        delay = self.backoff.delay(self.attempt)
        if self.give_up is not None and self.clock() + delay > self.give_up:
            return None
        self.attempt += 1
        return delay

    def reset(self) -> None:
        """Start counting again (the call succeeded; a later failure is a first one)."""
        self.attempt = 0


async def with_retry(
    call: Callable[[], Awaitable[T]],
    what: str,
    deadline: float | None = 60.0,
    backoff: Backoff = Backoff(),
    retry_if: Callable[[BaseException], bool] = is_transient,
    *,
    timeout: float | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    clock: Callable[[], float] | None = None,
) -> T:
    """Run ``call`` (each try bounded by ``timeout`` seconds when given); retry failures
    ``retry_if`` accepts until ``deadline`` seconds (None: for ever). The last error is
    raised when the next wait would pass the deadline."""
    attempts = Attempts(backoff, deadline, clock or asyncio.get_running_loop().time)
    while True:
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            async with asyncio.timeout(timeout):
                return await call()
        except Exception as exc:
            delay = attempts.next_delay() if retry_if(exc) else None
            if delay is None:
                raise
            level = logging.WARNING if attempts.attempt % 10 == 1 else logging.DEBUG
            log.log(level, "%s failed (%s); retrying in %.2fs", what, one_line(exc), delay)
            await sleep(delay)
