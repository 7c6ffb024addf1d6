"""The three patch formats kube-apiserver accepts for a PATCH request, as pure functions.

- ``application/merge-patch+json``: RFC 7386 merge patch.
- ``application/strategic-merge-patch+json``: what kubectl sends for built-in kinds
  (``kubectl label``, ``annotate``, ``patch``, ``apply``). For maps it is a merge patch.
  Lists of objects that Kubernetes merges by key (containers by name, ports by port,
  conditions by type, ...: ``MERGE_KEYS``) are merged item by item, in the order of a
  ``$setElementOrder/<list>`` directive when one is given; other lists are replaced. The
  directives ``$patch: replace|delete`` are honoured; ``$retainKeys`` is ignored.
- ``application/json-patch+json``: RFC 6902 operations, applied with ``jsonpatch``. A
  ``copy`` can double the object each time, so copied bytes are counted and capped, as
  kube caps them (CVE-2019-1002100).

Each ``apply_*`` takes the stored object and returns the patched one, or raises an
``ApiError``: 400 for a malformed patch document, 422 when it cannot apply.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import jsonpatch
import jsonpointer

from podnet.api.decode import check_value
from podnet.api.objects import merge_patch
from podnet.model import errors

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = (MERGE, STRATEGIC, JSON_PATCH)
MAX_OPERATIONS = 10000  # kube-apiserver's limit on JSON patch operations
MAX_COPIED_BYTES = 3 * 1024 * 1024  # bytes all ``copy`` operations may duplicate together


def patcher(content_type: str, patch: Any) -> Callable[[Obj], Obj]:
    """A function from the stored object to the patched one; 400 if ``patch`` is malformed."""
    if content_type == JSON_PATCH:
        operations = _operations(patch)
        return lambda old: _checked(apply_json_patch(old, operations))
    if not isinstance(patch, dict):
        raise errors.bad_request("a merge patch must be a JSON object")
    if content_type == STRATEGIC:
        return lambda old: _checked(apply_strategic(old, patch, ATOMIC.get(old.get("kind"), ())))
    return lambda old: _checked(merge_patch(old, patch))


def _operations(patch: Any) -> list[Obj]:
    if not isinstance(patch, list):
        raise errors.bad_request("a JSON patch must be a JSON array of operations")
    if len(patch) > MAX_OPERATIONS:
        raise errors.too_large(f"a JSON patch may hold at most {MAX_OPERATIONS} operations")
    for index, op in enumerate(patch):
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise errors.bad_request(f"JSON patch operation {index} is not an object with 'op'")
        for field in ("path", "from"):
            if field in op and not isinstance(op[field], str):
                raise errors.bad_request(f"JSON patch operation {index}: {field} must be a string")
    return patch


def apply_json_patch(old: Obj, operations: list[Obj]) -> Any:
    """Apply RFC 6902 operations one by one, counting what ``copy`` duplicates."""
    doc: Any = copy.deepcopy(old)
    copied = 0
    for index, op in enumerate(operations):
        try:
            if op["op"] == "copy":
                copied += len(json.dumps(jsonpointer.resolve_pointer(doc, op.get("from", ""))))
                if copied > MAX_COPIED_BYTES:
                    raise errors.too_large("the JSON patch copies more data than allowed")
            doc = jsonpatch.JsonPatch([op]).apply(doc, in_place=True)
        except errors.ApiError:
            raise
        except jsonpatch.InvalidJsonPatch as exc:
            raise errors.bad_request(f"JSON patch operation {index} is invalid: {exc}") from exc
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise _unprocessable(f"JSON patch operation {index} cannot apply: {exc}") from exc
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise _unprocessable(f"JSON patch operation {index} cannot apply: {exc!r}") from exc
    return doc


# List field -> the keys that identify an item (the first one an item has is used), from
# the patchMergeKey tags of k8s.io/api for the lists podnet's kinds hold.
MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "ports": ("containerPort", "port"),
    "conditions": ("type",),
    "addresses": ("type",),
    "imagePullSecrets": ("name",),
}


# Kind -> its top-level lists that are atomic (replaced whole) though their field name is
# in MERGE_KEYS: an EndpointSlice's ports are ``+listType=atomic`` in k8s.io/api.
ATOMIC: dict[Any, tuple[str, ...]] = {"EndpointSlice": ("ports",)}


def _item_key(item: Any, names: tuple[str, ...]) -> Any:
    if not isinstance(item, dict):
        return None
    return next(((n, item[n]) for n in names if n in item), None)


def _merge_list(old: Any, patch: list[Any], names: tuple[str, ...], order: Any) -> list[Any]:
    """Merge a keyed list: patch items update the old item with the same key, or are added."""
    if not isinstance(old, list) or any(_item_key(i, names) is None for i in patch):
        return copy.deepcopy(patch)
    result = list(old)
    for item in patch:
        key = _item_key(item, names)
        at = next((i for i, o in enumerate(result) if _item_key(o, names) == key), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del result[at]
        elif at is None:
            result.append(apply_strategic({}, item))
        else:
            result[at] = apply_strategic(result[at], item)
    if isinstance(order, list):
        wanted = [_item_key(o, names) for o in order]
        rank = {k: i for i, k in enumerate(wanted) if k is not None}
        result.sort(key=lambda o: rank.get(_item_key(o, names), len(rank)))
    return result


def apply_strategic(old: Any, patch: Any, atomic: tuple[str, ...] = ()) -> Any:
    """Strategic merge patch with map semantics: directives honoured, lists replaced
    (but those of ``MERGE_KEYS`` merged, unless named in ``atomic`` for this object)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    if directive not in (None, "merge"):
        raise _unprocessable(f"unsupported strategic merge directive $patch: {directive!r}")
    result = dict(old) if isinstance(old, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # $setElementOrder/..., $retainKeys: list bookkeeping we do not need
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS and key not in atomic:
            order = patch.get(f"$setElementOrder/{key}")
            result[key] = _merge_list(result.get(key), value, MERGE_KEYS[key], order)
        else:
            result[key] = apply_strategic(result.get(key), value)
    return result


def _checked(patched: Any) -> Obj:
    """A patch result must still be an object with object metadata, plain and bounded."""
    if not isinstance(patched, dict):
        raise _unprocessable("the patched document is not a JSON object")
    if not isinstance(patched.get("metadata"), dict):
        raise _unprocessable("the patched object's metadata is not a JSON object")
    check_value(patched)
    return patched


def _unprocessable(message: str) -> errors.ApiError:
    return errors.ApiError(message, 422, "Invalid")
