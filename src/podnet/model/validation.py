"""Validate and normalize API objects before they are stored.

``validate`` is the one entry point: the API server calls it on every create and update.
It checks the type fields, ``metadata``, and the kind's body (see the ``schemas_*``
modules), collects every error, and either returns a fresh normalized object with defaults
applied or raises a 422 ``ApiError`` whose causes name each bad field and say why.

The pydantic models are built once at import time; validating an object only runs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from podnet.model.errors import ApiError, FieldError, bad_request, invalid
from podnet.model.kinds import Kind
from podnet.model.schemas_certificates import SCHEMAS as CERTIFICATES_SCHEMAS
from podnet.model.schemas_common import INVALID, TYPE_INVALID, Schema, field_errors, json_type
from podnet.model.schemas_coordination import SCHEMAS as COORDINATION_SCHEMAS
from podnet.model.schemas_core import SCHEMAS as CORE_SCHEMAS
from podnet.model.schemas_core import EventBody
from podnet.model.schemas_discovery import SCHEMAS as DISCOVERY_SCHEMAS
from podnet.model.schemas_meta import validate_metadata
from podnet.model.schemas_names import quote
from podnet.model.schemas_network import SCHEMAS as NETWORK_SCHEMAS
from podnet.model.schemas_policy import SCHEMAS as POLICY_SCHEMAS
from podnet.model.schemas_route import SCHEMAS as ROUTE_SCHEMAS

__all__ = ["ApiError", "schema_for", "validate"]

_TYPE_META = ("apiVersion", "kind", "metadata")
_SCHEMAS: dict[str, Schema] = {
    **CORE_SCHEMAS,
    **NETWORK_SCHEMAS,
    **POLICY_SCHEMAS,
    **COORDINATION_SCHEMAS,
    **DISCOVERY_SCHEMAS,
    **ROUTE_SCHEMAS,
    **CERTIFICATES_SCHEMAS,
}
# Kinds without a schema of their own are checked like Events: metadata only.
_OPEN_SCHEMA = Schema(EventBody)


def schema_for(kind: Kind) -> Schema:
    """The schema that validates ``kind``'s objects."""
    return _SCHEMAS.get(kind.kind, _OPEN_SCHEMA)


def validate(kind: Kind, obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check ``obj`` as a ``kind`` object and return a normalized copy with defaults applied.

    ``old`` is the stored object when this is an update; the kind's change rules (such as
    "the cluster network may only grow") are checked against it. Raises ``ApiError``: 400
    when ``obj`` is not a JSON object, 422 (Invalid) listing every bad field otherwise.
    """
    if not isinstance(obj, Mapping):
        raise bad_request(f"{kind.kind} must be a JSON object, got {json_type(obj)}")
    schema = schema_for(kind)
    errors = _type_meta_errors(kind, obj)
    raw_meta = obj.get("metadata")
    metadata, meta_errors = validate_metadata(kind, schema.name_rule, raw_meta)
    context = raw_meta if isinstance(raw_meta, Mapping) else {}
    body, body_errors = _validate_body(schema, obj, context, old)
    errors += meta_errors + body_errors
    if errors:
        raise invalid(kind.kind, _display_name(obj), errors)
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": metadata, **body}


def _type_meta_errors(kind: Kind, obj: Mapping[str, Any]) -> list[FieldError]:
    """apiVersion and kind, when present, must name this kind."""
    errors = []
    for field, expected in (("apiVersion", kind.api_version), ("kind", kind.kind)):
        value = obj.get(field)
        if value is None:
            continue
        if not isinstance(value, str):
            why = f"must be of type string, got {json_type(value)}"
            errors.append(FieldError(field, why, TYPE_INVALID))
        elif value != expected:
            why = f"{quote(value)} does not match the expected {quote(expected)}"
            errors.append(FieldError(field, why, INVALID))
    return errors


def _validate_body(
    schema: Schema,
    obj: Mapping[str, Any],
    meta: Mapping[str, Any],
    old: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], list[FieldError]]:
    """Run the kind's model; metadata and the old object are its validation context."""
    raw = {key: value for key, value in obj.items() if key not in _TYPE_META}
    try:
        model = schema.body.model_validate(raw, context={"meta": meta, "old": old})
    except ValidationError as exc:
        return {}, field_errors(exc)
    return model.model_dump(by_alias=True, exclude_none=True), []


def _display_name(obj: Mapping[str, Any]) -> str:
    """The name to show in the error message: name, else generateName, else ""."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return ""
    for key in ("name", "generateName"):
        value = meta.get(key)
        if isinstance(value, str) and value:
            return value
    return ""
