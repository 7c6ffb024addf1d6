"""Pure helpers on API objects: timestamps, merge patch, update rules, selectors.

No I/O here: the registry uses these to decide what a write stores.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from podnet.model import errors
from podnet.model.kinds import Kind
from podnet.model.selectors import FieldRequirement, LabelSelector, fields_match

Obj = dict[str, Any]


def now_rfc3339() -> str:
    """The current time, to the second, as Kubernetes writes timestamps."""
    second = int(time.time())
    if _last_stamp[0] != second:
        stamp = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        _last_stamp[:] = [second, stamp]
    return str(_last_stamp[1])


_last_stamp: list[int | str] = [0, ""]  # (second, its text): one strftime per second


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


CSR_KIND = "CertificateSigningRequest"  # its update rules: podnet.api.csrupdate


def field_labels(kind: Kind) -> set[str]:
    """Fields a ``fieldSelector`` may name for this kind."""
    fields = {"metadata.name", "metadata.namespace"}
    if kind.kind == "Pod":
        fields |= {"spec.nodeName", "status.phase", "status.podIP"}
    if kind.kind == "Event":
        fields |= {f"involvedObject.{f}" for f in ("kind", "name", "namespace", "uid")}
        fields |= {"reason", "type"}
    if kind.kind == "HostSubnet":
        fields |= {"host", "subnet"}
    if kind.kind == "NetNamespace":
        fields |= {"netid"}
    if kind.kind == "Route":  # OpenShift's route field labels
        fields |= {"spec.host", "spec.path", "spec.to.name"}
    if kind.kind == CSR_KIND:  # kube's, and the requester (a non-admin's lists: its own)
        fields |= {"spec.signerName", "spec.username"}
    return fields


def merge_for_update(kind: Kind, old: Obj, new: Obj, subresource: str | None) -> Obj:
    """Keep what the caller may not change: identity always, status or spec per path."""
    new = copy.deepcopy(new)
    new.setdefault("metadata", {})
    if kind.kind == CSR_KIND:
        from podnet.api.csrupdate import merge_csr_update

        new = merge_csr_update(old, new, subresource, now_rfc3339())
    elif subresource == "status":
        merged = copy.deepcopy(old)
        if "status" in new:
            merged["status"] = new["status"]
        else:
            merged.pop("status", None)
        new = merged
    elif subresource is not None:
        raise errors.ApiError(f"subresource {subresource!r} not found", 404, "NotFound")
    elif "status" in kind.subresources:
        if "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)
    meta = new["metadata"]
    old_meta = old["metadata"]
    for field in ("name", "namespace", "uid", "creationTimestamp"):
        if field in old_meta:
            meta[field] = old_meta[field]
    meta.pop("resourceVersion", None)
    return new


STALE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def body_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def next_generation(old: Obj, new: Obj) -> int:
    generation = int(old["metadata"].get("generation") or 1)
    return generation + 1 if body_of(old) != body_of(new) else generation


def same_content(old: Obj, new: Obj) -> bool:
    strip = {"resourceVersion"}
    old_meta = {k: v for k, v in old["metadata"].items() if k not in strip}
    new_meta = {k: v for k, v in new["metadata"].items() if k not in strip}
    rest_old = {k: v for k, v in old.items() if k != "metadata"}
    rest_new = {k: v for k, v in new.items() if k != "metadata"}
    return old_meta == new_meta and rest_old == rest_new


def matches(
    obj: Mapping[str, Any],
    labels: LabelSelector | None,
    fields: Sequence[FieldRequirement] = (),
) -> bool:
    """Whether ``obj`` passes a label selector and field requirements."""
    if labels is not None and not labels.matches((obj.get("metadata") or {}).get("labels")):
        return False
    return not fields or fields_match(obj, fields)
