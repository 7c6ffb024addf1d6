"""``podnet.reconcile``: the loop on a fake clock, bisection, the status note, metrics.

The target here is a list of named items applied all or nothing to a recorder that
refuses chosen items permanently (``DataPlaneRejected``, as nft refusing a rendering)
and fails transiently a chosen number of times. The clock is fake: sleeps return at
once and are recorded, and the resync period passes only when a test says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from podnet.client import Backoff
from podnet.dataplane.interface import DataPlaneError, DataPlaneRejected
from podnet.reconcile import (
    APPLIED,
    FAILED,
    PARTIAL,
    REJECTED,
    ApplyRecord,
    Clock,
    Pacing,
    ReconcileLoop,
    ReconcileMetrics,
    StatusNote,
)
from podnet.reconcile.bisect import find_rejected

COALESCE = 0.05
BACKOFF = Backoff(1.0, 8.0, floor=1.0)  # no jitter: delays 1, 2, 4, 8, 8...


class FakeClock(Clock):
    """Sleeps return at once (recorded); ``wait`` times out only on ``resync()``."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.during_sleep: Callable[[], None] | None = None
        self._tick = asyncio.Event()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.during_sleep is not None:
            self.during_sleep()
        await asyncio.sleep(0)

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        ticked = asyncio.ensure_future(self._tick.wait())
        waited = asyncio.ensure_future(event.wait())
        await asyncio.wait({ticked, waited}, return_when=asyncio.FIRST_COMPLETED)
        ticked.cancel()
        waited.cancel()
        if event.is_set():
            return True
        self._tick.clear()
        self.now += timeout
        return False

    def resync(self) -> None:
        """Let the resync period pass."""
        self._tick.set()


@dataclass
class Items:
    """The target: named items, applied whole to ``held``."""

    items: list[str] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)  # refused permanently
    transient_failures: int = 0
    held: list[str] | None = None
    applies: list[list[str]] = field(default_factory=list)
    after: list[ApplyRecord] = field(default_factory=list)
    name: str = "items"

    def take(self) -> Callable[[], list[str]]:
        snapshot = list(self.items)
        return lambda: snapshot

    async def apply(self, desired: list[str]) -> None:
        self.applies.append(list(desired))
        if self.transient_failures:
            self.transient_failures -= 1
            raise DataPlaneError("busy")
        bad = sorted(self.refuse & set(desired))
        if bad:
            raise DataPlaneRejected(f"refused {', '.join(bad)}")
        self.held = list(desired)

    def keys(self, desired: list[str]) -> Sequence[str]:
        return list(desired)

    def without(self, desired: list[str], left_out: frozenset[str]) -> list[str]:
        return [item for item in desired if item not in left_out]

    def describe(self, desired: list[str]) -> str:
        return f"{len(desired)} items"

    async def after_apply(self, desired: list[str], record: ApplyRecord) -> None:
        self.after.append(record)


@dataclass
class Running:
    target: Items
    loop: ReconcileLoop[list[str]]
    clock: FakeClock
    metrics: ReconcileMetrics
    records: list[ApplyRecord]
    task: asyncio.Task[None]

    async def passes(self, count: int) -> None:
        """Let the loop run until ``count`` records exist (bounded)."""
        for _ in range(10_000):
            if len(self.records) >= count:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"only {len(self.records)} passes: {self.records}")

    async def idle(self) -> None:
        for _ in range(200):
            await asyncio.sleep(0)

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {"loop": "items", **labels})
        return value or 0.0


@pytest.fixture
async def running() -> object:
    started: list[Running] = []

    def start(target: Items, inputs: tuple[str, ...] = ()) -> Running:
        clock, metrics, records = FakeClock(), ReconcileMetrics(), []
        loop = ReconcileLoop(
            target,
            Pacing(30.0, COALESCE, backoff=BACKOFF),
            inputs=inputs,
            metrics=metrics,
            report=records.append,
            clock=clock,
        )
        task = asyncio.create_task(loop.run())
        started.append(Running(target, loop, clock, metrics, records, task))
        return started[-1]

    yield start
    for one in started:
        one.task.cancel()
    await asyncio.gather(*(one.task for one in started), return_exceptions=True)


# ---- the loop ------------------------------------------------------------------------------


async def test_nothing_is_applied_before_every_input_has_listed(running: object) -> None:
    run = running(Items(["a", "b"]), inputs=("pods", "policies"))  # type: ignore[operator]
    run.loop.changed()
    await run.idle()
    run.loop.listed("pods")
    await run.idle()
    assert run.target.applies == [] and not run.loop.ready() and not run.loop.synced.is_set()
    run.loop.listed("policies")
    await run.passes(1)
    assert run.target.applies == [["a", "b"]] and run.loop.synced.is_set()
    assert run.records[0].result == APPLIED and run.records[0].what == "2 items"


async def test_a_burst_during_the_coalescing_wait_is_one_apply(running: object) -> None:
    target = Items(["a"])
    run = running(target)  # type: ignore[operator]
    await run.passes(1)
    burst = iter(range(10))

    def more() -> None:  # changes keep coming while the loop waits for the rest
        for i in burst:
            target.items.append(f"n{i}")
            run.loop.changed()

    run.clock.during_sleep = more
    run.loop.changed()
    await run.passes(2)
    await run.idle()
    assert target.applies == [["a"], ["a", *(f"n{i}" for i in range(10))]]
    assert run.clock.sleeps == [COALESCE, COALESCE]


async def test_transient_errors_back_off_then_succeed(running: object) -> None:
    run = running(Items(["a"], transient_failures=3))  # type: ignore[operator]
    await run.passes(4)
    assert [r.result for r in run.records] == [FAILED, FAILED, FAILED, APPLIED]
    assert run.records[0].error == "busy"
    # coalesce, backoff 1; coalesce, backoff 2; coalesce, backoff 4; coalesce
    assert run.clock.sleeps == [COALESCE, 1.0, COALESCE, 2.0, COALESCE, 4.0, COALESCE]
    assert run.target.held == ["a"] and run.loop.synced.is_set()
    assert run.metric("podnet_reconcile_applies_total", result=FAILED) == 3
    assert run.metric("podnet_reconcile_permanent_errors_total") == 0


async def test_a_refused_item_is_left_out_and_the_rest_applied(running: object) -> None:
    items = [f"p{i:02d}" for i in range(16)]
    target = Items(list(items), refuse={"p11"})
    run = running(target)  # type: ignore[operator]
    await run.passes(1)
    record = run.records[0]
    assert record.result == PARTIAL and record.left_out == ("p11",)
    assert "refused p11" in record.error
    assert target.held == [i for i in items if i != "p11"]
    assert target.applies[-1] == target.held  # the last apply is the one kept
    assert len(target.applies) <= 2 + 4 + 1  # whole, none, log2(16) halves, final
    assert run.loop.left_out == {"p11"} and run.loop.synced.is_set()
    assert run.metric("podnet_reconcile_permanent_errors_total") == 1
    assert run.metric("podnet_reconcile_left_out") == 1
    assert run.metric("podnet_reconcile_applies_total", result=PARTIAL) == 1
    assert not any(s in (1.0, 2.0) for s in run.clock.sleeps)  # no backoff: not transient

    applies = len(target.applies)
    run.clock.resync()  # the same state again: re-applied as cut, no second search
    await run.passes(2)
    assert len(target.applies) == applies + 1 and target.applies[-1] == target.held
    assert run.records[1].result == PARTIAL and run.records[1].left_out == ("p11",)
    assert run.metric("podnet_reconcile_permanent_errors_total") == 1

    target.refuse.clear()  # the object is fixed: the next change applies it all
    target.items.append("p16")
    run.loop.changed()
    await run.passes(3)
    assert run.records[2].result == APPLIED and target.held == [*items, "p16"]
    assert run.metric("podnet_reconcile_left_out") == 0


async def test_several_refused_items_are_all_found(running: object) -> None:
    items = [f"p{i:02d}" for i in range(40)]
    target = Items(items, refuse={"p03", "p04", "p31"})
    run = running(target)  # type: ignore[operator]
    await run.passes(1)
    assert run.records[0].left_out == ("p03", "p04", "p31")
    assert target.held == [i for i in items if i not in target.refuse]


async def test_a_refusal_no_item_explains_is_recorded_not_retried_in_a_loop(
    running: object,
) -> None:
    target = Items(["a", "b"], refuse={"a", "b"})
    target.refuse_all = True  # type: ignore[attr-defined]
    run = running(target)  # type: ignore[operator]

    async def always_refuse(desired: list[str]) -> None:
        target.applies.append(list(desired))
        raise DataPlaneRejected("nft: Operation not permitted")

    target.apply = always_refuse  # type: ignore[method-assign]
    await run.passes(1)
    await run.idle()
    assert [r.result for r in run.records] == [REJECTED]
    assert target.applies == [["a", "b"], []]  # whole, then nothing: still refused
    assert not run.loop.synced.is_set() and run.clock.sleeps == [COALESCE]
    run.clock.resync()  # tried again at the resync, and said again
    await run.passes(2)
    assert run.records[1].result == REJECTED
    assert run.metric("podnet_reconcile_permanent_errors_total") == 2


# ---- bisection -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "bad"),
    [(1, {0}), (2, {1}), (7, {0, 6}), (100, {50}), (100, {0, 1, 2}), (1000, {999})],
)
async def test_find_rejected_finds_exactly_the_bad_keys(count: int, bad: set[int]) -> None:
    keys = [f"k{i}" for i in range(count)]
    refused = {keys[i] for i in bad}
    calls: list[frozenset[str]] = []

    async def accepts(left_out: frozenset[str]) -> bool:
        calls.append(left_out)
        return refused <= left_out

    assert await find_rejected(keys, accepts) == refused
    assert calls[-1] == refused  # the state left applied
    bound = 2 + len(bad) * (count.bit_length() + 1)
    assert len(calls) <= bound, (len(calls), bound)


async def test_find_rejected_gives_up_when_no_key_explains_it() -> None:
    async def never(left_out: frozenset[str]) -> bool:
        return False

    assert await find_rejected(["a", "b"], never) is None
    assert await find_rejected([], never) is None


async def test_find_rejected_stops_at_its_limit() -> None:
    async def only_all_out(left_out: frozenset[str]) -> bool:
        return len(left_out) >= 60

    assert await find_rejected([f"k{i}" for i in range(64)], only_all_out, limit=20) is None


# ---- the status note -----------------------------------------------------------------------


def record(result: str, at: float, left_out: tuple[str, ...] = ()) -> ApplyRecord:
    return ApplyRecord("policy", "3 pods", at, 0.012, result, "", left_out, 0.002)


async def test_status_note_is_compact_and_rate_limited() -> None:
    clock = FakeClock()
    published: list[str] = []

    async def publish(text: str) -> None:
        published.append(text)

    note = StatusNote(publish, 5.0, 300.0, first_delay=1.0, clock=clock)
    task = asyncio.create_task(note.run())
    try:
        note.record(record(APPLIED, clock.now))
        note.record(dataclasses.replace(record(PARTIAL, clock.now, ("far",)), loop="remote"))
        await _idle()
        assert published == []  # the first write waits for every loop's first pass
        clock.resync()  # 1 s
        await _until(lambda: len(published) == 1)
        written = clock.now
        assert json.loads(published[0]) == {
            "policy": {
                "what": "3 pods",
                "at": "1970-01-01T00:16:40Z",
                "ms": 12.0,
                "compile_ms": 2.0,
                "result": "applied",
            },
            "remote": {
                "what": "3 pods",
                "at": "1970-01-01T00:16:40Z",
                "ms": 12.0,
                "compile_ms": 2.0,
                "result": "partial",
                "left_out": ["far"],
            },
        }
        assert "\n" not in published[0] and ", " not in published[0]
        note.record(record(APPLIED, clock.now + 30))  # a resync: only a refresh, not yet
        await _idle()
        assert len(published) == 1
        note.record(dataclasses.replace(record(APPLIED, clock.now), loop="remote"))  # news
        await _idle()
        assert len(published) == 1  # within 5 s of the last write
        clock.resync()
        await _until(lambda: len(published) == 2)
        assert clock.now == written + 5.0
        assert json.loads(published[1])["remote"]["result"] == "applied"
        assert note.writes == 2 and not note.news()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_status_note_tries_again_after_a_failed_publish() -> None:
    clock = FakeClock()
    attempts: list[str] = []

    async def publish(text: str) -> None:
        attempts.append(text)
        if len(attempts) == 1:
            raise OSError("API down")

    note = StatusNote(publish, 5.0, 300.0, first_delay=0.0, clock=clock)
    task = asyncio.create_task(note.run())
    try:
        note.record(record(PARTIAL, clock.now, ("shop/bad",)))
        await _until(lambda: len(attempts) == 1)
        assert note.writes == 0 and note.news()
        clock.resync()
        await _until(lambda: len(attempts) == 2)
        assert attempts[0] == attempts[1] and note.writes == 1 and not note.news()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def _idle() -> None:
    for _ in range(200):
        await asyncio.sleep(0)


def test_nft_errors_are_permanent_only_when_nft_refused_the_input() -> None:
    from podnet.dataplane.linux.nftables import nft_error

    refused = "nft transaction failed: /dev/stdin:2:87-91: Error: Range has zero or negative size"
    busy = "nft transaction failed: Error: Could not process rule: Device or resource busy"
    assert isinstance(nft_error(refused), DataPlaneRejected)
    assert type(nft_error(busy)) is DataPlaneError
    assert type(nft_error("nft transaction failed: killed")) is DataPlaneError


async def test_a_transient_error_during_bisection_starts_the_search_again(
    running: object,
) -> None:
    items = [f"p{i}" for i in range(8)]
    target = Items(list(items), refuse={"p5"})
    failing = {"left": 1}
    apply = target.apply

    async def busy_once_while_probing(desired: list[str]) -> None:
        if len(desired) < len(items) and failing["left"]:  # a probe, not the whole
            failing["left"] -= 1
            raise DataPlaneError("busy")
        await apply(desired)

    target.apply = busy_once_while_probing  # type: ignore[method-assign]
    run = running(target)  # type: ignore[operator]
    await run.passes(2)
    assert [r.result for r in run.records] == [FAILED, PARTIAL]
    assert run.records[1].left_out == ("p5",) and "refused p5" in run.records[1].error
    assert target.held == [i for i in items if i != "p5"]
    assert run.metric("podnet_reconcile_permanent_errors_total") == 2  # refused twice
