"""``metadata``: the ObjectMeta every kind carries, and its name and namespace rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from podnet.model.errors import FieldError
from podnet.model.kinds import Kind
from podnet.model.schemas_common import (
    FORBIDDEN,
    INVALID,
    REQUIRED,
    TYPE_INVALID,
    NameRule,
    Strict,
    field_errors,
    json_type,
)
from podnet.model.schemas_names import dns_label_problem, mask_trailing_dash, quote
from podnet.model.schemas_types import AnnotationMap, LabelMap, QualifiedName


class OwnerReference(Strict):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    blockOwnerDeletion: bool | None = None


class ObjectMeta(Strict):
    name: str | None = None
    generateName: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resourceVersion: str | None = None
    generation: int | None = None
    creationTimestamp: str | None = None
    deletionTimestamp: str | None = None
    deletionGracePeriodSeconds: int | None = None
    labels: LabelMap | None = None
    annotations: AnnotationMap | None = None
    ownerReferences: list[OwnerReference] | None = None
    finalizers: list[QualifiedName] | None = None
    managedFields: list[dict[str, Any]] | None = None
    selfLink: str | None = None


def validate_metadata(
    kind: Kind, name_rule: NameRule, raw: object
) -> tuple[dict[str, Any], list[FieldError]]:
    """Check ``metadata`` of an object of ``kind``; return it normalized, and the errors.

    Null-valued keys are dropped from the result (as if absent).
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        got = json_type(raw)
        return {}, [FieldError("metadata", f"must be of type object, got {got}", TYPE_INVALID)]
    try:
        meta = ObjectMeta.model_validate(raw)
    except ValidationError as exc:
        return {}, field_errors(exc, "metadata") + _name_errors(kind, name_rule, raw)
    errors = _name_errors(kind, name_rule, raw)
    return meta.model_dump(exclude_none=True), errors


def _name_errors(kind: Kind, name_rule: NameRule, raw: Mapping[str, Any]) -> list[FieldError]:
    """Errors of name, generateName and namespace, for the ones that are strings."""
    name, prefix = raw.get("name"), raw.get("generateName")
    errors: list[FieldError] = []
    if isinstance(name, str) and name:
        errors += _rule_errors("metadata.name", name, name, name_rule)
    elif isinstance(prefix, str) and prefix:
        errors += _rule_errors(
            "metadata.generateName", prefix, mask_trailing_dash(prefix), name_rule
        )
    elif name is None or name == "":
        why = "Required value: name or generateName is required"
        errors.append(FieldError("metadata.name", why, REQUIRED))
    return errors + _namespace_errors(kind, raw.get("namespace"))


def _rule_errors(path: str, shown: str, checked: str, rule: NameRule) -> list[FieldError]:
    why = rule(checked)
    return [FieldError(path, f"{quote(shown)} is not a valid name: {why}", INVALID)] if why else []


def _namespace_errors(kind: Kind, namespace: object) -> list[FieldError]:
    if not isinstance(namespace, str) or not namespace:
        return []
    if not kind.namespaced:
        msg = f"not allowed on {kind.kind}, which is cluster-scoped"
        return [FieldError("metadata.namespace", msg, FORBIDDEN)]
    return _rule_errors("metadata.namespace", namespace, namespace, dns_label_problem)
