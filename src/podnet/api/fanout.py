"""Encode each event once and write it to every watcher that wants it.

Watchers are grouped by filter. When new events reach the cache, ``Fanout.dispatch``
goes over the groups the events can concern (indexed by kind, and by name for a
``metadata.name=<name>`` filter): for each group and starting point, the JSON lines of the
events its filter selects are joined into one HTTP/1.1 chunk, built once, and that same
bytes object is written to the transport of every watcher in the group (no per-watcher
encode, no per-watcher ``StreamResponse.write`` and its awaits). Events that reach the
cache together go out in one write per watcher.

A watcher catches up on its own (``_catch_up``) only on the events of one coalescing
window: its replay from an older revision is written before it joins, in bounded writes
(``podnet.api.replay``); a catch-up over the backlog bound is 410 too.

A watcher's backlog is its transport's write buffer. When it still holds more than
``backlog_limit`` bytes at the next write, the watcher is too slow: it is dropped with
410 Expired (its handler writes the ERROR event after the backlog and ends the
connection) and relists, while the others carry on; kube-apiserver does the same when a
watcher's channel is full. So one watcher holds at most the limit plus one write.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from podnet.api.cachedobjects import CachedEvent, WatchFilter
from podnet.model import errors
from podnet.model.kinds import Kind
from podnet.model.selectors import field_value

BACKLOG_LIMIT = 4 * 1024 * 1024  # bytes waiting in one watcher's transport
END = b"0\r\n\r\n"  # the last chunk of a chunked HTTP/1.1 body
GroupKey = tuple[Any, ...]  # WatchFilter.group(): watchers with equal keys see the same


class Sink(Protocol):
    """Where a watcher's bytes go: an asyncio transport, or a fake one in tests."""

    def write(self, data: bytes) -> None: ...

    def get_write_buffer_size(self) -> int: ...

    def is_closing(self) -> bool: ...


def frame(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked HTTP/1.1 body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def error_line(exc: errors.ApiError) -> bytes:
    return json.dumps({"type": "ERROR", "object": exc.status()}, separators=(",", ":")).encode()


@dataclass(eq=False)
class Watcher:
    """One watch connection served by the fan-out."""

    filter: WatchFilter
    sink: Sink
    position: int  # absolute index of the next event to send it (while it is pending)
    bookmarks: bool = False
    done: asyncio.Future[errors.ApiError | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    sent: int = 0  # events written
    turn: int = 0  # which share of the bookmark rounds is its (set by ``Fanout.add``)

    def finish(self, outcome: errors.ApiError | None) -> None:
        if not self.done.done():
            self.done.set_result(outcome)


class Fanout:
    """The watchers served from the cache's ring, grouped by filter.

    A watcher is *grouped* once it has been sent everything up to ``_end`` (the end of
    the last dispatch); until then (it started from an older revision, or events came
    after the last dispatch) it is *pending* and catches up on its own at the next
    dispatch. Grouped watchers need no position of their own, so a dispatch looks only at
    the groups an event can concern: the groups of its kind, and of a name-pinned filter
    (``fieldSelector=metadata.name=<name>``) only those pinned to its name. A write to a
    Lease costs nothing to the 5,000 watchers of HostSubnets.
    """

    def __init__(self, backlog_limit: int = BACKLOG_LIMIT) -> None:
        self.backlog_limit = backlog_limit
        # group -> its grouped watchers (a dict as an ordered set: removal is O(1))
        self._groups: dict[GroupKey, dict[Watcher, None]] = {}
        self._by_kind: dict[Kind, dict[GroupKey, None]] = {}  # groups without a pinned name
        self._by_name: dict[tuple[Kind, str], dict[GroupKey, None]] = {}  # pinned groups
        self._pending: dict[Watcher, None] = {}
        self._end = 0  # absolute index: every grouped watcher has had the events before it
        self._count = 0
        self._added = 0  # watchers ever added: deals them bookmark turns in rotation
        self.expired = 0

    def __len__(self) -> int:
        return self._count

    def add(self, watcher: Watcher) -> None:
        self._count += 1
        watcher.turn = self._added
        self._added += 1
        if watcher.position == self._end:
            self._join(watcher)
        else:
            self._pending[watcher] = None

    def _join(self, watcher: Watcher) -> None:
        key = watcher.filter.group()
        members = self._groups.get(key)
        if members is None:
            members = self._groups[key] = {}
            self._index_of(watcher.filter).setdefault(key, None)
        members[watcher] = None

    def _index_of(self, wf: WatchFilter) -> dict[GroupKey, None]:
        name = pinned_name(wf)
        if name is None:
            return self._by_kind.setdefault(wf.kind, {})
        return self._by_name.setdefault((wf.kind, name), {})

    def remove(self, watcher: Watcher) -> None:
        if watcher in self._pending:
            del self._pending[watcher]
            self._count -= 1
            return
        key = watcher.filter.group()
        members = self._groups.get(key)
        if members is None or watcher not in members:
            return
        del members[watcher]
        self._count -= 1
        if not members:
            del self._groups[key]
            self._unindex(watcher.filter, key)

    def _unindex(self, wf: WatchFilter, key: GroupKey) -> None:
        name = pinned_name(wf)
        if name is None:
            _discard(self._by_kind, wf.kind, key)
        else:
            _discard(self._by_name, (wf.kind, name), key)

    def dispatch(self, events: list[CachedEvent], offset: int) -> None:
        """Send every watcher the events it has not had (``events[0]`` is at ``offset``)."""
        end = offset + len(events)
        start, self._end = self._end, end
        if start < offset:  # undispatched events left the ring: the grouped may miss some
            for members in list(self._groups.values()):
                for watcher in list(members):
                    self._drop(watcher, "the watcher fell behind the watch cache")
        elif start < end:
            self._send_new(events[start - offset :])
        self._catch_up(events, offset, end)

    def _send_new(self, events: list[CachedEvent]) -> None:
        """``events`` (just arrived) to the grouped watchers whose filters select them."""
        concerned: dict[GroupKey, list[CachedEvent]] = {}
        for event in events:
            for key in self._candidates(event):
                concerned.setdefault(key, []).append(event)
        for key, candidates in concerned.items():
            members = self._groups.get(key)
            if not members:
                continue
            wf = next(iter(members)).filter
            lines = [event.line(seen) for event in candidates if (seen := wf.view(event))]
            if lines:
                chunk = frame(b"".join(lines))
                for watcher in list(members):
                    self._write(watcher, chunk, len(lines))

    def _candidates(self, event: CachedEvent) -> Iterator[GroupKey]:
        """The groups ``event`` may concern (a superset: each filter still decides)."""
        yield from self._by_kind.get(event.kind, ())
        if not self._by_name:
            return
        names = {field_value(p, "metadata.name") for p in (event.probe, event.prev_probe) if p}
        for name in names:
            yield from self._by_name.get((event.kind, name), ())

    def _catch_up(self, events: list[CachedEvent], offset: int, end: int) -> None:
        """Each pending watcher gets its events up to ``end`` and joins its group."""
        if not self._pending:
            return
        batches: dict[tuple[GroupKey, int], tuple[bytes, int]] = {}
        for watcher in list(self._pending):
            if watcher.position < offset:
                self._drop(watcher, "the watcher fell behind the watch cache")
                continue
            slot = (watcher.filter.group(), watcher.position)
            batch = batches.get(slot)
            if batch is None:
                wf = watcher.filter
                lines = [
                    event.line(seen)
                    for event in events[watcher.position - offset :]
                    if (seen := wf.view(event))
                ]
                batch = batches[slot] = (frame(b"".join(lines)), len(lines))
            if len(batch[0]) > self.backlog_limit:  # a replay over a live watcher's bound
                self._drop(watcher, "more to catch up on than a watcher's backlog bound")
                continue
            del self._pending[watcher]
            watcher.position = end
            self._join(watcher)
            if batch[1]:
                self._write(watcher, batch[0], batch[1])

    def bookmark(self, revision: int, end: int, turn: int = 0, turns: int = 1) -> None:
        """A BOOKMARK at ``revision`` to every caught-up watcher that asked for them and
        whose share this round is (``watcher.turn % turns == turn``): the rounds of one
        period deal the writes out, so 10,000 watchers never cost one long stall."""
        watchers = [w for w in self._pending if w.position >= end]
        if self._end >= end:
            watchers += [w for members in self._groups.values() for w in members]
        chunks: dict[Kind, bytes] = {}
        for watcher in watchers:
            if not watcher.bookmarks or watcher.turn % turns != turn % turns:
                continue
            kind = watcher.filter.kind
            chunk = chunks.get(kind)
            if chunk is None:
                chunk = chunks[kind] = frame(_bookmark_line(kind, revision))
            self._write(watcher, chunk, 0)

    def _write(self, watcher: Watcher, chunk: bytes, count: int) -> None:
        if watcher.sink.is_closing():
            self.remove(watcher)
            watcher.finish(None)
            return
        if watcher.sink.get_write_buffer_size() > self.backlog_limit:
            # Still holding more than the limit since the last write: too slow. Nothing
            # more is queued, so its 410 comes right after what it already has.
            self._drop(watcher, "the watcher is too slow: its backlog is over the limit")
            return
        watcher.sink.write(chunk)
        watcher.sent += count

    def _drop(self, watcher: Watcher, why: str) -> None:
        self.remove(watcher)
        self.expired += 1
        watcher.finish(errors.gone(f"too old resource version: {why}"))

    def close_all(self) -> None:
        for members in [*self._groups.values(), self._pending]:
            for watcher in members:
                watcher.finish(None)
        self._groups.clear()
        self._by_kind.clear()
        self._by_name.clear()
        self._pending.clear()
        self._count = 0


def pinned_name(wf: WatchFilter) -> str | None:
    """The one name a filter's ``metadata.name=<name>`` field selector allows, if any."""
    for requirement in wf.fields:
        if requirement.field == "metadata.name" and requirement.op == "=":
            return requirement.value
    return None


def _discard(index: dict[Any, dict[GroupKey, None]], slot: Any, key: GroupKey) -> None:
    groups = index.get(slot)
    if groups is not None:
        groups.pop(key, None)
        if not groups:
            del index[slot]


def _bookmark_line(kind: Kind, revision: int) -> bytes:
    bookmark = {
        "type": "BOOKMARK",
        "object": {
            "kind": kind.kind,
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(revision)},
        },
    }
    return json.dumps(bookmark, separators=(",", ":")).encode() + b"\n"
