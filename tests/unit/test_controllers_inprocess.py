"""The in-process object API: the client's errors, preconditions, status writes,
namespace finalization, and watches from the watch cache (or 410 when too old)."""

from __future__ import annotations

from typing import Any

import pytest

from podnet.api.registry import Registry
from podnet.client.errors import AlreadyExists, Conflict, Expired, NotFound
from podnet.client.watch import ADDED, DELETED, MODIFIED
from podnet.controllers.inprocess import InProcessApi
from podnet.model.kinds import NAMESPACE, NODE

Obj = dict[str, Any]


def node(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


async def test_errors_are_the_clients(api: InProcessApi) -> None:
    created = await api.create(NODE, node("n1"))
    with pytest.raises(AlreadyExists):
        await api.create(NODE, node("n1"))
    with pytest.raises(NotFound):
        await api.get(NODE, None, "nope")
    stale = {**created, "metadata": {**created["metadata"], "resourceVersion": "1"}}
    with pytest.raises(Conflict):
        await api.update(NODE, stale)
    with pytest.raises(Conflict):
        await api.delete(NODE, None, "n1", resource_version=1)
    await api.delete(NODE, None, "n1", resource_version=int(created["metadata"]["resourceVersion"]))
    with pytest.raises(NotFound):
        await api.delete(NODE, None, "n1")


async def test_update_status_writes_the_status_only(api: InProcessApi) -> None:
    created = await api.create(NODE, node("n1"))
    body = {
        **created,
        "metadata": {**created["metadata"], "labels": {"ignored": "yes"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    updated = await api.update_status(NODE, body)
    assert updated["status"]["conditions"][0]["type"] == "Ready"
    assert "labels" not in updated["metadata"]


async def test_finalize_removes_only_a_terminating_namespace(api: InProcessApi) -> None:
    await api.create(NAMESPACE, {"metadata": {"name": "x"}})
    with pytest.raises(Conflict):
        await api.finalize_namespace("x")
    await api.delete(NAMESPACE, None, "x")  # only marks it Terminating
    assert (await api.get(NAMESPACE, None, "x"))["metadata"]["deletionTimestamp"]
    await api.finalize_namespace("x")
    with pytest.raises(NotFound):
        await api.get(NAMESPACE, None, "x")


async def test_list_then_watch_sees_every_change_of_the_kind(
    registry: Registry, api: InProcessApi
) -> None:
    await api.create(NODE, node("before"))
    listing = await api.list(NODE)
    assert [n["metadata"]["name"] for n in listing.items] == ["before"]
    stream = api.watch(NODE, listing.resource_version)
    await api.create(NAMESPACE, {"metadata": {"name": "other-kind"}})
    created = await api.create(NODE, node("after"))
    await api.update(NODE, {**created, "metadata": {**created["metadata"], "labels": {"a": "b"}}})
    await api.delete(NODE, None, "before")
    seen = [await anext(stream) for _ in range(3)]
    assert [(e.type, e.object["metadata"]["name"]) for e in seen] == [
        (ADDED, "after"),
        (MODIFIED, "after"),
        (DELETED, "before"),
    ]
    seen[0].object["metadata"]["name"] = "changed by the consumer"  # a copy of its own
    again = api.watch(NODE, listing.resource_version)
    assert (await anext(again)).object["metadata"]["name"] == "after"
    await stream.aclose()  # type: ignore[attr-defined]
    await again.aclose()  # type: ignore[attr-defined]


async def test_a_watch_from_a_compacted_revision_is_expired(
    registry: Registry, api: InProcessApi
) -> None:
    first = await api.create(NODE, node("n1"))
    await api.create(NODE, node("n2"))
    await api.create(NODE, node("n3"))
    revision = await registry.store.revision()  # n2's change, after ``first``, is gone
    await registry.store.compact(revision)
    api.cache.forget_before(revision)  # as the master does after a compaction
    with pytest.raises(Expired):
        await anext(api.watch(NODE, int(first["metadata"]["resourceVersion"])))
