"""The pieces every schema is built from: base models, error conversion, the Schema record.

Validators in the schema modules never raise plain ``ValueError``: they call ``reject`` with
``Problem`` records that carry a path relative to the model being validated. ``field_errors``
turns pydantic's error list into ``FieldError``s, expanding those problems into full dotted
paths, so a cross-field rule on a nested model still names the exact field
(``spec.ingress[0].from[1].ipBlock.except[0]``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError

from podnet.model.errors import FieldError
from podnet.model.schemas_names import dns_subdomain_problem, quote

Loc = tuple[str | int, ...]

INVALID = "FieldValueInvalid"
REQUIRED = "FieldValueRequired"
FORBIDDEN = "FieldValueForbidden"
NOT_SUPPORTED = "FieldValueNotSupported"
TYPE_INVALID = "FieldValueTypeInvalid"
TOO_MANY = "FieldValueTooMany"
DUPLICATE = "FieldValueDuplicate"

_PROBLEMS = "problems"

# pydantic error type -> the JSON type the field wanted.
_EXPECTED = {
    "int_type": "integer",
    "string_type": "string",
    "bool_type": "boolean",
    "float_type": "number",
    "list_type": "array",
    "dict_type": "object",
    "model_type": "object",
    "model_attributes_type": "object",
}


class Strict(BaseModel):
    """A schema we own: unknown fields are errors, and no type coercion (no "80" -> 80)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Open(BaseModel):
    """Part of Kubernetes' schema, which we do not own: typed fields, other fields pass."""

    model_config = ConfigDict(extra="allow", strict=True)


@dataclass(frozen=True)
class Problem:
    """One rule broken inside a model: a path relative to that model, and why."""

    path: Loc
    message: str
    reason: str = INVALID


def reject(problems: Iterable[Problem]) -> None:
    """Raise the problems (if any) as one pydantic error that ``field_errors`` expands."""
    found = list(problems)
    if found:
        summary = "; ".join(p.message for p in found)
        raise PydanticCustomError(_PROBLEMS, "{summary}", {"summary": summary, "problems": found})


def fail(message: str, reason: str = INVALID) -> NoReturn:
    """Reject the value being validated with one message."""
    reject([Problem((), message, reason)])
    raise AssertionError("unreachable")  # pragma: no cover


def json_type(value: object) -> str:
    """The JSON name of a value's type, for "must be of type X, got Y" messages."""
    if value is None:
        return "null"
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    names |= {list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def join_path(loc: Sequence[str | int], prefix: str = "") -> str:
    """``("spec", "ingress", 0, "ports")`` -> ``spec.ingress[0].ports``."""
    out = prefix
    for part in loc:
        if part == "[key]":  # pydantic's marker for "the key itself" in a dict
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "<root>"


def field_errors(exc: ValidationError, prefix: str = "") -> list[FieldError]:
    """Every error of a pydantic ``ValidationError`` as FieldErrors under ``prefix``."""
    out: list[FieldError] = []
    for err in exc.errors():
        out.extend(_convert(err, prefix))
    return out


def _convert(err: Mapping[str, Any], prefix: str) -> list[FieldError]:
    loc: Loc = tuple(err["loc"])
    kind = err["type"]
    if kind == _PROBLEMS:
        problems: list[Problem] = err["ctx"]["problems"]
        return [FieldError(join_path(loc + p.path, prefix), p.message, p.reason) for p in problems]
    path = join_path(loc, prefix)
    if kind == "missing":
        return [FieldError(path, "Required value", REQUIRED)]
    if kind == "extra_forbidden":
        return [FieldError(path, "unknown field", FORBIDDEN)]
    if kind in _EXPECTED:
        got = json_type(err.get("input"))
        return [FieldError(path, f"must be of type {_EXPECTED[kind]}, got {got}", TYPE_INVALID)]
    return [FieldError(path, str(err.get("msg", "invalid value")), INVALID)]


NameRule = Callable[[str], "str | None"]


@dataclass(frozen=True)
class Schema:
    """How one kind is validated: its body model and the rule for metadata.name.

    ``body`` validates the object without apiVersion/kind/metadata. Rules that need more
    than the body read the validation context (see ``context_meta`` and ``context_old``).
    """

    body: type[BaseModel]
    name_rule: NameRule = dns_subdomain_problem


def context_meta(info: ValidationInfo) -> Mapping[str, Any]:
    """The object's raw metadata, for rules such as ``host == metadata.name``."""
    meta = (info.context or {}).get("meta")
    return meta if isinstance(meta, Mapping) else {}


def context_old(info: ValidationInfo) -> Mapping[str, Any] | None:
    """The stored object on an update, for change rules; None on create."""
    old = (info.context or {}).get("old")
    return old if isinstance(old, Mapping) else None


def unchanged(new: object, old: Mapping[str, Any] | None, field: str) -> None:
    """Reject ``new`` if the old object had a different, non-empty value at ``field``."""
    was = old.get(field) if old is not None else None
    if was not in (None, "") and new != was:
        fail(f"may not change (was {quote(was)})")
