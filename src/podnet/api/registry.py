"""Object storage with Kubernetes semantics on top of the revisioned ``Store``.

The registry turns keys and bytes into API objects: it sets uid, creationTimestamp,
generation and resourceVersion (the etcd revision), enforces optimistic concurrency,
keeps unique-value claims (HostSubnet subnets, Service cluster IPs and node ports) in the
same transaction as the object, fills allocated values (``podnet.api.serviceallocator``),
and validates every write. The API server and the master's controllers both use it, so a
controller's write obeys exactly the rules a user's does.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from podnet.api import storedform
from podnet.api.claims import Claim, claim_error, claims, taken_claims
from podnet.api.keyspace import DEFAULT_PREFIX, KeySpace
from podnet.api.objects import (
    STALE,
    matches,
    merge_for_update,
    merge_patch,
    next_generation,
    now_rfc3339,
    same_content,
)
from podnet.api.podgrace import DeleteOptions, check_delete, check_pins, graceful_pod_deletion
from podnet.api.routehosts import DEFAULT_ROUTE_SUFFIX, Allocator, RouteHosts
from podnet.api.servicealloc import ServiceRanges
from podnet.api.serviceallocator import ServiceAllocator
from podnet.model import errors
from podnet.model.kinds import NAMESPACE, ROUTE, SERVICE, Kind
from podnet.model.selectors import FieldRequirement, LabelSelector
from podnet.store.base import (
    Absent,
    Condition,
    Delete,
    KeyValue,
    ModRevisionIs,
    Operation,
    Put,
    Store,
    StoreUnavailable,
)

Obj = dict[str, Any]
# Called with (new object or None, old object or None) before a write; raises ApiError.
# It may be a coroutine function (admission that reads the registry).
Admit = Callable[[Obj | None, Obj | None], Awaitable[None] | None]
Validate = Callable[[Kind, Obj, Obj | None], Obj]

MAX_UPDATE_RETRIES = 16
# Below etcd's default request limit (1.5 MiB) with room for the key and the transaction.
MAX_OBJECT_BYTES = 1024 * 1024


def _admit_all(new: Obj | None, old: Obj | None) -> None:
    return None


async def _admitted(admit: Admit, new: Obj | None, old: Obj | None) -> None:
    result = admit(new, old)
    if result is not None:
        await result


class Registry(KeySpace):
    """Typed CRUD on API objects, stored as JSON under one key prefix (``KeySpace``)."""

    def __init__(
        self,
        store: Store,
        validate: Validate | None = None,
        prefix: str = DEFAULT_PREFIX,
        services: ServiceRanges | None = None,
        route_suffix: str = DEFAULT_ROUTE_SUFFIX,
    ) -> None:
        if validate is None:
            from podnet.model.validation import validate as default_validate

            validate = default_validate
        super().__init__(prefix)
        self.store = store
        self._validate = validate
        # Kinds whose objects get values chosen from a shared range before they are stored.
        self._allocators: dict[tuple[str, str], Allocator] = {
            (SERVICE.group, SERVICE.plural): ServiceAllocator(self, services or ServiceRanges()),
            (ROUTE.group, ROUTE.plural): RouteHosts(route_suffix),
        }

    # ---- decoding ---------------------------------------------------------------------

    @staticmethod
    def decode(kv: KeyValue) -> Obj:
        return storedform.decode(kv.value, kv.mod_revision)

    decode_bytes = staticmethod(storedform.decode)
    encode = staticmethod(storedform.encode)

    # ---- reads ------------------------------------------------------------------------

    async def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        return self.decode(await self.get_stored(kind, namespace, name))

    async def get_stored(self, kind: Kind, namespace: str | None, name: str) -> KeyValue:
        """The stored form of one object (see ``podnet.api.storedform``); 404 if absent."""
        kv = await self.store.get(self.key(kind, namespace, name))
        if kv is None:
            raise errors.not_found(kind.plural, name)
        return kv

    async def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        labels: LabelSelector | None = None,
        fields: Sequence[FieldRequirement] = (),
    ) -> tuple[list[Obj], int]:
        """Objects of ``kind`` that match the selectors, and the revision of the read."""
        kvs, revision = await self.store.list(self.kind_prefix(kind, namespace))
        items = []
        for kv in kvs:
            obj = self.decode(kv)
            if matches(obj, labels, fields):
                items.append(obj)
        return items, revision

    # ---- writes -----------------------------------------------------------------------

    async def create(
        self, kind: Kind, obj: Obj, namespace: str | None = None, admit: Admit = _admit_all
    ) -> Obj:
        """Store a new object; 409 AlreadyExists if the name is taken."""
        obj = self._prepare_create(kind, obj, namespace)
        await _admitted(admit, obj, None)
        name = obj["metadata"]["name"]
        key = self.key(kind, obj["metadata"].get("namespace"), name)
        if kind.namespaced:
            await self._require_namespace(obj["metadata"]["namespace"])
        return await self._store_claiming(kind, key, obj, None, Absent(key))

    def _prepare_create(self, kind: Kind, obj: Obj, namespace: str | None) -> Obj:
        if not isinstance(obj, dict):
            raise errors.bad_request("the request body must be a JSON object")
        # Copies of the two levels changed below: validation returns a new object, so
        # the caller's is never changed (no deep copy needed).
        meta = obj.get("metadata", {})
        if not isinstance(meta, dict):
            raise errors.invalid(
                kind.kind, "", [errors.FieldError("metadata", "must be an object")]
            )
        meta = dict(meta)
        obj = {**obj, "metadata": meta}
        if kind.namespaced:
            given = meta.get("namespace")
            if namespace and given and given != namespace:
                raise errors.bad_request(
                    f"the namespace of the object ({given}) does not match the namespace "
                    f"of the request ({namespace})"
                )
            meta["namespace"] = given or namespace or "default"
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and isinstance(meta.get("generateName"), str):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        obj = self._validate(kind, obj, None)
        meta = obj["metadata"]
        meta.pop("resourceVersion", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        return obj

    async def _require_namespace(self, namespace: str) -> None:
        kv = await self.store.get(self.key(NAMESPACE, None, namespace))
        if kv is None:
            raise errors.not_found("namespaces", namespace)
        if self.decode(kv)["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                f"unable to create new content in namespace {namespace} "
                "because it is being terminated"
            )

    def _claims(self, kind: Kind, obj: Obj | None) -> dict[str, Claim]:
        """Claim key -> claim, for every unique value ``obj`` holds."""
        return {self.claim_key(kind, c): c for c in claims(kind, obj)} if obj else {}

    async def _store_claiming(
        self, kind: Kind, key: str, obj: Obj, old: Obj | None, condition: Condition
    ) -> Obj:
        """Write ``obj`` (replacing ``old``), taking its new claims and releasing the ones
        it dropped, in one transaction. A value the kind's allocator chose is chosen again
        when another writer claimed it first; a value the caller asked for is refused."""
        allocator = self._allocators.get((kind.group, kind.plural))
        name = obj["metadata"]["name"]
        old_claims = self._claims(kind, old)
        for _ in range(MAX_UPDATE_RETRIES):
            stored, chosen = await allocator.allocate(obj, old) if allocator else (obj, set())
            new_claims = self._claims(kind, stored)
            added = {k: c for k, c in new_claims.items() if k not in old_claims}
            conditions: list[Condition] = [condition, *(Absent(k) for k in added)]
            ops: list[Operation] = [Put(key, self.encode(stored))]
            ops += [Put(k, key.encode()) for k in added]
            ops += [Delete(k) for k in old_claims if k not in new_claims]
            revision = await self._commit(conditions, ops)
            if revision is not None:
                stored["metadata"]["resourceVersion"] = str(revision)
                return stored
            if old is None and await self.store.get(key) is not None:
                raise errors.already_exists(kind.plural, name)
            taken = (await taken_claims(self.store, key, added)).values()
            for claim, holder in taken:
                if claim.path not in chosen:
                    raise claim_error(kind, name, claim, holder)
            if not taken:
                why = STALE if old is not None else "a unique value was claimed meanwhile"
                raise errors.conflict(kind.plural, name, why)
        raise errors.conflict(kind.plural, name, "too many concurrent writers, try again")

    async def _commit(
        self, conditions: Sequence[Condition], ops: Sequence[Operation]
    ) -> int | None:
        for op in ops:
            if isinstance(op, Put) and len(op.value) > MAX_OBJECT_BYTES:
                raise errors.too_large(
                    f"the object is {len(op.value)} bytes once stored; at most "
                    f"{MAX_OBJECT_BYTES} are accepted (etcd refuses requests over 1.5 MiB)"
                )
        try:
            return await self.store.commit(conditions, ops)
        except StoreUnavailable as exc:
            raise errors.unavailable(str(exc)) from exc

    async def update(
        self,
        kind: Kind,
        obj: Obj,
        namespace: str | None,
        name: str,
        subresource: str | None = None,
        admit: Admit = _admit_all,
        known: Obj | None = None,  # the current object if the caller has it (not read)
    ) -> Obj:
        """Replace an object. With ``metadata.resourceVersion`` set, a stale one is 409."""
        if not isinstance(obj, dict):
            raise errors.bad_request("the request body must be a JSON object")
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise errors.invalid(kind.kind, name, [errors.FieldError("metadata", "required")])
        if meta.get("name") not in (None, name):
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match "
                f"the name on the URL ({name})"
            )
        expected = meta.get("resourceVersion") or None
        old = known if known is not None else await self.get(kind, namespace, name)
        if expected is not None and str(expected) != old["metadata"]["resourceVersion"]:
            raise errors.conflict(kind.plural, name, STALE)
        new = merge_for_update(kind, old, obj, subresource)
        return await self._write_update(kind, old, new, admit)

    async def patch(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        patch: Any,
        subresource: str | None = None,
        admit: Admit = _admit_all,
    ) -> Obj:
        """Apply a patch, retrying on concurrent writes unless it pins a version.

        ``patch`` is a JSON merge patch, or a function from the stored object to the
        patched one (see ``podnet.api.patch``). A patched resourceVersion that differs
        from the stored one is a precondition that failed: 409.
        """
        if not callable(patch) and not isinstance(patch, dict):
            raise errors.bad_request("a merge patch must be a JSON object")
        apply = patch if callable(patch) else lambda old: merge_patch(old, patch)
        for _ in range(MAX_UPDATE_RETRIES):
            old = await self.get(kind, namespace, name)
            patched = apply(old)
            meta = patched.get("metadata") if isinstance(patched, dict) else None
            if not isinstance(meta, dict):
                raise errors.invalid(kind.kind, name, [errors.FieldError("metadata", "required")])
            check_pins(kind, old, meta)  # a patched resourceVersion or uid: preconditions
            new = merge_for_update(kind, old, patched, subresource)
            try:
                return await self._write_update(kind, old, new, admit)
            except errors.ApiError as exc:
                if exc.reason != "Conflict":
                    raise
        raise errors.conflict(kind.plural, name, "too many concurrent writers, try again")

    async def guaranteed_update(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        mutate: Callable[[Obj], Obj | None],
    ) -> Obj | None:
        """Read, mutate, write; retried on conflict. ``mutate`` returns None to skip."""
        for _ in range(MAX_UPDATE_RETRIES):
            old = await self.get(kind, namespace, name)
            new = mutate(copy.deepcopy(old))
            if new is None:
                return None
            try:
                return await self._write_update(kind, old, new, _admit_all)
            except errors.ApiError as exc:
                if exc.reason != "Conflict":
                    raise
        raise errors.conflict(kind.plural, name, "too many concurrent writers, try again")

    async def _write_update(self, kind: Kind, old: Obj, new: Obj, admit: Admit) -> Obj:
        new = self._validate(kind, new, old)
        meta = new["metadata"]
        meta["generation"] = next_generation(old, new)
        await _admitted(admit, new, old)
        key = self.key(kind, old["metadata"].get("namespace"), old["metadata"]["name"])
        if same_content(old, new):
            return old
        condition = ModRevisionIs(key, int(old["metadata"]["resourceVersion"]))
        return await self._store_claiming(kind, key, new, old, condition)

    async def delete(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        resource_version: str | None = None,
        admit: Admit = _admit_all,
        options: DeleteOptions | None = None,  # uid precondition; a Pod's grace: podgrace
    ) -> Obj:
        """Delete an object (with an optional resourceVersion precondition).

        A Namespace is not removed at once: like Kubernetes, it turns ``Terminating``
        and the master's namespace controller deletes its contents, then calls
        ``finalize_namespace``. This lets a client delete a namespace and then the
        objects in it, in any order.
        """
        if kind is NAMESPACE:
            return await self._terminate_namespace(name, resource_version, admit)
        return await self._delete_now(kind, namespace, name, resource_version, admit, options)

    async def finalize_namespace(self, name: str) -> Obj:
        """Remove a Terminating namespace for good (its contents are gone)."""
        return await self._delete_now(NAMESPACE, None, name, None, _admit_all)

    async def _terminate_namespace(
        self, name: str, resource_version: str | None, admit: Admit
    ) -> Obj:
        if name == "default":
            raise errors.forbidden('namespaces "default" is forbidden: it may not be deleted')
        old = await self.get(NAMESPACE, None, name)
        current = old["metadata"]["resourceVersion"]
        if resource_version is not None and str(resource_version) != current:
            raise errors.conflict(NAMESPACE.plural, name, STALE)
        await _admitted(admit, None, old)
        if old["metadata"].get("deletionTimestamp"):
            return old

        def terminating(obj: Obj) -> Obj:
            obj["metadata"]["deletionTimestamp"] = now_rfc3339()
            obj["status"] = {**(obj.get("status") or {}), "phase": "Terminating"}
            return obj

        updated = await self.guaranteed_update(NAMESPACE, None, name, terminating)
        return updated or old

    async def _delete_now(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        resource_version: str | None,
        admit: Admit,
        options: DeleteOptions | None = None,
    ) -> Obj:
        for _ in range(MAX_UPDATE_RETRIES):
            old = await self.get(kind, namespace, name)
            current = check_delete(kind, old, resource_version, options)
            await _admitted(admit, None, old)
            key = self.key(kind, namespace, name)
            if (kept := await graceful_pod_deletion(self, kind, key, old, options)) is not None:
                return kept
            ops: list[Operation] = [Delete(key)]
            ops.extend(Delete(k) for k in self._claims(kind, old))
            revision = await self._commit([ModRevisionIs(key, int(current))], ops)
            if revision is not None:
                old["metadata"]["resourceVersion"] = str(revision)
                return old
            if resource_version is not None:
                raise errors.conflict(kind.plural, name, STALE)
        raise errors.conflict(kind.plural, name, "too many concurrent writers, try again")
