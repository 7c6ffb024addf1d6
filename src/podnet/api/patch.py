"""The three patch formats kube-apiserver accepts for a PATCH request, as pure functions.

- ``application/merge-patch+json``: RFC 7386 merge patch.
- ``application/strategic-merge-patch+json``: what kubectl sends for built-in kinds
  (``kubectl label``, ``annotate``, ``patch``). For maps it is a merge patch; lists are
  replaced (podnet's kinds have no list whose items kubectl merges by key in practice),
  and the directives ``$patch: replace|delete`` are honoured while bookkeeping keys such
  as ``$setElementOrder/...`` and ``$retainKeys`` are dropped.
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
        return lambda old: _checked(apply_strategic(old, patch))
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


def apply_strategic(old: Any, patch: Any) -> Any:
    """Strategic merge patch with map semantics: directives honoured, lists replaced."""
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
