"""Turning an HTTP request into what the API acts on: target, selectors and body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from podnet.api import decode, protobuf
from podnet.api.patch import PATCH_TYPES as PATCH_CONTENT_TYPES
from podnet.model import errors
from podnet.model.kinds import KINDS, NAMESPACE, Kind
from podnet.model.selectors import (
    FieldRequirement,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)

MAX_BODY = 3 * 1024 * 1024  # kube-apiserver's limit for a request body
JSON_TYPES = ("application/json", "")
PATCH_TYPES = PATCH_CONTENT_TYPES
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")


@dataclass(frozen=True)
class Target:
    """What a resource URL points at."""

    kind: Kind
    namespace: str | None
    name: str | None
    subresource: str | None


def resolve(group: str, version: str, tail: str) -> Target:
    """Parse the part of a resource path after ``/api/v1`` or ``/apis/<g>/<v>``."""
    parts = [p for p in tail.split("/") if p]
    namespace = None
    if len(parts) >= 3 and parts[0] == "namespaces" and parts[2] not in NAMESPACE.subresources:
        namespace, parts = parts[1], parts[2:]
    if not parts or len(parts) > 3:
        raise _no_route(tail)
    kind = KINDS.by_plural(group, version, parts[0])
    if kind is None:
        raise _no_route(tail)
    if namespace is not None and not kind.namespaced:
        raise _no_route(tail)
    name = parts[1] if len(parts) > 1 else None
    sub = parts[2] if len(parts) > 2 else None
    if sub is not None and sub not in kind.subresources:
        raise _no_route(tail)
    return Target(kind, namespace, name, sub)


def _no_route(tail: str) -> errors.ApiError:
    return errors.ApiError("the server could not find the requested resource", 404, "NotFound")


def selectors(
    request: web.Request, kind: Kind
) -> tuple[LabelSelector | None, list[FieldRequirement]]:
    """The ``labelSelector`` and ``fieldSelector`` query parameters, parsed."""
    from podnet.api.objects import field_labels

    labels = None
    fields: list[FieldRequirement] = []
    try:
        if request.query.get("labelSelector"):
            labels = parse_label_selector(request.query["labelSelector"])
        if request.query.get("fieldSelector"):
            fields = list(parse_field_selector(request.query["fieldSelector"], field_labels(kind)))
    except ValueError as exc:
        raise errors.bad_request(f"unable to parse requirement: {exc}") from exc
    return labels, fields


async def read_body(request: web.Request, patch: bool = False) -> Any:
    """The request body as plain JSON values (from JSON, YAML or protobuf).

    400 for a body that does not parse or breaks ``podnet.api.decode``'s limits, 413 when
    it is too large, 415 for a content type the verb does not take.
    """
    ctype = request.content_type.lower()
    allowed = PATCH_TYPES if patch else JSON_TYPES + YAML_TYPES + (protobuf.CONTENT_TYPE,)
    if ctype not in allowed:
        raise errors.unsupported_media_type(
            f"the body of the request was in an unknown format ({ctype or 'none'}); "
            f"accepted: {', '.join(t for t in allowed if t)}"
        )
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise errors.too_large(f"the request body is larger than {MAX_BODY} bytes")
    raw = await _read_limited(request)
    if not raw.strip():
        raise errors.bad_request("the request body is empty")
    if ctype == protobuf.CONTENT_TYPE:
        return protobuf.decode_object(raw)
    if ctype in YAML_TYPES:
        return decode.loads_yaml(raw)
    return decode.loads_json(raw)


async def _read_limited(request: web.Request) -> bytes:
    chunks = []
    size = 0
    async for chunk in request.content.iter_chunked(65536):
        size += len(chunk)
        if size > MAX_BODY:
            raise errors.too_large(f"the request body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
