"""What both clients send and expect, below the transport: headers, query parameters,
JSON bodies and the reading of answers."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podnet.client.errors import InvalidResponse
from podnet.client.watch import Obj, ResourceVersion
from podnet.kubeconfig import ClientConfig

MERGE_PATCH = "application/merge-patch+json"
JSON = "application/json"


def headers(config: ClientConfig, agent: str) -> dict[str, str]:
    """The headers of every request: JSON, who is asking, and the bearer token."""
    found = {"Accept": JSON, "User-Agent": agent}
    if config.token:
        found["Authorization"] = f"Bearer {config.token}"
    return found


@dataclass(frozen=True)
class Call:
    """One API request as both transports send it: method, path, query and JSON body."""

    method: str
    path: str
    obj: Mapping[str, Any] | None = None
    params: Mapping[str, str] | None = None
    content_type: str = JSON

    def content(self) -> bytes | None:
        """The encoded body (None without one)."""
        return None if self.obj is None else json.dumps(self.obj).encode()

    def headers(self) -> dict[str, str] | None:
        """The Content-Type header of the body (None without one)."""
        return None if self.obj is None else {"Content-Type": self.content_type}

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def selectors(
    label_selector: str | None = None, field_selector: str | None = None
) -> dict[str, str]:
    """The query parameters of label and field selectors."""
    params: dict[str, str] = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


def watch_params(
    since: ResourceVersion | str | None, timeout_seconds: int | None = None, bookmarks: bool = False
) -> dict[str, str]:
    """The query parameters of a watch from ``since`` (None or 0/"": from now)."""
    params = {"watch": "true"}
    if since:
        params["resourceVersion"] = str(since)
    if bookmarks:
        params["allowWatchBookmarks"] = "true"
    if timeout_seconds is not None:
        params["timeoutSeconds"] = str(timeout_seconds)
    return params


def json_object(payload: bytes, code: int, what: str) -> Obj:
    """A 2xx answer's body as a JSON object ({} for an empty body)."""
    if not payload:
        return {}
    try:
        obj = json.loads(payload)
    except ValueError as exc:
        raise InvalidResponse(f"{what}: the server did not answer with JSON", code) from exc
    if not isinstance(obj, dict):
        raise InvalidResponse(f"{what}: the answer is not a JSON object", code)
    return obj
