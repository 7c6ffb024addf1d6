"""Store events as API events: what the watch cache buffers and what a watch from a
revision older than its ring reads straight from etcd."""

from __future__ import annotations

from collections.abc import AsyncIterator

from podnet.api import storedform
from podnet.api.cachedobjects import CachedEvent
from podnet.api.registry import Obj, Registry
from podnet.model import errors
from podnet.model.kinds import Kind
from podnet.store.base import Compacted, WatchEvent


def to_cached(
    registry: Registry,
    event: WatchEvent,
    prev_probe: Obj | None = None,
    decoded: Obj | None = None,
) -> CachedEvent | None:
    """A store event as an API event, or None for non-object keys.

    ``prev_probe`` is the probe of the object before the change when the caller knows
    it (the cache does); otherwise it is made from the event's previous value.
    ``decoded`` is the new value already decoded by the caller (not decoded twice).
    """
    parsed = registry.parse_key(event.key)
    if parsed is None:
        return None
    kind, namespace, name = parsed
    if prev_probe is None and event.prev_value:
        prev_probe = storedform.probe(kind, storedform.decode(event.prev_value, 0))
    if event.type == "DELETE":
        value = event.prev_value or storedform.encode(
            {"metadata": {"name": name, **({"namespace": namespace} if namespace else {})}}
        )
        if prev_probe is None:
            prev_probe = storedform.probe(kind, storedform.decode(value, 0))
        return CachedEvent(
            event.revision, kind, namespace, name, "DELETED", value, prev_probe, prev_probe
        )
    obj = decoded if decoded is not None else storedform.decode(event.value, 0)
    probe = storedform.probe(kind, obj)
    change = "ADDED" if event.create_revision == event.revision else "MODIFIED"
    return CachedEvent(
        event.revision, kind, namespace, name, change, event.value, probe, prev_probe
    )


async def direct_events(
    registry: Registry, after_revision: int, kind: Kind | None = None, namespace: str | None = None
) -> AsyncIterator[CachedEvent | int]:
    """Events straight from the store, for a revision older than the cache's window: of
    ``kind`` (in ``namespace``) only when given, so that etcd replays that kind's history
    alone, not every Lease renewal of the cluster since ``after_revision``."""
    prefix = registry.kind_prefix(kind, namespace) if kind is not None else registry.prefix
    try:
        async for event in registry.store.watch(prefix, after_revision):
            cached = to_cached(registry, event)
            if cached is not None:
                yield cached
    except Compacted as exc:
        raise errors.gone(f"too old resource version: {after_revision} ({exc})") from exc
