"""OpenAPI v3 documents, built from the kinds: enough for kubectl's strict field validation.

kubectl asks ``/openapi/v3`` which group versions exist, then reads each document's PATCH
operations to learn whether the server validates fields itself (``fieldValidation``).
podnet always does (unknown fields are refused), so each kind's paths advertise it.
Schemas are given as open objects tagged with their kind; validation happens server-side.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from typing import Any

from podnet.model.kinds import KINDS, Kind

QUERY_PARAMS = ("fieldValidation", "fieldManager", "dryRun")


def _gv_path(group_version: str) -> str:
    return f"api/{group_version}" if "/" not in group_version else f"apis/{group_version}"


def _gvk(kind: Kind) -> dict[str, str]:
    return {"group": kind.group, "version": kind.version, "kind": kind.kind}


def _operation(kind: Kind, action: str) -> dict[str, Any]:
    params = [{"name": p, "in": "query", "schema": {"type": "string"}} for p in QUERY_PARAMS]
    return {
        "operationId": f"{action}{kind.kind}",
        "parameters": params,
        "responses": {"200": {"description": "OK"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(kind),
    }


def _paths(kind: Kind) -> dict[str, Any]:
    base = "/" + _gv_path(kind.api_version)
    scope = (
        f"{base}/namespaces/{{namespace}}/{kind.plural}"
        if kind.namespaced
        else f"{base}/{kind.plural}"
    )
    return {
        scope: {"get": _operation(kind, "list"), "post": _operation(kind, "post")},
        f"{scope}/{{name}}": {
            "get": _operation(kind, "get"),
            "put": _operation(kind, "put"),
            "patch": _operation(kind, "patch"),
            "delete": _operation(kind, "delete"),
        },
    }


def _schema(kind: Kind) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"{kind.kind} ({kind.api_version}); validated by the podnet master",
        "x-kubernetes-group-version-kind": [_gvk(kind)],
        "x-kubernetes-preserve-unknown-fields": True,
    }


@cache
def group_version_document(group_version: str) -> bytes | None:
    """The OpenAPI v3 document of one group version, or None if unknown."""
    kinds = KINDS.group_versions().get(group_version)
    if not kinds:
        return None
    paths: dict[str, Any] = {}
    for kind in kinds:
        paths.update(_paths(kind))
    doc = {
        "openapi": "3.0.0",
        "info": {"title": "podnet", "version": group_version},
        "paths": paths,
        "components": {
            "schemas": {f"{k.group or 'core'}.{k.version}.{k.kind}": _schema(k) for k in kinds}
        },
    }
    return json.dumps(doc, sort_keys=True).encode()


def root_document() -> dict[str, Any]:
    """``GET /openapi/v3``: where each group version's document is."""
    paths = {}
    for group_version in KINDS.group_versions():
        body = group_version_document(group_version) or b""
        digest = hashlib.sha256(body).hexdigest()[:16].upper()
        url = f"/openapi/v3/{_gv_path(group_version)}?hash={digest}"
        paths[_gv_path(group_version)] = {"serverRelativeURL": url}
    return {"paths": paths}
