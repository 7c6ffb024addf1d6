"""Short garbage collections in a process with a large, long-lived heap.

CPython's cyclic collector walks every tracked object of the generations it collects. A
master with 150,000 pods and 5,000 agents connected holds about 4 million of them (the
watch cache, the controllers' caches, the connections), and a full collection of that
takes about 3 s. CPython starts one whenever the objects promoted into the oldest
generation since the last one exceed a quarter of it; under a storm of requests (each
request's objects live long enough to be promoted, then die) that was every 20-30 s,
and the event loop, so every watcher, stood still for seconds each time.

``HeapGovernor`` keeps the walk short, as large Python services do with ``gc.freeze``:

- Every ``freeze_every`` seconds it collects what is not frozen (cheap: only what came
  since the last freeze) and freezes what survived: those objects move to the permanent
  generation, which collections do not walk. Objects there are still freed by reference
  counting as usual; only a reference cycle among them would outlive its use.
- Every ``thaw_every`` seconds it unfreezes everything, runs one full collection, which
  reclaims such cycles (a closed connection's objects, say), and freezes again: one long
  pause per period instead of one every 30 s.
- A full collection that took longer than ``SLOW_FULL`` (the heap grew fast since the
  last freeze: a burst of new objects or connections) is followed at once by a freeze,
  so the next one walks only what comes after it.
- The youngest generation's threshold is raised (700 allocations to 10,000), so a
  request's short-lived objects are mostly freed before a collection could walk and
  promote them: registering 5,000 nodes took 40 % less of the master's CPU. Young
  collections get longer (tens of milliseconds), and much rarer.

- After each step it hands the C heap's free pages back to the kernel (glibc's
  ``malloc_trim``). A TLS handshake's temporary memory is freed between the long-lived
  objects of the connections made with it; those holes stay in the process's resident
  set otherwise (a third of what 2,000 watch connections cost, measured).

Each collection's pause is observed in ``podnet_gc_pause_seconds`` (by generation), each
trim's in ``podnet_malloc_trim_seconds``, and the frozen objects are counted in
``podnet_gc_frozen_objects``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from prometheus_client import CollectorRegistry, Gauge, Histogram

log = logging.getLogger(__name__)

FREEZE_EVERY = 30.0
THAW_EVERY = 1800.0
SLOW_FULL = 0.05  # seconds: a full collection this long freezes what it walked
YOUNG_THRESHOLD = 10_000  # allocations between young collections (CPython: 700)
PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

Step = Literal["freeze", "thaw"]


class _Trim(Protocol):
    def __call__(self, pad: int) -> int: ...


def malloc_trim() -> _Trim | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    with contextlib.suppress(OSError, AttributeError):
        trim: _Trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        return trim
    return None


@dataclass
class Schedule:
    """When to freeze and when to thaw (pure: times are passed in)."""

    freeze_every: float = FREEZE_EVERY
    thaw_every: float = THAW_EVERY
    started: float = 0.0
    last_thaw: float = 0.0

    def __post_init__(self) -> None:
        if self.freeze_every <= 0 or self.thaw_every < self.freeze_every:
            raise ValueError(
                f"freeze every {self.freeze_every} s and thaw every {self.thaw_every} s: "
                "both must be positive, and thawing no more often than freezing"
            )
        self.last_thaw = self.started

    def step(self, now: float) -> Step:
        """What to do at ``now``, one freeze period after the last step."""
        if now - self.last_thaw >= self.thaw_every:
            self.last_thaw = now
            return "thaw"
        return "freeze"


class HeapGovernor:
    """Runs a ``Schedule`` on the event loop and measures every collection's pause."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        freeze_every: float = FREEZE_EVERY,
        thaw_every: float = THAW_EVERY,
    ) -> None:
        self.schedule = Schedule(freeze_every, thaw_every, time.monotonic())
        self.pauses = Histogram(
            "podnet_gc_pause_seconds",
            "Pauses of the garbage collector, by generation collected",
            ["generation"],
            registry=registry,
            buckets=PAUSE_BUCKETS,
        )
        self.frozen = Gauge(
            "podnet_gc_frozen_objects",
            "Objects in the permanent generation, which collections do not walk",
            registry=registry,
        )
        # The callback runs inside whatever allocation started a collection, which may be
        # inside prometheus_client's own code with the metric's lock held (a /metrics
        # render copying its children): it must not call ``labels()``, which takes that
        # (non-reentrant) lock. The children are made here, once.
        self._pause_of = [self.pauses.labels(str(g)) for g in range(3)]
        self.trims = Histogram(
            "podnet_malloc_trim_seconds",
            "Pauses handing the C heap's free pages back to the kernel",
            registry=registry,
            buckets=PAUSE_BUCKETS,
        )
        self._trim = malloc_trim()
        self._task: asyncio.Task[None] | None = None
        self._began = 0.0
        self._thresholds = gc.get_threshold()

    def start(self) -> None:
        gc.set_threshold(YOUNG_THRESHOLD, *self._thresholds[1:])
        gc.callbacks.append(self._observe)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="heap")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._observe)
        gc.set_threshold(*self._thresholds)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.schedule.freeze_every)
            self.apply(self.schedule.step(time.monotonic()))

    def apply(self, step: Step) -> None:
        """Collect what is not frozen (after a thaw: everything), then freeze the rest."""
        if step == "thaw":
            gc.unfreeze()
        started = time.perf_counter()
        found = gc.collect()
        gc.freeze()
        self.frozen.set(gc.get_freeze_count())
        if self._trim is not None:
            with self.trims.time():
                self._trim(0)
        if step == "thaw":
            log.info(
                "full collection: %d unreachable, %.0f ms; %d objects frozen",
                found,
                (time.perf_counter() - started) * 1000,
                gc.get_freeze_count(),
            )

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        """A ``gc.callbacks`` hook (in whichever thread collects)."""
        if phase == "start":
            self._began = time.perf_counter()
            return
        pause = time.perf_counter() - self._began
        self._pause_of[info["generation"]].observe(pause)
        if info["generation"] == 2 and pause > SLOW_FULL:
            gc.freeze()  # the collection is over: its survivors move to the permanent one
            self.frozen.set(gc.get_freeze_count())
