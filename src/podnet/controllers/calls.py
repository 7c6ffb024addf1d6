"""The object API the controllers use, and the calls they make with it.

``ControllerApi`` is ``ObjectApi`` plus the two writes only the master's controllers make
(a status update of a Node's conditions, the finalization of a Terminating Namespace) and
one read, the namespaces holding objects of a kind (the orphan sweep's, which must not
decode every pod of the cluster to learn a few hundred names).

Every call goes through ``call``: a timeout per attempt, transient failures (no answer,
5xx, 429) retried with jittered backoff until a deadline, anything else raised at once.
``get_or_none``, ``create_unless_exists`` and ``guaranteed_update`` are the read-modify-
write patterns the controllers repeat.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol, TypeVar

from podnet.client.backoff import Backoff, with_retry
from podnet.client.errors import has_reason
from podnet.client.objectapi import ObjectApi
from podnet.client.watch import ResourceVersion
from podnet.model.kinds import Kind

Obj = dict[str, Any]
T = TypeVar("T")

CALL_TIMEOUT = 10.0  # one API call
RETRY_DEADLINE = 60.0  # retries of one call, in all
CALL_BACKOFF = Backoff(0.05, 5.0)
MAX_UPDATE_ATTEMPTS = 16


class ControllerApi(ObjectApi, Protocol):
    """``ObjectApi`` and the controllers' extras; in-process or over HTTPS."""

    async def update_status(self, kind: Kind, obj: Obj) -> Obj:
        """Replace the object's status only; ``metadata.resourceVersion`` is the precondition."""
        ...

    async def finalize_namespace(self, name: str) -> None:
        """Remove a Terminating Namespace for good (its contents are gone)."""
        ...

    async def namespaces_in_use(self, kind: Kind) -> set[str]:
        """The namespaces that hold at least one object of the namespaced ``kind``."""
        ...


async def call(request: Callable[[], Awaitable[T]], what: str, timeout: float = CALL_TIMEOUT) -> T:
    """Run ``request`` with a timeout; retry transient failures until the deadline."""

    return await with_retry(request, what, RETRY_DEADLINE, CALL_BACKOFF, timeout=timeout)


async def get_or_none(
    api: ControllerApi, kind: Kind, namespace: str | None, name: str
) -> Obj | None:
    """A fresh read of one object, or None when it does not exist."""
    try:
        return await call(lambda: api.get(kind, namespace, name), f"get {kind.singular} {name}")
    except Exception as exc:
        if has_reason(exc, "NotFound"):
            return None
        raise


async def create_unless_exists(
    api: ControllerApi, kind: Kind, obj: Obj, namespace: str | None = None
) -> Obj | None:
    """Create ``obj``; the stored object, or None when the name is taken already."""
    name = obj["metadata"]["name"]
    try:
        return await call(
            lambda: api.create(kind, obj, namespace), f"create {kind.singular} {name}"
        )
    except Exception as exc:
        if has_reason(exc, "AlreadyExists"):
            return None
        raise


async def delete_if_present(
    api: ControllerApi,
    kind: Kind,
    namespace: str | None,
    name: str,
    resource_version: ResourceVersion | None = None,
) -> bool:
    """Delete one object (pinned to ``resource_version`` if given); False if already gone."""
    what = f"delete {kind.singular} {f'{namespace}/' if namespace else ''}{name}"
    try:
        await call(
            lambda: api.delete(kind, namespace, name, resource_version=resource_version), what
        )
    except Exception as exc:
        if has_reason(exc, "NotFound"):
            return False
        raise
    return True


async def guaranteed_update(
    api: ControllerApi,
    kind: Kind,
    namespace: str | None,
    name: str,
    mutate: Callable[[Obj], Obj | None],
    status: bool = False,
) -> Obj | None:
    """Read, mutate, write with the read's resourceVersion; again after a conflict.

    ``mutate`` gets a copy and returns None to write nothing. ``status`` writes through
    the status subresource (a Node's conditions). NotFound is raised to the caller.
    """
    for attempt in range(MAX_UPDATE_ATTEMPTS):
        current = await call(lambda: api.get(kind, namespace, name), f"get {kind.singular} {name}")
        new = mutate(copy.deepcopy(current))
        if new is None:
            return None
        write = partial(api.update_status if status else api.update, kind, new)
        try:
            return await call(write, f"update {kind.singular} {name}")
        except Exception as exc:
            if not has_reason(exc, "Conflict") or attempt + 1 == MAX_UPDATE_ATTEMPTS:
                raise
    raise AssertionError("unreachable")
