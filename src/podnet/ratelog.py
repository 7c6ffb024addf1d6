"""Logging a recurring condition without a bound on the log: one line per period.

A flood of connections made the API relay log 10,558 "too many open files" lines
(issue 19, finding 12): the log grew as fast as the attacker could connect. A
``RateLimitedLog`` writes the first occurrence of each kind of condition at once, then
at most one line per ``every`` seconds, saying how many were left out in between.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Window:
    logged_at: float
    suppressed: int = 0


@dataclass
class RateLimitedLog:
    """Warnings keyed by kind, at most one line per ``every`` seconds for each kind."""

    logger: logging.Logger
    every: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _windows: dict[str, _Window] = field(default_factory=dict, init=False, repr=False)

    def warning(self, key: str, message: str, *args: object) -> bool:
        """Log ``message % args`` unless ``key`` was logged less than ``every`` s ago
        (then count it); whether a line was written."""
        now = self.clock()
        window = self._windows.get(key)
        if window is not None and now - window.logged_at < self.every:
            window.suppressed += 1
            return False
        if window is not None and window.suppressed:
            message += " (and %d more like it in the last %.0f s)"
            args = (*args, window.suppressed, now - window.logged_at)
        self._windows[key] = _Window(now)
        self.logger.warning(message, *args)
        return True
