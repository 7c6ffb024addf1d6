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

STRING = {"type": "string"}
BOOLEAN = {"type": "boolean"}
INTEGER = {"type": "integer", "minimum": 0}
NAME_PATTERN = "^[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?$"
# dryRun is not declared: podnet refuses it (400) rather than half-support it.
WRITE_PARAMS = {
    "fieldManager": {"type": "string", "maxLength": 128, "pattern": "^[ -~]*$"},
    "fieldValidation": {"type": "string", "enum": ["Ignore", "Warn", "Strict"]},
    "pretty": BOOLEAN,
}
# The query parameters of each action, with the types podnet.api.params checks.
QUERY_PARAMS: dict[str, dict[str, Any]] = {
    "list": {
        "allowWatchBookmarks": BOOLEAN,
        "continue": STRING,
        "fieldSelector": STRING,
        "labelSelector": STRING,
        "limit": INTEGER,
        "pretty": BOOLEAN,
        "resourceVersion": STRING,
        "resourceVersionMatch": {"type": "string", "enum": ["NotOlderThan", "Exact"]},
        "timeoutSeconds": INTEGER,
        "watch": BOOLEAN,
    },
    "get": {"pretty": BOOLEAN},
    "post": WRITE_PARAMS,
    "put": WRITE_PARAMS,
    "patch": {**WRITE_PARAMS, "force": BOOLEAN},
    "delete": {
        "gracePeriodSeconds": INTEGER,
        "propagationPolicy": {"type": "string", "enum": ["Orphan", "Background", "Foreground"]},
        "pretty": BOOLEAN,
    },
}
PATCH_BODIES = {
    "application/merge-patch+json": {"type": "object"},
    "application/strategic-merge-patch+json": {"type": "object"},
    "application/json-patch+json": {"type": "array", "items": {"type": "object"}},
}
DELETE_OPTIONS = {
    "type": "object",
    "properties": {
        "gracePeriodSeconds": {"type": "integer"},
        "preconditions": {
            "type": "object",
            "properties": {"resourceVersion": STRING, "uid": STRING},
        },
        "propagationPolicy": STRING,
    },
}


def _gv_path(group_version: str) -> str:
    return f"api/{group_version}" if "/" not in group_version else f"apis/{group_version}"


def _gvk(kind: Kind) -> dict[str, str]:
    return {"group": kind.group, "version": kind.version, "kind": kind.kind}


def _schema_ref(kind: Kind) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{kind.group or 'core'}.{kind.version}.{kind.kind}"}


def _body(action: str, kind: Kind) -> dict[str, Any] | None:
    """The requestBody of an action, in the media types the server reads."""
    if action in ("post", "put"):
        media = ("application/json", "application/yaml")
        return {"required": True, "content": {m: {"schema": _schema_ref(kind)} for m in media}}
    if action == "patch":
        return {"required": True, "content": {m: {"schema": s} for m, s in PATCH_BODIES.items()}}
    if action == "delete":
        return {"content": {"application/json": {"schema": DELETE_OPTIONS}}}
    return None


def _operation(kind: Kind, action: str, path_params: tuple[str, ...]) -> dict[str, Any]:
    params = [
        {"name": p, "in": "path", "required": True, "schema": STRING} for p in path_params
    ] + [{"name": p, "in": "query", "schema": s} for p, s in QUERY_PARAMS[action].items()]
    operation: dict[str, Any] = {
        "operationId": f"{action}{kind.kind}",
        "parameters": params,
        "responses": {
            "200": {"description": "OK"},
            "201": {"description": "Created"},
            "default": {"description": "a Status object"},
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(kind),
    }
    body = _body(action, kind)
    if body is not None:
        operation["requestBody"] = body
    return operation


def _paths(kind: Kind) -> dict[str, Any]:
    base = "/" + _gv_path(kind.api_version)
    scope = (
        f"{base}/namespaces/{{namespace}}/{kind.plural}"
        if kind.namespaced
        else f"{base}/{kind.plural}"
    )
    ns: tuple[str, ...] = ("namespace",) if kind.namespaced else ()
    one = (*ns, "name")
    return {
        scope: {"get": _operation(kind, "list", ns), "post": _operation(kind, "post", ns)},
        f"{scope}/{{name}}": {
            action: _operation(kind, action, one) for action in ("get", "put", "patch")
        }
        | {"delete": _operation(kind, "delete", one)},
    }


def _schema(kind: Kind) -> dict[str, Any]:
    # Open beyond the type fields and metadata: the master validates the rest itself.
    return {
        "type": "object",
        "description": f"{kind.kind} ({kind.api_version}); validated by the podnet master",
        "properties": {
            "apiVersion": {"type": "string", "enum": [kind.api_version]},
            "kind": {"type": "string", "enum": [kind.kind]},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": NAME_PATTERN, "maxLength": 63},
                    "labels": {"type": "object", "additionalProperties": STRING},
                },
            },
        },
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
