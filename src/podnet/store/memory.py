"""An in-memory twin of ``EtcdStore`` for unit tests: same revisions, same semantics."""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import AsyncIterator, Sequence

from podnet.store.base import (
    Absent,
    Compacted,
    Condition,
    Delete,
    KeyValue,
    ModRevisionIs,
    Operation,
    Put,
    WatchEvent,
)


class MemoryStore:
    """A single-process revisioned key-value store with etcd's semantics."""

    def __init__(self) -> None:
        self._data: dict[str, KeyValue] = {}
        self._keys: list[str] = []  # sorted, for prefix scans
        self._history: list[WatchEvent] = []
        self._revision = 1  # etcd starts at 1 on an empty store
        self._compacted = 0
        self._changed = asyncio.Condition()

    async def get(self, key: str) -> KeyValue | None:
        return self._data.get(key)

    async def list(self, prefix: str) -> tuple[list[KeyValue], int]:
        start = bisect.bisect_left(self._keys, prefix)
        out = []
        for key in self._keys[start:]:
            if not key.startswith(prefix):
                break
            out.append(self._data[key])
        return out, self._revision

    def _holds(self, cond: Condition) -> bool:
        current = self._data.get(cond.key)
        if isinstance(cond, Absent):
            return current is None
        assert isinstance(cond, ModRevisionIs)
        return current is not None and current.mod_revision == cond.revision

    async def commit(
        self, conditions: Sequence[Condition], operations: Sequence[Operation]
    ) -> int | None:
        if not all(self._holds(c) for c in conditions):
            return None
        if not operations:
            return self._revision
        self._revision += 1
        rev = self._revision
        for op in operations:
            if isinstance(op, Put):
                old = self._data.get(op.key)
                created = old.create_revision if old else rev
                if old is None:
                    bisect.insort(self._keys, op.key)
                self._data[op.key] = KeyValue(op.key, op.value, created, rev)
                prev = old.value if old else None
                self._history.append(WatchEvent("PUT", op.key, op.value, rev, created, prev))
            elif isinstance(op, Delete) and op.key in self._data:
                old = self._data.pop(op.key)
                self._keys.remove(op.key)
                self._history.append(
                    WatchEvent("DELETE", op.key, old.value, rev, old.create_revision, old.value)
                )
        async with self._changed:
            self._changed.notify_all()
        return rev

    async def watch(self, prefix: str, after_revision: int) -> AsyncIterator[WatchEvent]:
        await self.check_revision(after_revision)
        position = 0
        while True:
            while position < len(self._history):
                event = self._history[position]
                position += 1
                if event.revision > after_revision and event.key.startswith(prefix):
                    yield event
            async with self._changed:
                if position >= len(self._history):
                    await self._changed.wait()

    async def revision(self) -> int:
        return self._revision

    async def check_revision(self, revision: int) -> None:
        if revision + 1 < self._compacted:
            raise Compacted(revision, self._compacted)

    async def compact(self, revision: int) -> None:
        self._compacted = max(self._compacted, revision)

    async def close(self) -> None:
        return None
