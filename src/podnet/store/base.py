"""The storage contract: a revisioned key-value store with transactions and watch.

It is etcd v3's model, cut down to what podnet needs. ``EtcdStore`` implements it on a real
etcd; ``MemoryStore`` is its in-memory twin for fast unit tests. Both keep the same
semantics: one global revision that every write bumps, compare-and-swap transactions,
watches that resume from a revision, and compaction that makes old revisions unwatchable.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol


class StoreError(Exception):
    """Base of every store failure."""


class StoreUnavailable(StoreError):
    """The store did not answer in time or the connection failed (transient)."""


class Compacted(StoreError):
    """The requested revision has been compacted away; the caller must relist."""

    def __init__(self, revision: int, compact_revision: int) -> None:
        super().__init__(f"revision {revision} has been compacted (oldest is {compact_revision})")
        self.revision = revision
        self.compact_revision = compact_revision


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Absent:
    """Condition: the key does not exist."""

    key: str


@dataclass(frozen=True, slots=True)
class ModRevisionIs:
    """Condition: the key exists and was last written at exactly this revision."""

    key: str
    revision: int


Condition = Absent | ModRevisionIs


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


Operation = Put | Delete


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change. For DELETE, ``value`` is the value the key held before (if known).

    ``prev_value`` is the value before this change (None for a creation, or unknown).
    """

    type: Literal["PUT", "DELETE"]
    key: str
    value: bytes
    revision: int
    create_revision: int = 0
    prev_value: bytes | None = None


class Store(Protocol):
    """What the registry and controllers need from storage."""

    async def get(self, key: str) -> KeyValue | None:
        """The key's current value, or None."""

    async def list(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` in key order, and the revision the read saw."""

    async def commit(
        self, conditions: Sequence[Condition], operations: Sequence[Operation]
    ) -> int | None:
        """Apply ``operations`` atomically if every condition holds.

        Returns the new revision, or None when a condition failed (nothing written).
        """

    def watch(self, prefix: str, after_revision: int) -> AsyncIterator[WatchEvent]:
        """Every change under ``prefix`` with revision > ``after_revision``, then live.

        Raises ``Compacted`` when ``after_revision`` is older than the compaction point.
        """

    async def revision(self) -> int:
        """The store's current revision."""

    async def check_revision(self, revision: int) -> None:
        """Raise ``Compacted`` if changes after ``revision`` can no longer be replayed."""

    async def compact(self, revision: int) -> None:
        """Forget history at and before ``revision``."""

    async def close(self) -> None:
        """Release connections."""
