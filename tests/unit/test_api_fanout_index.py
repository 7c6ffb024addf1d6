"""The fan-out's group index (by kind, by pinned name) writes exactly what a scan of every
watcher writes: the same bytes to each watcher, the same 410s, the same bookmarks.

The reference below is the fan-out before the index: every watcher kept its own position
in the ring and every dispatch visited every watcher. Hypothesis drives both with the same
random watchers (kinds, namespaces, label and field selectors, some pinned to a name),
events, removals, ring overflows, dispatches and bookmarks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.api import storedform
from podnet.api.cachedobjects import CachedEvent, WatchFilter
from podnet.api.fanout import Fanout, Watcher, _bookmark_line, frame
from podnet.api.listing import read_from_etcd
from podnet.api.registry import Registry
from podnet.api.watchcache import WatchCache
from podnet.model import errors
from podnet.model.kinds import HOST_SUBNET, NAMESPACE, POD, Kind
from podnet.model.selectors import FieldRequirement, parse_label_selector
from podnet.store.memory import MemoryStore
from podnet.testing.api import namespace

NAMES = ["a", "b", "c"]


class Sink:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False


class ScanFanout:
    """The reference: every dispatch visits every watcher at its own position."""

    def __init__(self) -> None:
        self.watchers: dict[Watcher, None] = {}
        self.expired = 0

    def add(self, watcher: Watcher) -> None:
        self.watchers[watcher] = None

    def remove(self, watcher: Watcher) -> None:
        self.watchers.pop(watcher, None)

    def dispatch(self, events: list[CachedEvent], offset: int) -> None:
        end = offset + len(events)
        for watcher in list(self.watchers):
            if watcher.position >= end:
                continue
            if watcher.position < offset:
                self.remove(watcher)
                self.expired += 1
                watcher.finish(errors.gone("too old resource version: behind"))
                continue
            lines = [
                e.line(seen)
                for e in events[watcher.position - offset :]
                if (seen := watcher.filter.view(e))
            ]
            watcher.position = end
            if lines:
                watcher.sink.write(frame(b"".join(lines)))

    def bookmark(self, revision: int, end: int) -> None:
        for watcher in list(self.watchers):
            if watcher.bookmarks and watcher.position >= end:
                watcher.sink.write(frame(_bookmark_line(watcher.filter.kind, revision)))


def an_object(kind: Kind, namespace: str | None, name: str, app: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app": app}}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, "subnet": f"10.0.{NAMES.index(name)}.0/24"}


@dataclass
class Ring:
    """The cache's ring of events, as the watch cache keeps it."""

    capacity: int
    events: list[CachedEvent]
    offset: int = 0
    revision: int = 0

    def append(self, event: CachedEvent) -> None:
        self.events.append(event)
        if len(self.events) > self.capacity:
            drop = len(self.events) - self.capacity
            del self.events[:drop]
            self.offset += drop

    @property
    def end(self) -> int:
        return self.offset + len(self.events)


kinds = st.sampled_from([POD, HOST_SUBNET])
filters = st.builds(
    lambda kind, ns, labels, fields: WatchFilter(
        kind, ns if kind.namespaced else None, labels, tuple(fields)
    ),
    kinds,
    st.sampled_from([None, "x", "y"]),
    st.sampled_from([None, parse_label_selector("app=web"), parse_label_selector("app!=web")]),
    st.one_of(
        st.just([]),
        st.builds(
            lambda name: [FieldRequirement("metadata.name", "=", name)], st.sampled_from(NAMES)
        ),
        st.lists(
            st.builds(
                FieldRequirement,
                st.sampled_from(["metadata.name", "metadata.namespace"]),
                st.sampled_from(["=", "!="]),
                st.sampled_from([*NAMES, "x"]),
            ),
            max_size=2,
        ),
    ),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("watch"), filters, st.integers(0, 6), st.booleans()),
        st.tuples(
            st.just("event"),
            kinds,
            st.sampled_from(["x", "y"]),
            st.sampled_from(NAMES),
            st.sampled_from(["web", "db"]),
            st.sampled_from(["put", "delete"]),
        ),
        st.tuples(st.just("dispatch")),
        st.tuples(st.just("bookmark")),
        st.tuples(st.just("unwatch"), st.integers(0, 20)),
    ),
    min_size=10,
    max_size=80,
)


def run(fanout: Any, capacity: int, script: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Play ``script`` on ``fanout``; what each watcher got and how it ended."""

    async def play() -> list[tuple[Any, ...]]:
        ring = Ring(capacity, [])
        stored: dict[tuple[Kind, str | None, str], bytes] = {}
        watchers: list[Watcher] = []
        for step in script:
            if step[0] == "watch":
                _, wf, back, bookmarks = step
                position = max(ring.offset, ring.end - back)
                watcher = Watcher(wf, Sink(), position, bookmarks)
                watchers.append(watcher)
                fanout.add(watcher)
            elif step[0] == "event":
                _, kind, ns, name, app, change = step
                ns = ns if kind.namespaced else None
                ring.revision += 1
                old = stored.get((kind, ns, name))
                prev = storedform.probe(kind, storedform.decode(old, 0)) if old else None
                if change == "delete":
                    if old is None:
                        continue
                    del stored[(kind, ns, name)]
                    event = CachedEvent(ring.revision, kind, ns, name, "DELETED", old, prev, prev)
                else:
                    value = storedform.encode(an_object(kind, ns, name, app))
                    stored[(kind, ns, name)] = value
                    probe = storedform.probe(kind, storedform.decode(value, 0))
                    type_ = "MODIFIED" if old else "ADDED"
                    event = CachedEvent(ring.revision, kind, ns, name, type_, value, probe, prev)
                ring.append(event)
            elif step[0] == "dispatch":
                fanout.dispatch(ring.events, ring.offset)
            elif step[0] == "bookmark":
                fanout.bookmark(ring.revision, ring.end)
            elif watchers:
                fanout.remove(watchers[step[1] % len(watchers)])
        fanout.dispatch(ring.events, ring.offset)
        return [
            (
                bytes(w.sink.data),  # type: ignore[attr-defined]
                w.done.result().code if w.done.done() and w.done.result() else None,
            )
            for w in watchers
        ]

    return asyncio.run(play())


@settings(max_examples=400, deadline=None)
@given(steps, st.integers(2, 8))
def test_the_index_writes_what_a_scan_of_every_watcher_writes(
    script: list[tuple[Any, ...]], capacity: int
) -> None:
    indexed, scanned = Fanout(), ScanFanout()
    assert run(indexed, capacity, script) == run(scanned, capacity, script)
    assert indexed.expired == scanned.expired
    assert len(indexed) == len(scanned.watchers)


def test_a_pinned_watcher_is_not_visited_for_other_names() -> None:
    """The point of the index: an event of another name or kind never reaches a watcher
    pinned to a name (its filter is not even asked)."""

    class CountingFilter(WatchFilter):
        asked = 0

        def view(self, event: CachedEvent) -> str | None:
            CountingFilter.asked += 1
            return super().view(event)

    async def scenario() -> None:
        fanout = Fanout()
        pinned = CountingFilter(
            HOST_SUBNET, None, None, (FieldRequirement("metadata.name", "=", "a"),)
        )
        sink = Sink()
        fanout.add(Watcher(pinned, sink, 0))
        value = storedform.encode(an_object(HOST_SUBNET, None, "b", "web"))
        probe = storedform.probe(HOST_SUBNET, storedform.decode(value, 0))
        other = CachedEvent(1, HOST_SUBNET, None, "b", "ADDED", value, probe, None)
        fanout.dispatch([other], 0)
        assert CountingFilter.asked == 0 and not sink.data
        value = storedform.encode(an_object(HOST_SUBNET, None, "a", "web"))
        probe = storedform.probe(HOST_SUBNET, storedform.decode(value, 0))
        mine = CachedEvent(2, HOST_SUBNET, None, "a", "ADDED", value, probe, None)
        fanout.dispatch([other, mine], 0)
        assert CountingFilter.asked == 1 and b'"name":"a"' in sink.data

    asyncio.run(scenario())


objects = st.lists(
    st.tuples(st.sampled_from(["x", "y"]), st.sampled_from(NAMES), st.sampled_from(["web", "db"])),
    max_size=12,
)


@settings(max_examples=100, deadline=None)
@given(objects, filters)
def test_a_list_by_name_answers_what_a_scan_answers(
    stored: list[tuple[str, str, str]], wf: WatchFilter
) -> None:
    """``fieldSelector=metadata.name=<name>`` reads one key of the cache instead of
    scanning the kind; the answer is the scan's, item for item."""

    async def scenario() -> None:
        registry = Registry(MemoryStore())
        for ns in ("x", "y"):
            await registry.create(NAMESPACE, namespace(ns))
        for ns, name, app in stored:
            for kind in (POD, HOST_SUBNET):
                obj = an_object(kind, ns if kind.namespaced else None, name, app)
                if kind is POD:
                    del obj["subnet"]
                    obj["spec"] = {"containers": [{"name": "c", "image": "i"}]}
                else:
                    obj["host"], obj["hostIP"] = name, f"192.0.2.{NAMES.index(name) + 1}"
                try:
                    await registry.create(kind, obj, ns if kind.namespaced else None)
                except errors.ApiError as exc:  # a cluster-wide name taken twice
                    if exc.reason != "AlreadyExists":
                        raise
        cache = WatchCache(registry)
        await cache.start()
        try:
            got, _ = cache.objects(wf.kind, wf.namespace, wf.labels, wf.fields)
            every, _ = cache.objects(wf.kind, wf.namespace)
            assert stored == [] or len(cache.objects(wf.kind)[0]) > 0
            scanned = [(key, obj) for key, obj in every if wf.selects(obj.probe)]
            assert list(got) == scanned
        finally:
            await cache.stop()

    asyncio.run(scenario())


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["x", "y"]), st.sampled_from(["a", "ab", "b"])), max_size=8),
    filters,
    st.sampled_from(["a", "ab", "b"]),
)
def test_a_list_by_name_read_from_etcd_answers_what_the_whole_kind_answers(
    stored: list[tuple[str, str]], wf: WatchFilter, pinned: str
) -> None:
    """When the cache lags, a list pinned to a name reads the keys under that name's key
    (``ab`` lies under ``a``: the field still decides), and answers what a read of the
    whole kind answers, at the same revision."""

    async def scenario() -> None:
        registry = Registry(MemoryStore())
        for ns in ("x", "y"):
            await registry.create(NAMESPACE, namespace(ns))
        for i, (ns, name) in enumerate(stored):
            body: dict[str, Any] = {"metadata": {"name": name, "labels": {"app": "web"}}}
            body["spec"] = {"containers": [{"name": "c", "image": "i"}]}
            try:
                await registry.create(POD, body, ns)
                await registry.create(HOST_SUBNET, host_subnet(name, i))
            except errors.ApiError as exc:
                if exc.reason != "AlreadyExists":
                    raise
        fields = (*wf.fields, FieldRequirement("metadata.name", "=", pinned))
        args = (wf.kind, wf.namespace, wf.labels, fields)
        assert await read_from_etcd(registry, *args) == await registry.list(*args)

    asyncio.run(scenario())


def host_subnet(name: str, i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "web"}},
        "host": name,
        "hostIP": f"192.0.2.{i + 1}",
        "subnet": f"10.1.{i}.0/24",
    }
