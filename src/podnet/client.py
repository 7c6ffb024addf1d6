"""A synchronous client for the podnet API (Kubernetes-style REST), built on httpx.

Exceptions, all subclasses of ``ClientError``:

- ``ApiClientError``: the server answered with a non-2xx code; ``code``, ``reason`` and
  ``message`` come from its ``Status`` body (or from the HTTP status when there is none).
  A watch ``ERROR`` event raises it too.
- ``ApiUnreachable``: no answer at all (connection refused, TLS failure, timeout); the
  message is one line naming the server.
- ``UnknownKind``: a kind name that the kind table does not know.
- ``ClientConfigError``: the client configuration cannot be used (for example a CA
  that is not PEM).

Pass ``transport=httpx.MockTransport(handler)`` to run the client against a fake API.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from podnet.kubeconfig import ClientConfig
from podnet.model.kinds import KINDS, Kind

KindRef = Kind | str
MERGE_PATCH = "application/merge-patch+json"
DEFAULT_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
# A watch may stay quiet for minutes; only connecting and writing are bounded.
WATCH_TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=10.0, pool=5.0)

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ClientError(Exception):
    """Base of every failure raised by this client."""


class ApiClientError(ClientError):
    """The API answered with an error ``Status``."""

    def __init__(
        self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})

    def __str__(self) -> str:
        return f"from server ({self.reason}): {self.message}"

    @classmethod
    def from_status(cls, status: Mapping[str, Any], fallback_code: int = 500) -> ApiClientError:
        """Build the error from a ``Status`` object."""
        code = int(status.get("code") or fallback_code)
        reason = str(status.get("reason") or _REASONS.get(code, "Unknown"))
        message = str(status.get("message") or reason)
        return cls(code, reason, message, status.get("details"))

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiClientError:
        """Build the error from a non-2xx answer, with or without a Status body."""
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("kind") == "Status":
            return cls.from_status(body, response.status_code)
        text = " ".join(response.text.split())[:200]
        reason = _REASONS.get(response.status_code, "Unknown")
        return cls(response.status_code, reason, text or response.reason_phrase or reason)


class ApiUnreachable(ClientError):
    """The server could not be reached or did not answer in time."""

    def __init__(self, server: str, why: str) -> None:
        super().__init__(f"cannot reach the podnet master at {server}: {why}")
        self.server = server
        self.why = why


class UnknownKind(ClientError):
    """The kind name is not in the kind table."""

    def __init__(self, name: str) -> None:
        super().__init__(f'the server doesn\'t have a resource type "{name}"')
        self.name = name


class ClientConfigError(ClientError):
    """The client configuration cannot be used."""


def resolve_kind(kind: KindRef) -> Kind:
    """A ``Kind`` from a Kind or any name a user may type for it."""
    if isinstance(kind, Kind):
        return kind
    found = KINDS.by_name(kind)
    if found is None:
        raise UnknownKind(kind)
    return found


def resource_path(kind: KindRef, namespace: str | None = None, name: str | None = None) -> str:
    """The URL path of a collection or an object.

    A namespaced kind with ``namespace=None`` gives the all-namespaces collection; a
    cluster-scoped kind ignores ``namespace``.
    """
    k = resolve_kind(kind)
    parts = [k.base_path()]
    if k.namespaced and namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(k.plural)
    if name is not None:
        if k.namespaced and not namespace:
            raise ValueError(f"a namespace is needed to address {k.singular} {name!r}")
        parts.append(name)
    return "/".join(parts)


def ssl_verify(config: ClientConfig) -> ssl.SSLContext | bool:
    """What httpx should verify the server against: the kubeconfig CA, or the system CAs."""
    if config.insecure_skip_tls_verify:
        return False
    if config.ca_data is None:
        return True
    try:
        return ssl.create_default_context(cadata=config.ca_data.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as exc:
        msg = f"the certificate authority in the kubeconfig is invalid: {exc}"
        raise ClientConfigError(msg) from exc


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class ApiClient:
    """CRUD, list and watch on the podnet API for every kind in the kind table."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self._log = log
        headers = {"Accept": "application/json", "User-Agent": "podnet-cli"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        verify: ssl.SSLContext | bool = True if transport else ssl_verify(config)
        self._http = httpx.Client(
            base_url=config.server,
            headers=headers,
            timeout=timeout,
            verify=verify,
            transport=transport,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, kind: KindRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        """One object."""
        return self._call("GET", resource_path(kind, namespace, name))

    def list(
        self,
        kind: KindRef,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> dict[str, Any]:
        """The List object of a kind, in one namespace or (``None``) in all of them."""
        params = _selectors(label_selector, field_selector)
        return self._call("GET", resource_path(kind, namespace), params=params)

    def create(
        self, kind: KindRef, obj: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """POST a new object; the namespace defaults to the object's own."""
        ns = namespace or _meta(obj).get("namespace")
        k = resolve_kind(kind)
        if k.namespaced and not ns:
            raise ValueError(f"a namespace is needed to create a {k.singular}")
        return self._call("POST", resource_path(k, ns), json_body=obj)

    def replace(
        self, kind: KindRef, obj: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """PUT the whole object (its metadata.resourceVersion guards against lost updates)."""
        ns, name = namespace or _meta(obj).get("namespace"), _meta(obj).get("name")
        if not name:
            raise ValueError("the object to replace has no metadata.name")
        return self._call("PUT", resource_path(kind, ns, str(name)), json_body=obj)

    def patch(
        self, kind: KindRef, name: str, patch: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Apply a JSON merge patch (RFC 7386) to one object."""
        path = resource_path(kind, namespace, name)
        return self._call("PATCH", path, json_body=patch, content_type=MERGE_PATCH)

    def delete(self, kind: KindRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        """Delete one object; returns what the server answers (a Status or the object)."""
        return self._call("DELETE", resource_path(kind, namespace, name))

    def watch(
        self,
        kind: KindRef,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Stream ``{type, object}`` events until the server ends the watch.

        An ``ERROR`` event (for example 410 Expired: relist) raises ``ApiClientError``.
        """
        params = {"watch": "true", **_selectors(label_selector, field_selector)}
        if resource_version:
            params["resourceVersion"] = resource_version
        if timeout_seconds is not None:
            params["timeoutSeconds"] = str(timeout_seconds)
        path = resource_path(kind, namespace)
        try:
            with self._http.stream("GET", path, params=params, timeout=WATCH_TIMEOUT) as resp:
                self._trace(resp)
                if not resp.is_success:
                    resp.read()
                    raise ApiClientError.from_response(resp)
                yield from _events(resp.iter_lines())
        except httpx.TransportError as exc:
            raise ApiUnreachable(self.config.server, _one_line(exc)) from exc

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        content = None if json_body is None else json.dumps(json_body).encode()
        headers = {"Content-Type": content_type} if content is not None else None
        try:
            resp = self._http.request(method, path, params=params, content=content, headers=headers)
        except httpx.TransportError as exc:
            raise ApiUnreachable(self.config.server, _one_line(exc)) from exc
        self._trace(resp)
        if not resp.is_success:
            raise ApiClientError.from_response(resp)
        return _json_object(resp)

    def _trace(self, resp: httpx.Response) -> None:
        if self._log is not None:
            req = resp.request
            self._log(f"{req.method} {req.url} {resp.status_code} {resp.reason_phrase}")


def _selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    params: dict[str, str] = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _json_object(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError as exc:
        raise ApiClientError(
            resp.status_code,
            "InvalidResponse",
            f"the server at {resp.request.url} did not answer with JSON",
        ) from exc
    if not isinstance(body, dict):
        raise ApiClientError(resp.status_code, "InvalidResponse", "the answer is not an object")
    return body


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise ApiClientError(200, "InvalidResponse", f"bad watch event: {line[:80]}") from exc
        if not isinstance(event, dict):
            raise ApiClientError(200, "InvalidResponse", f"bad watch event: {line[:80]}")
        if event.get("type") == "ERROR":
            raise ApiClientError.from_status(event.get("object") or {})
        yield event


# ---- apply support: kubectl's last-applied annotation and a three-way merge patch -----

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_MISSING = object()


def with_last_applied(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object with its own JSON recorded in the last-applied annotation."""
    meta = dict(_meta(obj))
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    recorded = {**obj, "metadata": {**meta, "annotations": annotations}}
    if not annotations:
        del recorded["metadata"]["annotations"]
    text = json.dumps(recorded, sort_keys=True, separators=(",", ":"))
    return {**obj, "metadata": {**meta, "annotations": {**annotations, LAST_APPLIED: text}}}


def last_applied(live: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration last applied to ``live`` ({} when it was never applied)."""
    text = (_meta(live).get("annotations") or {}).get(LAST_APPLIED)
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def three_way_patch(
    last: Mapping[str, Any], desired: Mapping[str, Any], live: Mapping[str, Any]
) -> dict[str, Any]:
    """A JSON merge patch taking ``live`` to ``desired``.

    Fields that differ from ``desired`` are set; fields the last applied configuration had
    but ``desired`` dropped are removed; fields nobody applied (set by the server or other
    clients) are left alone. Empty when ``live`` already matches.
    """
    patch: dict[str, Any] = {}
    for key, want in desired.items():
        have = live.get(key, _MISSING)
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            before = last.get(key)
            sub = three_way_patch(before if isinstance(before, Mapping) else {}, want, have)
            if sub:
                patch[key] = sub
        elif have != want and not (want is None and have is _MISSING):
            patch[key] = want
    for key in last:
        if key not in desired and key in live:
            patch[key] = None
    return patch
