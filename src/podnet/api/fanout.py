"""Encode each event once and write it to every watcher that wants it.

Watchers are grouped by filter. When new events reach the cache, ``Fanout.dispatch``
goes over the groups once: for each group and starting point, the JSON lines of the
events its filter selects are joined into one HTTP/1.1 chunk, built once, and that same
bytes object is written to the transport of every watcher in the group (no per-watcher
encode, no per-watcher ``StreamResponse.write`` and its awaits). Events that reach the
cache together go out in one write per watcher.

A watcher's backlog is its transport's write buffer. When it still holds more than
``backlog_limit`` bytes at the next write, the watcher is too slow: it is dropped with
410 Expired (its handler writes the ERROR event after the backlog and ends the
connection) and relists, while the others carry on; kube-apiserver does the same when a
watcher's channel is full. So one watcher holds at most the limit plus one write.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from podnet.api.cachedobjects import CachedEvent, WatchFilter
from podnet.model import errors

BACKLOG_LIMIT = 4 * 1024 * 1024  # bytes waiting in one watcher's transport
END = b"0\r\n\r\n"  # the last chunk of a chunked HTTP/1.1 body


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
    position: int  # absolute index of the next event this watcher has not been sent
    bookmarks: bool = False
    done: asyncio.Future[errors.ApiError | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    sent: int = 0  # events written

    def finish(self, outcome: errors.ApiError | None) -> None:
        if not self.done.done():
            self.done.set_result(outcome)


class Fanout:
    """The watchers served from the cache's ring, grouped by filter."""

    def __init__(self, backlog_limit: int = BACKLOG_LIMIT) -> None:
        self.backlog_limit = backlog_limit
        # group -> its watchers (a dict as an ordered set: removal is O(1))
        self._groups: dict[tuple[Any, ...], dict[Watcher, None]] = {}
        self._count = 0
        self.expired = 0

    def __len__(self) -> int:
        return self._count

    def add(self, watcher: Watcher) -> None:
        self._groups.setdefault(watcher.filter.group(), {})[watcher] = None
        self._count += 1

    def remove(self, watcher: Watcher) -> None:
        key = watcher.filter.group()
        members = self._groups.get(key)
        if members is not None and watcher in members:
            del members[watcher]
            self._count -= 1
            if not members:
                del self._groups[key]

    def dispatch(self, events: list[CachedEvent], offset: int) -> None:
        """Send every watcher the events it has not had (``events[0]`` is at ``offset``)."""
        end = offset + len(events)
        for members in list(self._groups.values()):
            wf = next(iter(members)).filter
            batches: dict[int, tuple[bytes, int]] = {}
            for watcher in list(members):
                if watcher.position >= end:
                    continue
                if watcher.position < offset:
                    self._drop(watcher, "the watcher fell behind the watch cache")
                    continue
                batch = batches.get(watcher.position)
                if batch is None:
                    lines = []
                    for event in events[watcher.position - offset :]:
                        seen = wf.view(event)
                        if seen is not None:
                            lines.append(event.line(seen))
                    batch = batches[watcher.position] = (frame(b"".join(lines)), len(lines))
                watcher.position = end
                if batch[1]:
                    self._write(watcher, batch[0], batch[1])

    def bookmark(self, revision: int, end: int) -> None:
        """A BOOKMARK at ``revision`` to every caught-up watcher that asked for them."""
        for members in list(self._groups.values()):
            kind = next(iter(members)).filter.kind
            chunk = frame(
                json.dumps(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": kind.kind,
                            "apiVersion": kind.api_version,
                            "metadata": {"resourceVersion": str(revision)},
                        },
                    },
                    separators=(",", ":"),
                ).encode()
                + b"\n"
            )
            for watcher in list(members):
                if watcher.bookmarks and watcher.position >= end:
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
        for members in list(self._groups.values()):
            for watcher in members:
                watcher.finish(None)
        self._groups.clear()
        self._count = 0
