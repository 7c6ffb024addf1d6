"""A watcher's replay: the cache's events after its revision, written as it reads them.

A watch from ``resourceVersion=N`` (or one that has just been sent the current state)
first gets every buffered event after ``N`` that its filter selects. Handed to its
transport at once, that is the whole history of a kind for each such watcher: 300
watches from an old revision over 3,000 pods of 4 KiB took a master from 0.8 to 7.8 GB
(issue 19, finding 3). So the replay is streamed and bounded, as kube-apiserver's watch
cache bounds a watcher's buffer:

- at most ``REPLAY_WRITE`` bytes are built and handed over at a time, and the next
  write waits until the transport has drained (aiohttp's flow control): a replay holds
  about one write of memory per watcher, however old its revision or slow its reader;
- at most ``budget`` bytes in all (the fan-out's backlog bound, 4 MiB, the bound of a
  live watcher): a watcher with more to catch up on is told 410 Expired and relists,
  which costs less than its replay;
- a watcher the ring leaves behind during its replay is told 410 too.

Once it has had every buffered event, the watcher joins the fan-out (``WatchCache.watch``)
at the revision it has reached, with nothing awaited in between.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator

from podnet.api.cachedobjects import CachedObject, WatchFilter
from podnet.api.watchcache import WatchCache
from podnet.model import errors

REPLAY_WRITE = 64 * 1024  # bytes built and written at a time (aiohttp's high-water mark)
Write = Callable[[bytes], Awaitable[None]]


class OverBudget(errors.ApiError):
    """410 Expired: more to replay than a watcher may be sent before it is live."""

    def __init__(self, budget: int) -> None:
        super().__init__(
            f"too old resource version: more than {budget} bytes of changes to replay; list again",
            410,
            "Expired",
        )


async def replay(cache: WatchCache, wf: WatchFilter, after: int, write: Write, budget: int) -> int:
    """Write the buffered events after revision ``after`` that ``wf`` selects, in
    bounded writes; return the revision the watcher has then had everything up to.

    Raises ``OverBudget`` (410) past ``budget`` bytes, and 410 ``Expired`` when the
    ring drops events the watcher has not had yet.
    """
    position, revision, replayed = cache.position_after(after), after, 0
    while True:
        offset, events = cache.ring()
        if position < offset:
            raise errors.gone("too old resource version: the watcher fell behind the watch cache")
        lines, size, index = [], 0, position - offset
        while index < len(events) and size < REPLAY_WRITE:
            event = events[index]
            index, revision = index + 1, event.revision
            seen = wf.view(event)
            if seen:
                line = event.line(seen)
                lines.append(line)
                size += len(line)
        position = offset + index
        if not lines:  # every buffered event is had: the caller joins the fan-out now
            return revision
        replayed += size
        if replayed > budget:
            raise OverBudget(budget)
        await write(b"".join(lines))


def added_chunks(objects: Iterable[CachedObject]) -> Iterator[bytes]:
    """The current objects as ADDED events, joined into writes of about ``REPLAY_WRITE``
    bytes (a watch from no revision: its initial state)."""
    part: list[bytes] = []
    size = 0
    for obj in objects:
        line = b'{"type":"ADDED","object":%s}\n' % obj.wire
        part.append(line)
        size += len(line)
        if size >= REPLAY_WRITE:
            yield b"".join(part)
            part, size = [], 0
    if part:
        yield b"".join(part)
