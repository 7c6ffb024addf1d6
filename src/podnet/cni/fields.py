"""Typed reads of a CNI JSON document's fields (a network config or a result): a field of
the wrong type or a missing required one is refused with CNI error 7, naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podnet.cni.validate import ERR_INVALID_NETWORK_CONFIG, CniError


def invalid(what: str, details: str) -> CniError:
    """CNI error 7 for a bad ``what`` (e.g. "result", "network config")."""
    return CniError(ERR_INVALID_NETWORK_CONFIG, f"invalid {what}", details)


def get_field(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``obj[key]`` if it has type ``kind`` (bools are not ints), None if absent."""
    value = obj.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise invalid(what, f'"{key}" has the wrong type')
    return value


def objects(data: Mapping[str, Any], key: str, what: str) -> list[Mapping[str, Any]]:
    """A list of JSON objects, ``[]`` if absent."""
    items = get_field(data, key, list, what) or []
    if not all(isinstance(item, dict) for item in items):
        raise invalid(what, f'"{key}" must be a list of objects')
    return items


def required(item: Mapping[str, Any], key: str, what: str) -> str:
    """A non-empty string field."""
    value = get_field(item, key, str, what)
    if not value:
        raise invalid(what, f'missing "{key}"')
    return str(value)


def strings(item: Mapping[str, Any], key: str, what: str) -> tuple[str, ...]:
    """A list of strings, ``()`` if absent."""
    values = get_field(item, key, list, what) or []
    if not all(isinstance(v, str) for v in values):
        raise invalid(what, f'"{key}" must be a list of strings')
    return tuple(values)
