"""``podnet.heap``: the freeze/thaw schedule (pure), and what freezing does to the real
collector: a cycle frozen before it died outlives collections until a thaw."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from podnet import heap as heap_module
from podnet.heap import HeapGovernor, Schedule


def test_the_schedule_freezes_each_period_and_thaws_once_per_thaw_period() -> None:
    schedule = Schedule(freeze_every=30, thaw_every=90, started=1000)
    steps = [schedule.step(1000 + 30 * i) for i in range(1, 8)]
    assert steps == ["freeze", "freeze", "thaw", "freeze", "freeze", "thaw", "freeze"]


@pytest.mark.parametrize(("freeze", "thaw"), [(0, 60), (-1, 60), (60, 30)])
def test_a_schedule_that_cannot_run_is_refused(freeze: float, thaw: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        Schedule(freeze_every=freeze, thaw_every=thaw)


class Node:
    """A reference cycle's member (a weakref tells whether it was reclaimed)."""

    def __init__(self) -> None:
        self.other: Node | None = None


REGISTRY = CollectorRegistry()
GOVERNOR = HeapGovernor(REGISTRY, freeze_every=1, thaw_every=2)


@pytest.fixture
def governor() -> Iterator[HeapGovernor]:
    gc.unfreeze()
    gc.callbacks.append(GOVERNOR._observe)
    try:
        yield GOVERNOR
    finally:
        gc.callbacks.remove(GOVERNOR._observe)
        gc.unfreeze()


def _cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_a_freeze_keeps_collections_off_old_objects_until_a_thaw(governor: HeapGovernor) -> None:
    dead_before = _cycle()  # garbage already: the freeze step collects it first
    governor.apply("freeze")
    assert dead_before() is None
    assert gc.get_freeze_count() > 0
    assert REGISTRY.get_sample_value("podnet_gc_frozen_objects") == gc.get_freeze_count()

    a, b = Node(), Node()
    a.other, b.other = b, a
    alive_then = weakref.ref(a)
    governor.apply("freeze")  # the cycle is reachable now: frozen with the rest
    del a, b
    gc.collect()  # a full collection does not walk the permanent generation
    assert alive_then() is not None
    governor.apply("freeze")
    assert alive_then() is not None
    governor.apply("thaw")  # everything is walked once: the dead cycle is reclaimed
    assert alive_then() is None
    assert gc.get_freeze_count() > 0


def test_every_collection_pause_is_observed() -> None:
    registry = CollectorRegistry()
    heap = HeapGovernor(registry)
    gc.callbacks.append(heap._observe)
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        gc.callbacks.remove(heap._observe)
        gc.unfreeze()  # a slow full collection froze the heap
    for generation in ("0", "2"):
        labels = {"generation": generation}
        assert registry.get_sample_value("podnet_gc_pause_seconds_count", labels) == 1
        assert registry.get_sample_value("podnet_gc_pause_seconds_sum", labels) > 0


def test_a_slow_full_collection_freezes_what_it_walked(
    governor: HeapGovernor, monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.collect(1)
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(heap_module, "SLOW_FULL", 1.0)
    gc.collect(2)  # quick: nothing frozen
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(heap_module, "SLOW_FULL", 0.0)
    gc.collect(1)  # a younger generation's collection freezes nothing either
    assert gc.get_freeze_count() == 0
    gc.collect(2)
    assert gc.get_freeze_count() > 0
    assert REGISTRY.get_sample_value("podnet_gc_frozen_objects") == gc.get_freeze_count()


async def test_start_and_stop_leave_the_collector_as_they_found_it() -> None:
    before = gc.get_threshold()
    heap = HeapGovernor(CollectorRegistry(), freeze_every=60, thaw_every=60)
    heap.start()
    try:
        assert gc.get_threshold() == (heap_module.YOUNG_THRESHOLD, *before[1:])
        assert heap._observe in gc.callbacks
    finally:
        await heap.stop()
        gc.unfreeze()
    assert gc.get_threshold() == before
    assert heap._observe not in gc.callbacks


def test_a_collection_while_the_metrics_lock_is_held_does_not_deadlock(
    governor: HeapGovernor,
) -> None:
    """A collection can start inside prometheus_client's code while it holds the
    histogram's lock (a /metrics render copying the children): the hook must not take
    that lock again."""
    finished = threading.Event()

    def collect_under_the_lock() -> None:
        with governor.pauses._lock:
            gc.collect(0)
        finished.set()

    worker = threading.Thread(target=collect_under_the_lock, daemon=True)
    worker.start()
    assert finished.wait(10), "the gc hook deadlocked on the metric's lock"


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_each_step_hands_free_heap_pages_back_to_the_kernel() -> None:
    """Memory freed below a live allocation stays resident (glibc only trims the top of
    its heap) until ``malloc_trim``: each step runs it, and times it."""
    registry = CollectorRegistry()
    governor = HeapGovernor(registry)
    assert governor._trim is not None, "glibc's malloc_trim is missing"
    blocks = [bytearray(64 * 1024) for _ in range(2000)]  # 128 MB inside the C heap
    for block in blocks:
        block[::4096] = b"x" * len(block[::4096])  # touch every page: resident
    pin = bytearray(1024)  # allocated above them: the heap's top cannot shrink past it
    del blocks
    before = _rss_mb()
    governor.apply("freeze")
    gc.unfreeze()
    assert before - _rss_mb() > 64, "the freed blocks stayed resident"
    assert registry.get_sample_value("podnet_malloc_trim_seconds_count") == 1
    del pin
