"""Events cannot fill the master: a size limit, a rate and count quota, and a TTL.

- Size: an Event is at most ``max_bytes`` of JSON and its message at most
  ``max_message`` bytes, for every writer (413 and 422). kube-apiserver would take
  1.5 MB; a node once wrote 200 of those and the master grew by 540 MB.
- Quota, for every identity but the admin: a token bucket per user (``rate`` events per
  second, ``burst`` at once) and at most ``max_stored`` stored events per node, counted
  by ``source.host`` (which admission fills in with the node's name, and which a node
  cannot set to another name). Over quota: 429 with ``Retry-After``.
- TTL: an event is deleted ``ttl`` seconds after its last write (Kubernetes keeps events
  one hour). The master's sweeper notes the etcd revision at every sweep; an event whose
  resourceVersion is at or below a revision noted ``ttl`` ago is expired. Only writes
  count, so a master restart can only make an event live longer, never shorter.

The knobs come from the environment (``PODNET_EVENT_*``), so tests can shrink them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from podnet.api.identity import User
from podnet.api.registry import Obj, Registry
from podnet.model import errors
from podnet.model.kinds import EVENT
from podnet.store.base import StoreUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EventLimits:
    """The limits on events; ``from_env`` reads ``PODNET_EVENT_<NAME>`` overrides."""

    max_bytes: int = 8 * 1024
    max_message: int = 4 * 1024
    rate: float = 10.0
    burst: int = 50
    max_stored: int = 500
    ttl: float = 3600.0
    sweep: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> EventLimits:
        """Defaults, overridden by e.g. ``PODNET_EVENT_TTL=2`` (bad values are ignored)."""
        values: dict[str, Any] = {}
        for name, default in cls().__dict__.items():
            raw = env.get(f"PODNET_EVENT_{name.upper()}")
            if raw is None:
                continue
            try:
                value = type(default)(raw)
            except ValueError:
                log.warning("ignoring PODNET_EVENT_%s=%r: not a number", name.upper(), raw)
                continue
            if value > 0:
                values[name] = value
        return cls(**values)


class TooManyRequests(errors.ApiError):
    """429, with the seconds to wait (the ``Retry-After`` header and Status details)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, 429, "TooManyRequests")
        self.retry_after = retry_after

    def status(self) -> dict[str, Any]:
        body = super().status()
        body.setdefault("details", {})["retryAfterSeconds"] = self.retry_after
        return body


@dataclass
class _Bucket:
    tokens: float
    stamp: float


@dataclass
class EventQuota:
    """Per-identity token buckets and per-node stored counts (one master's view)."""

    limits: EventLimits
    clock: Callable[[], float] = time.monotonic
    stored: dict[str, int] = field(default_factory=dict)  # per node, at the last sweep
    added: dict[str, int] = field(default_factory=dict)  # per node, since then
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def take(self, user: str, node: str | None) -> None:
        """Account one event by ``user`` (reported as ``node``); 429 when over quota."""
        if node is not None:
            count = self.stored.get(node, 0) + self.added.get(node, 0)
            if count >= self.limits.max_stored:
                raise TooManyRequests(
                    f"node {node} already has {count} stored events, the limit is "
                    f"{self.limits.max_stored}; events expire after {self.limits.ttl:g}s",
                    max(1, math.ceil(self.limits.sweep)),
                )
        self._spend(user)
        if node is not None:
            self.added[node] = self.added.get(node, 0) + 1

    def _spend(self, user: str) -> None:
        now, limits = self.clock(), self.limits
        bucket = self._buckets.get(user) or _Bucket(float(limits.burst), now)
        bucket.tokens = min(float(limits.burst), bucket.tokens + (now - bucket.stamp) * limits.rate)
        bucket.stamp = now
        self._buckets[user] = bucket
        if bucket.tokens < 1.0:
            wait = max(1, math.ceil((1.0 - bucket.tokens) / limits.rate))
            raise TooManyRequests(
                f"{user} is writing events faster than {limits.rate:g}/s "
                f"(burst {limits.burst}); retry after {wait}s",
                wait,
            )
        bucket.tokens -= 1.0

    def recount(self, events: list[Obj]) -> None:
        """Replace the stored counts with a fresh listing's."""
        counts: dict[str, int] = {}
        for event in events:
            host = _source_host(event)
            if host:
                counts[host] = counts.get(host, 0) + 1
        self.stored, self.added = counts, {}


def _source_host(event: Mapping[str, Any]) -> str | None:
    source = event.get("source")
    host = source.get("host") if isinstance(source, Mapping) else None
    return host if isinstance(host, str) and host else None


def check_size(event: Mapping[str, Any], limits: EventLimits) -> None:
    """413 for an event larger than the limit, 422 for a message longer than its own."""
    size = len(json.dumps(event, separators=(",", ":")).encode())
    if size > limits.max_bytes:
        raise errors.too_large(
            f"the event is {size} bytes; an event may be at most {limits.max_bytes} bytes"
        )
    message = event.get("message")
    if isinstance(message, str) and len(message.encode()) > limits.max_message:
        name = str((event.get("metadata") or {}).get("name") or "")
        cause = errors.FieldError(
            "message", f"must be at most {limits.max_message} bytes", "FieldValueTooLong"
        )
        raise errors.invalid(EVENT.kind, name, [cause])


def stamp_reporter(event: MutableMapping[str, Any], node: str) -> None:
    """Make ``source.host`` name the node that writes the event (422 if it cannot)."""
    source = event.setdefault("source", {})
    if not isinstance(source, MutableMapping):
        name = str((event.get("metadata") or {}).get("name") or "")
        cause = errors.FieldError("source", "must be an object")
        raise errors.invalid(EVENT.kind, name, [cause])
    source["host"] = node


class EventSweeper:
    """Deletes expired events and recounts the quota, every ``limits.sweep`` seconds."""

    def __init__(
        self, registry: Registry, quota: EventQuota, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.registry = registry
        self.quota = quota
        self.clock = clock
        self.limits = quota.limits
        self._marks: deque[tuple[float, int]] = deque()  # (monotonic time, etcd revision)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-sweeper")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.sweep_once()
            except (StoreUnavailable, errors.ApiError) as exc:
                log.warning("event sweep skipped: %s", exc)
            except Exception:
                log.exception("event sweep failed")
            await asyncio.sleep(self.limits.sweep)

    def _expiry_revision(self, now: float) -> int:
        """The newest revision noted at least ``ttl`` ago (0: none yet)."""
        horizon, newest = now - self.limits.ttl, None
        while self._marks and self._marks[0][0] <= horizon:
            newest = self._marks.popleft()
        if newest is None:
            return 0
        self._marks.appendleft(newest)  # still the bound until a newer mark ages
        return newest[1]

    async def sweep_once(self) -> int:
        """One pass: note the revision, delete what expired, recount. Returns deletions."""
        now = self.clock()
        self._marks.append((now, await self.registry.store.revision()))
        expiry = self._expiry_revision(now)
        events, _ = await self.registry.list(EVENT)
        kept, deleted = [], 0
        for event in events:
            meta = event["metadata"]
            if expiry and int(meta["resourceVersion"]) <= expiry:
                deleted += await self._delete(meta)
            else:
                kept.append(event)
        self.quota.recount(kept)
        if deleted:
            log.info("deleted %d expired events", deleted)
        return deleted

    async def _delete(self, meta: Mapping[str, Any]) -> int:
        try:
            await self.registry.delete(
                EVENT, meta.get("namespace"), meta["name"], meta["resourceVersion"]
            )
        except errors.ApiError as exc:
            if exc.code not in (404, 409):  # gone or rewritten meanwhile: not expired
                raise
            return 0
        return 1


def admit_event(
    quota: EventQuota, user: User, verb: str, new: MutableMapping[str, Any] | None
) -> None:
    """Size for everyone; reporter stamp and quota for every identity but the admin."""
    if new is None:
        return
    check_size(new, quota.limits)
    if user.is_admin:
        return
    node = user.node_name
    if node is not None:
        stamp_reporter(new, node)
    if verb == "create":
        quota.take(user.name, node)
