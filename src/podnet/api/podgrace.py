"""A DELETE's and a PATCH's preconditions, and the registry's side of graceful Pod
deletion.

``check_delete`` tests the resourceVersion and uid preconditions on the very read the
delete is conditioned on (the uid check in the handler reads earlier, so a Pod
re-created under the same name in between could otherwise be deleted). For a Pod,
``graceful_pod_deletion`` applies ``podnet.api.poddeletion``'s plan: it stores the
terminating Pod instead of removing it, or lets the removal go on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol

from podnet.api.objects import STALE
from podnet.api.params import DeleteOptions
from podnet.api.poddeletion import plan_pod_deletion
from podnet.model import errors
from podnet.model.kinds import NODE, POD, Kind
from podnet.store.base import Condition, ModRevisionIs, Store

Obj = dict[str, Any]
MARK_RETRIES = 16

__all__ = ["DeleteOptions", "check_delete", "check_pins", "graceful_pod_deletion", "uid_mismatch"]


class _Writer(Protocol):
    store: Store

    def key(self, kind: Kind, namespace: str | None, name: str) -> str: ...

    async def get(self, kind: Kind, namespace: str | None, name: str) -> Obj: ...

    async def _store_claiming(
        self, kind: Kind, key: str, obj: Obj, old: Obj | None, condition: Condition
    ) -> Obj: ...


def uid_mismatch(uid: str, obj: Obj) -> str:
    """Kubernetes' words for a uid precondition that failed."""
    found = obj["metadata"].get("uid")
    return f"Precondition failed: UID in precondition: {uid}, UID in object meta: {found}"


def check_delete(
    kind: Kind, old: Obj, resource_version: str | None, options: DeleteOptions | None
) -> str:
    """The stored resourceVersion, once the preconditions hold (409 Conflict if not)."""
    current: str = old["metadata"]["resourceVersion"]
    name = old["metadata"].get("name", "")
    if resource_version is not None and str(resource_version) != current:
        raise errors.conflict(kind.plural, name, STALE)
    if (
        options is not None
        and options.uid is not None
        and old["metadata"].get("uid") != options.uid
    ):
        raise errors.conflict(kind.plural, name, uid_mismatch(options.uid, old))
    return current


def check_pins(kind: Kind, old: Obj, patched_meta: Obj) -> None:
    """A patch's ``metadata.resourceVersion`` and ``metadata.uid`` are preconditions (as
    in Kubernetes): 409 Conflict when the stored object has another."""
    name = old["metadata"].get("name", "")
    pinned = patched_meta.get("resourceVersion")
    if pinned is not None and str(pinned) != old["metadata"]["resourceVersion"]:
        raise errors.conflict(kind.plural, name, STALE)
    uid = patched_meta.get("uid")
    if uid is not None and uid != old["metadata"].get("uid"):
        raise errors.conflict(kind.plural, name, uid_mismatch(str(uid), old))


async def graceful_pod_deletion(
    registry: _Writer, kind: Kind, key: str, old: Obj, options: DeleteOptions | None
) -> Obj | None:
    """For a Pod that is not removed at once: the terminating Pod, stored (or as it is
    when a later DELETE asks for no shorter grace). None: remove the object now."""
    if kind is not POD:
        return None
    grace = options.grace_period_seconds if options is not None else None
    for _ in range(MARK_RETRIES):
        node = str((old.get("spec") or {}).get("nodeName") or "")
        exists = bool(node) and await registry.store.get(registry.key(NODE, None, node)) is not None
        plan = plan_pod_deletion(old, grace, exists, datetime.now(UTC))
        if plan.remove:
            return None
        if plan.marked is None:
            return old
        condition = ModRevisionIs(key, int(old["metadata"]["resourceVersion"]))
        try:
            return await registry._store_claiming(kind, key, plan.marked, old, condition)
        except errors.ApiError as exc:
            if exc.reason != "Conflict" or (options and options.resource_version):
                raise  # (a pinned resourceVersion is stale now)
        meta = old["metadata"]
        old = await registry.get(kind, meta.get("namespace"), meta["name"])
        check_delete(kind, old, None, options)
    raise errors.conflict(kind.plural, old["metadata"]["name"], "too many concurrent writers")
