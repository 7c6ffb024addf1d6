"""Strict decoding of request bodies: JSON and YAML into plain JSON values, bounded.

Every body the API accepts becomes a tree of dict (string keys), list, str, int, finite
float, bool and None, at most ``MAX_DEPTH`` levels deep, before any other code sees it:

- JSON's ``NaN``, ``Infinity`` and ``-Infinity`` are refused (they are not JSON, and a
  stored NaN breaks every client that later reads the object); so is a number that only
  overflows to infinity (``1e400``).
- YAML is read with a loader that keeps only JSON types: no timestamps, no ``.nan`` or
  ``.inf``, no non-string keys, and no aliases (an alias bomb expands exponentially when
  the object is later serialized).
- Nesting deeper than ``MAX_DEPTH`` is a 400 before any recursive code (copy, merge
  patch, validation, serialization) runs; a parser's own RecursionError is a 400 too.
"""

from __future__ import annotations

import json
import math
from typing import Any

import yaml

from podnet.api import storedform
from podnet.model import errors

# kube objects nest about 15 levels (a NetworkPolicy's ports inside rules inside spec);
# 64 leaves room for annotations-like free-form data while keeping recursion shallow.
MAX_DEPTH = 64


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


def loads_json(raw: bytes | str) -> Any:
    """Parse strict JSON and check the result with ``check_value``; 400 on failure."""
    value = _loads_fast(raw) if isinstance(raw, bytes) else _UNREAD
    if value is not _UNREAD:
        check_value(value)
        return value
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError as exc:
        raise _too_deep() from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.bad_request(f"the request body is not valid JSON: {exc}") from exc
    check_value(value)
    return value


_UNREAD = object()


def _loads_fast(raw: bytes) -> Any:
    """orjson's reading of ``raw`` when it is the json module's, else ``_UNREAD``: orjson
    refuses NaN, infinities and lone surrogates (the slow path then says why), and only a
    number of 19 or more digits could read differently (``storedform.loads``)."""
    try:
        return storedform.loads_fast(raw)
    except ValueError:
        return _UNREAD


class _JsonTypesLoader(yaml.SafeLoader):
    """A safe loader without aliases and without YAML-only scalar types."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases are not accepted", event.start_mark
            )
        return super().compose_node(parent, index)


# Timestamps would load as datetime objects, which JSON cannot hold: keep them strings.
_JsonTypesLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def loads_yaml(raw: bytes | str) -> Any:
    """Parse one YAML document into JSON types and check it; 400 on failure."""
    try:
        value = yaml.load(raw, Loader=_JsonTypesLoader)  # a SafeLoader subclass
    except RecursionError as exc:
        raise _too_deep() from exc
    except (yaml.YAMLError, ValueError) as exc:
        raise errors.bad_request(f"the request body is not valid YAML: {exc}") from exc
    check_value(value)
    return value


# Where a value sits in the body, built only when an error names it: (parent, key or index).
_Where = tuple["_Where", str | int] | None


def _path(where: _Where) -> str:
    """``spec.rules[0].ports`` for a node's position; ``body`` for the top level."""
    parts: list[str | int] = []
    while where is not None:
        where, step = where
        parts.append(step)
    path = ""
    for step in reversed(parts):
        index = isinstance(step, int)
        path = f"{path}[{step}]" if index else f"{path}.{step}" if path else str(step)
    return path or "body"


def check_value(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Refuse anything but plain, finite JSON values nested at most ``max_depth`` deep.

    Iterative on purpose: this runs before any recursive code touches the value.
    """
    stack: list[tuple[Any, int, _Where]] = [(value, 1, None)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, dict | list) and depth > max_depth:
            raise _too_deep()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise errors.bad_request(f"{_path(where)}: object keys must be strings")
                _check_text(key, where)
                stack.append((child, depth + 1, (where, key)))
        elif isinstance(item, list):
            stack.extend((child, depth + 1, (where, i)) for i, child in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            raise errors.bad_request(f"{_path(where)}: NaN and infinite numbers are not JSON")
        elif isinstance(item, str):
            _check_text(item, where)
        elif not isinstance(item, int | float | bool) and item is not None:
            raise errors.bad_request(f"{_path(where)}: {type(item).__name__} is not a JSON type")


def _check_text(text: str, where: _Where) -> None:
    """Lone UTF-16 surrogates (``"\\ud800"``) have no UTF-8 form: refuse them early."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise errors.bad_request(f"{_path(where)}: invalid Unicode text ({exc.reason})") from exc


def _too_deep() -> errors.ApiError:
    return errors.bad_request(
        f"the request body is nested too deeply: at most {MAX_DEPTH} levels are accepted"
    )
