"""Shared watches (``podnet.client.informers``): one list + watch per kind whatever the
number of subscribers, the same events for each, a listing of its own for a late one,
relists and permanent errors reaching all, nothing lost by a slow one; and the fanout's
bookkeeping under any interleaving (hypothesis)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_client_reflector import FAST, MemoryApi, names, shop_api, take

from podnet.client import ADDED, DELETED, LISTED, MODIFIED, StatusError, WatchEvent
from podnet.client.informers import Fanout, Informers
from podnet.client.watch import listed
from podnet.model.kinds import POD, SERVICE

Obj = dict[str, Any]


@pytest.fixture
async def api() -> MemoryApi:
    return await shop_api()


def calls(api: MemoryApi, what: str) -> int:
    return sum(1 for call, _ in api.calls if call == what)


async def test_subscribers_share_one_list_and_one_watch(api: MemoryApi) -> None:
    hub = Informers(api, backoff=FAST)
    one, two, three = hub.watch(POD), hub.watch(POD), hub.watch(POD)
    firsts = await asyncio.gather(take(one, 1), take(two, 1), take(three, 1))
    assert [names(events[0]) for events in firsts] == [("LISTED", ["a", "b"])] * 3
    await api.put("shop", "c")
    await api.remove("shop", "a")
    seen = await asyncio.gather(take(one, 2), take(two, 2), take(three, 2))
    assert [[names(e) for e in events] for events in seen] == [
        [("ADDED", ["c"]), ("DELETED", ["a"])]
    ] * 3
    assert (calls(api, "list"), calls(api, "watch"), hub.started) == (1, 1, 1)
    assert hub.subscribers(POD) == 3


async def test_has_listed_after_the_first_listing_only(api: MemoryApi) -> None:
    hub = Informers(api, backoff=FAST)
    assert not hub.has_listed(POD)
    stream = hub.watch(POD)
    await take(stream, 1)
    assert hub.has_listed(POD)
    assert not hub.has_listed(SERVICE)
    assert not hub.has_listed(POD, "shop")  # another selector is another watch


async def test_a_late_subscriber_gets_a_listing_of_its_own_then_the_changes(
    api: MemoryApi,
) -> None:
    """The hub keeps no objects, so a subscriber joining after the shared listing lists
    for itself; the early one's stream is not disturbed."""
    hub = Informers(api, backoff=FAST)
    early = hub.watch(POD)
    await take(early, 1)
    await api.put("shop", "c")
    await api.remove("shop", "a")
    await api.put("shop", "b", spec={"changed": True})
    await take(early, 3)
    late = hub.watch(POD)
    (first,) = await take(late, 1)
    assert first.type == LISTED
    assert sorted(o["metadata"]["name"] for o in first.items) == ["b", "c"]
    b = next(o for o in first.items if o["metadata"]["name"] == "b")
    assert b["spec"] == {"changed": True}
    assert first.resource_version == api.revision
    await api.put("shop", "d")
    assert [names(e) for e in await take(late, 1)] == [("ADDED", ["d"])]
    assert [names(e) for e in await take(early, 1)] == [("ADDED", ["d"])]
    assert (calls(api, "list"), hub.started, hub.subscribers(POD)) == (2, 2, 1)


def test_the_fanout_refuses_a_subscriber_after_the_listing() -> None:
    fanout = Fanout()
    fanout.subscribe()
    fanout.publish(listed((), 5))
    with pytest.raises(RuntimeError, match="its own"):
        fanout.subscribe()


async def test_a_relist_after_410_reaches_every_subscriber(api: MemoryApi) -> None:
    hub = Informers(api, backoff=FAST)
    one, two = hub.watch(POD), hub.watch(POD)
    await asyncio.gather(take(one, 1), take(two, 1))
    await api.fail_watches(None)  # the watch ends; while away, "a" goes and history goes
    await api.remove("shop", "a")
    await api.put("shop", "c")
    api.compact()
    # The reflector resumes from the last version it saw: 410, so it lists again.
    for stream in (one, two):
        events = await take(stream, 2)
        assert [names(e) for e in events] == [("DELETED", ["a"]), ("LISTED", ["b", "c"])]
    assert calls(api, "list") == 2


async def test_a_slow_subscriber_loses_nothing_and_holds_up_no_one(api: MemoryApi) -> None:
    hub = Informers(api, backoff=FAST)
    quick, slow = hub.watch(POD), hub.watch(POD)
    await asyncio.gather(take(quick, 1), take(slow, 1))
    for n in range(200):
        await api.put("shop", f"p{n}")
    assert [names(e)[1][0] for e in await take(quick, 200)] == [f"p{n}" for n in range(200)]
    assert [names(e)[1][0] for e in await take(slow, 200)] == [f"p{n}" for n in range(200)]


async def test_a_permanent_error_reaches_every_subscriber_and_a_new_one_starts_over(
    api: MemoryApi,
) -> None:
    hub = Informers(api, backoff=FAST)
    one, two = hub.watch(POD), hub.watch(POD)
    await asyncio.gather(take(one, 1), take(two, 1))
    await api.fail_watches(StatusError("no watching", 403, "Forbidden"))
    for stream in (one, two):
        with pytest.raises(StatusError, match="no watching"):
            await take(stream, 1)
    assert not hub.has_listed(POD)
    again = hub.watch(POD)
    assert [names(e) for e in await take(again, 1)] == [("LISTED", ["a", "b"])]
    assert (calls(api, "list"), hub.started) == (2, 2)


async def test_the_watch_closes_when_the_last_subscriber_leaves(api: MemoryApi) -> None:
    hub = Informers(api, backoff=FAST)
    one, two = hub.watch(POD), hub.watch(POD)
    await asyncio.gather(take(one, 1), take(two, 1))
    await one.aclose()
    assert hub.subscribers(POD) == 1 and hub.has_listed(POD)
    await two.aclose()
    assert hub.subscribers(POD) == 0 and not hub.has_listed(POD)
    await take(hub.watch(POD), 1)
    assert hub.started == 2


async def test_close_ends_every_stream(api: MemoryApi) -> None:
    hub = Informers(api, backoff=FAST)
    stream = hub.watch(POD)
    await take(stream, 1)
    await hub.close()
    assert await take(stream, 1) == []


# ---- the fanout's bookkeeping, any interleaving --------------------------------------------


def _obj(name: str, version: int) -> Obj:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": str(version)}}


@st.composite
def histories(draw: st.DrawFn) -> list[WatchEvent]:
    """A listing, then changes (with relists among them), resourceVersions increasing."""
    pool = ["a", "b", "c", "d"]
    version, held, events = 1, set[str](), []
    start = draw(st.sets(st.sampled_from(pool)))
    events.append(listed(tuple(_obj(n, version) for n in sorted(start)), version))
    held |= start
    for _ in range(draw(st.integers(0, 25))):
        version += 1
        name = draw(st.sampled_from(pool))
        if draw(st.integers(0, 9)) == 0:
            names_now = draw(st.sets(st.sampled_from(pool)))
            events.append(listed(tuple(_obj(n, version) for n in sorted(names_now)), version))
            held = set(names_now)
        elif name in held and draw(st.booleans()):
            events.append(WatchEvent(DELETED, _obj(name, version)))
            held.discard(name)
        else:
            events.append(WatchEvent(MODIFIED if name in held else ADDED, _obj(name, version)))
            held.add(name)
    return events


def _fold(state: dict[str, Obj], event: WatchEvent) -> None:
    if event.type == LISTED:
        state.clear()
        state.update({o["metadata"]["name"]: o for o in event.items})
    elif event.type == DELETED:
        state.pop(event.object["metadata"]["name"], None)
    else:
        state[event.object["metadata"]["name"]] = event.object


@given(
    events=histories(),
    subscribers=st.integers(1, 4),
    reads=st.lists(st.integers(0, 3), max_size=120),
)
def test_fanout_any_interleaving_gives_each_subscriber_the_same_view(
    events: list[WatchEvent], subscribers: int, reads: list[int]
) -> None:
    """Subscribers (joined before the listing) read at arbitrary moments while events
    are published: each receives every event in order, and all end in the same state."""
    fanout = Fanout()
    queues = [fanout.subscribe() for _ in range(subscribers)]
    got: list[list[WatchEvent]] = [[] for _ in range(subscribers)]
    truth: dict[str, Obj] = {}
    reading = iter(reads)
    for event in events:
        fanout.publish(event)
        _fold(truth, event)
        reader = next(reading, None)
        if reader is not None and reader < subscribers and not queues[reader].empty():
            got[reader].append(queues[reader].get_nowait())
    for queue, seen in zip(queues, got, strict=True):
        while not queue.empty():
            seen.append(queue.get_nowait())
        state: dict[str, Obj] = {}
        for event in seen:
            _fold(state, event)
        assert state == truth
        assert seen == events
